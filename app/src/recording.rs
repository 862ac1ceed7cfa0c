//! Turning the tracer's spools into traces: what `record` and the Python package's in-process
//! `Tracker` share. The tracer itself is embedded here ([`TRACER_SO`]); a spool is converted
//! into a trace with [`convert_file`] (`record` also converts while the command runs, in
//! `cmd/record/live.rs`), its stacks symbolized by the caller's [`Symbolizer`].

use std::path::Path;

use allocview_loaders::analysis::stats::{RecordingStats, RecordingSummary};
use allocview_loaders::binary::{BinaryInfo, TimeBase};
use anyhow::Result;

use crate::symbolize::{Symbolizer, TraceStacks};
use crate::trace_file::{Form, RecordWriter, read_any};

/// The tracer shared object, compiled by `build.rs` (empty where it did not build).
pub static TRACER_SO: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/liballocview_tracer.so"));

/// The META lines of a written trace: the spool header's (pid, command line...) plus where
/// it came from.
pub fn trace_meta(header: &[(String, String)], program: &str) -> Vec<(String, String)> {
    let mut meta = vec![
        ("source".to_owned(), "allocview record".to_owned()),
        ("program".to_owned(), program.to_owned()),
    ];
    meta.extend(
        header
            .iter()
            .filter(|(k, _)| {
                matches!(
                    k.as_str(),
                    "pid"
                        | "ppid"
                        | "arg"
                        | "tracer"
                        | "realtime_ns0"
                        | "clock"
                        | "clock_resolution_ns"
                        | "stack_sample_bytes"
                        | allocview_loaders::binary::META_STARTED_MID_RUN
                )
            })
            .cloned(),
    );
    meta
}

/// What writes a finished trace's run tables and the rest of its stacks, given what the trace
/// was given of them while the program ran.
pub type AddStacks<'a> = dyn FnMut(&mut RecordWriter, BinaryInfo, TraceStacks) -> Result<()> + 'a;

/// Converts a finished spool into the trace `path`; returns the trace's summary.
pub fn convert_file(
    spool: &Path,
    path: &Path,
    form: Form,
    program: &str,
    base: TimeBase,
    protected: &[&Path],
    add_stacks: &mut AddStacks<'_>,
) -> Result<RecordingSummary> {
    let meta = trace_meta(&spool_header(spool), program);
    let mut writer = RecordWriter::create(path, form, &meta, protected)?;
    let mut stats = RecordingStats::default();
    if allocview_loaders::binary::started_mid_run(&meta) {
        stats.mark_started_mid_run();
    }
    let info = read_any(spool, false, base, &mut |r| {
        stats
            .push(r)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        writer.push(r)
    })?;
    if let Some(info) = info {
        if allocview_loaders::binary::marks::recording_stopped(&info.marks) {
            // Blocks allocated while recording was stopped were freed unseen.
            stats.mark_started_mid_run();
        }
        add_stacks(&mut writer, info, TraceStacks::default())?;
    }
    writer.finish()?;
    Ok(stats.finish())
}

/// The META lines of a spool's header (read from the file's first 64 KiB).
pub fn spool_header(spool: &Path) -> Vec<(String, String)> {
    // The spool header comes first and is a few hundred bytes; 64 KiB holds it.
    let mut head = Vec::new();
    let read = std::fs::File::open(spool)
        .and_then(|f| std::io::Read::read_to_end(&mut std::io::Read::take(f, 1 << 16), &mut head));
    let mut lines = Vec::new();
    if read.is_ok()
        && let Some(rest) = head.get(10..)
        && rest.first() == Some(&0x01)
        && let Some(len) = rest.get(1..5)
        && let Ok(len) = <[u8; 4]>::try_from(len)
        && let Some(text) = rest.get(5..5 + u32::from_le_bytes(len) as usize)
    {
        for line in String::from_utf8_lossy(text).lines() {
            if let Some((k, v)) = line.split_once('=') {
                lines.push((k.to_owned(), v.to_owned()));
            }
        }
    }
    lines
}

/// Converts the finished spool `spool` of an in-process run into the binary trace `out`,
/// its stacks symbolized (`program` names the traced program in the trace's META).
///
/// # Errors
/// When the spool cannot be read or the trace cannot be written.
pub fn spool_to_trace(spool: &Path, out: &Path, program: &str) -> Result<RecordingSummary> {
    let mut symbolizer = Symbolizer::default();
    convert_file(
        spool,
        out,
        Form::Binary,
        program,
        TimeBase::default(),
        &[],
        &mut |writer: &mut RecordWriter, info: BinaryInfo, written: TraceStacks| -> Result<()> {
            writer.write_run_tables(&info)?;
            if let Some(stacks) = info.stacks {
                written.finish(writer, &stacks, &mut symbolizer)?;
            }
            Ok(())
        },
    )
}
