//! The capture's header: the magic, the format version, and what the run recorded.

use super::stream::{Stream, StreamError};

/// The magic a capture starts with (NUL included).
pub(super) const MAGIC: &[u8; 7] = b"memray\0";

/// The format versions read, with the memray releases that write them.
pub const VERSIONS_READ: [(i32, &str); 2] = [(12, "memray 1.18 and 1.19"), (13, "memray 1.20")];

/// What the header says of the run.
#[derive(Clone, Debug)]
pub struct Header {
    pub version: i32,
    /// The recording interpreter's `PY_VERSION_HEX`.
    pub python_version: i32,
    /// Recorded with `--native`.
    pub native_traces: bool,
    /// 0: every allocation; 1: aggregated (`--aggregate`).
    pub file_format: u8,
    /// memray's own count of allocation records (frees included).
    pub n_allocations: u64,
    pub start_time_ms: i64,
    pub end_time_ms: i64,
    pub command_line: String,
    pub pid: i32,
    pub main_tid: u64,
    /// 1: pymalloc, 2: pymalloc debug, 3: malloc, 4: other, 5: mimalloc, 6: mimalloc debug.
    pub python_allocator: u8,
    /// Recorded with `--trace-python-allocators`.
    pub trace_python_allocators: bool,
}

/// The versions read, for messages: "12 (memray 1.18 and 1.19) and 13 (memray 1.20)".
pub(super) fn versions_read() -> String {
    VERSIONS_READ
        .iter()
        .map(|(v, who)| format!("{v} ({who})"))
        .collect::<Vec<_>>()
        .join(" and ")
}

/// Reads the header. A version allocview does not read is an error naming it.
pub(super) fn read_header(s: &mut Stream) -> Result<Header, StreamError> {
    let magic: [u8; 7] = s.array()?;
    if &magic != MAGIC {
        return Err(s.bad(0, "not a memray capture (no `memray` magic)"));
    }
    let version = s.i32_le()?;
    if !VERSIONS_READ.iter().any(|(v, _)| *v == version) {
        return Err(s.bad(
            7,
            format!(
                "memray capture format version {version}: allocview reads versions {}; \
                 where the memray that wrote it is installed, `python -m \
                 allocview.memray_convert FILE OUT` rewrites it as version 13 through \
                 memray's own reader",
                versions_read()
            ),
        ));
    }
    let python_version = s.i32_le()?;
    let native_traces = s.u8()? != 0;
    let format_at = s.offset;
    let file_format = s.u8()?;
    if file_format != 0 {
        return Err(s.bad(
            format_at,
            format!(
                "an aggregated memray capture (file format {file_format}, `memray run \
                 --aggregate`): it holds totals per stack, not allocations; allocview reads \
                 captures made without --aggregate"
            ),
        ));
    }
    let n_allocations = s.u64_le()?;
    let _n_frames = s.u64_le()?;
    let start_time_ms = i64::from_le_bytes(s.array()?);
    let end_time_ms = i64::from_le_bytes(s.array()?);
    let command_line = s.cstring()?;
    let pid = s.i32_le()?;
    let main_tid = s.u64_le()?;
    let _skipped_frames_on_main_tid = s.u64_le()?;
    let python_allocator = s.u8()?;
    let trace_python_allocators = s.u8()? != 0;
    let _track_object_lifetimes = s.u8()?;
    if version >= 13 {
        // The module search paths: libdest, then site-packages and sys.path, each a run of
        // strings ended by an empty one.
        let _libdest = s.cstring()?;
        for _ in 0..2 {
            while !s.cstring()?.is_empty() {}
        }
    }
    Ok(Header {
        version,
        python_version,
        native_traces,
        file_format,
        n_allocations,
        start_time_ms,
        end_time_ms,
        command_line,
        pid,
        main_tid,
        python_allocator,
        trace_python_allocators,
    })
}
