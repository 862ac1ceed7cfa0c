//! Heap profiles: pprof's `profile.proto` (Go's heap profiles, JAX's device memory profiles,
//! jemalloc's pprof output) and DHAT's JSON. They hold moments, not timelines: what was live
//! by call stack at one time (and, where the file has them, what was allocated up to it, and
//! DHAT's global peak), with no event to replay. `sites`, `flamegraph`, `diff` and `export`
//! read them; the commands that need events say so.

pub mod dhat;
pub mod pprof;
pub mod proto;

use std::io::Read as _;
use std::path::Path;

use crate::error::LoadError;
use crate::events::Strictness;
use crate::sites::StackTable;

/// Which tool's format a profile came in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProfileFormat {
    Pprof,
    Dhat,
}

impl ProfileFormat {
    /// The name reports use.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Pprof => "pprof",
            Self::Dhat => "dhat",
        }
    }
}

/// One stack's figures. A figure the file does not hold is 0 and said in
/// [`HeapProfile::has`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProfileSample {
    pub stack: u32,
    /// Live at the profile's moment (pprof's `inuse_*`, DHAT's at the end).
    pub live_bytes: u64,
    pub live_objects: u64,
    /// Allocated up to the moment (pprof's `alloc_*`, DHAT's totals).
    pub alloc_bytes: u64,
    pub alloc_objects: u64,
    /// Live at the run's peak (DHAT's `gb`, `gbk`).
    pub peak_bytes: u64,
    pub peak_objects: u64,
}

/// Which figures a profile holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Holds {
    pub live: bool,
    pub alloc: bool,
    pub peak: bool,
}

/// A heap profile: samples by stack.
#[derive(Clone, Debug)]
pub struct HeapProfile {
    pub format: ProfileFormat,
    pub stacks: StackTable,
    pub samples: Vec<ProfileSample>,
    pub has: Holds,
    /// Nanoseconds the profile covers, where it says (pprof's `duration_nanos`, DHAT's `te`).
    pub duration_ns: Option<u64>,
    /// What the reader must tell about the file (its sample types, what it approximated).
    pub notes: Vec<String>,
}

impl HeapProfile {
    /// The samples' live bytes in all.
    #[must_use]
    pub fn live_bytes(&self) -> u64 {
        self.samples.iter().map(|s| s.live_bytes).sum()
    }
}

/// Most bytes a compressed profile may inflate to: far above any real heap profile (the
/// largest real ones are tens of megabytes), so that a crafted file cannot exhaust memory.
pub const MAX_INFLATED_BYTES: u64 = 1 << 30;

/// The bytes of `path`, gunzipped when they are gzip, at most [`MAX_INFLATED_BYTES`].
///
/// # Errors
/// When the file cannot be read, its gzip is damaged, or it inflates past the bound.
pub fn read_bytes(path: &Path) -> Result<Vec<u8>, LoadError> {
    let raw = std::fs::read(path).map_err(|e| LoadError::io(path, e))?;
    if !raw.starts_with(&[0x1f, 0x8b]) {
        return Ok(raw);
    }
    let mut out = Vec::new();
    if let Err(e) = flate2::read::MultiGzDecoder::new(raw.as_slice())
        .take(MAX_INFLATED_BYTES + 1)
        .read_to_end(&mut out)
    {
        return Err(LoadError::format(
            path,
            format!(
                "the gzip stream is damaged after {} decompressed bytes (of {} in the file): {e}",
                out.len(),
                raw.len()
            ),
        ));
    }
    if out.len() as u64 > MAX_INFLATED_BYTES {
        return Err(LoadError::format(
            path,
            format!(
                "the file inflates past {MAX_INFLATED_BYTES} bytes, more than any heap profile"
            ),
        ));
    }
    Ok(out)
}

/// Whether the first (decompressed) bytes of a file are a pprof profile or DHAT's JSON.
#[must_use]
pub fn detect(head: &[u8]) -> Option<ProfileFormat> {
    if dhat::is_dhat(head) {
        Some(ProfileFormat::Dhat)
    } else if pprof::is_pprof(head) {
        Some(ProfileFormat::Pprof)
    } else {
        None
    }
}

/// Loads the heap profile at `path`. Lenient, a pprof profile keeps the fields before damage
/// and skips samples that do not read, and a DHAT file skips program points naming frames its
/// table lacks, each counted in a note.
///
/// # Errors
/// When the file cannot be read or is not a profile this reader understands; the error names
/// the byte offset (pprof) or the place in the JSON (DHAT).
pub fn load_profile(
    path: &Path,
    format: ProfileFormat,
    strictness: Strictness,
) -> Result<HeapProfile, LoadError> {
    let bytes = read_bytes(path)?;
    let lenient = strictness == Strictness::Lenient;
    match format {
        ProfileFormat::Pprof => pprof::parse(&bytes, lenient),
        ProfileFormat::Dhat => dhat::parse(&bytes, lenient),
    }
    .map_err(|e| LoadError::format(path, e))
}
