//! The option groups every frontend shares, as flags (each derives `clap::Args`, so a command
//! flattens the ones it takes) or as plain structs (the explorers, the Python package). What
//! they do lives beside what they configure: [`super::input`], [`super::window`],
//! [`super::mode`], [`super::policies`].

use allocview_loaders::Requests;

/// Loader flags shared by every command that reads a trace.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct InputArgs {
    /// Skip malformed lines instead of stopping at the first one (they are counted and the
    /// first few are reported).
    #[arg(long)]
    pub lenient: bool,
    /// Of a trace recorded in a CPython interpreter, which requests to read: `objects`, those
    /// the program made (Python's objects as it asked for them, each with its stack), or
    /// `libc`, what reached the C library (pymalloc's arenas and the blocks Python's
    /// allocator took, not its objects). Default: `libc` for `compare` and `report`, whose
    /// policies replay what the process held; `objects` for every other command.
    #[arg(long, value_name = "objects|libc")]
    pub requests: Option<Requests>,
    /// Of a PyTorch profiler trace, which device's memory events to read: `cuda:0`, `hip:1`,
    /// `cpu`, a type alone (its device with the most events) or PyTorch's numbers (`6:0`).
    /// Default: the GPU with the most events, else the CPU.
    #[arg(long, value_name = "DEVICE")]
    pub device: Option<allocview_loaders::kineto::DeviceChoice>,
    /// Of a trace recorded with `allocview record`, which heap's events to read: `malloc` (the
    /// default: the malloc family's) or a heap the program reported itself through
    /// `allocview.h`, the `allocview-heap` crate or `otel_memory` USDT probes (`stats` lists
    /// a trace's heaps).
    #[arg(long, value_name = "NAME")]
    pub heap: Option<String>,
    #[command(flatten)]
    pub window: WindowArgs,
}

impl InputArgs {
    /// The id of the heap `--heap` names in `path` (0, malloc's, without the flag).
    ///
    /// # Errors
    /// When the file has no heap of that name (the error lists those it has).
    pub fn heap_id(&self, path: &std::path::Path) -> anyhow::Result<u32> {
        super::input::heap_id(path, self.heap.as_deref())
    }

    /// The requests to read: those asked for, or `default`.
    #[must_use]
    pub fn requests_or(&self, default: Requests) -> Requests {
        self.requests.unwrap_or(default)
    }

    /// These flags, reading `default` when no `--requests` was given.
    #[must_use]
    pub fn with_default_requests(&self, default: Requests) -> Self {
        Self {
            requests: Some(self.requests_or(default)),
            ..self.clone()
        }
    }
}

/// The window flags shared by every command that reads a trace.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct WindowArgs {
    /// Only the events at or after this time, with the allocations live then carried in.
    /// Times are on the trace's own clock (its `t_ns`, for libtracemalloc and recorded traces
    /// the time since the start): `1.5s`, `200ms`, `40us`, `12345ns`; a plain number is in
    /// seconds, as the text form writes times.
    #[arg(long, value_name = "TIME")]
    pub from: Option<String>,
    /// Only the events before this time (see `--from`).
    #[arg(long, value_name = "TIME")]
    pub to: Option<String>,
    /// Only the events numbered A to B-1 (0-based, as `stats` and the explorer number
    /// them): `A..B`, `A..` or `..B`. With `--from`/`--to`, the events in both.
    #[arg(long, value_name = "A..B")]
    pub events: Option<String>,
}

/// The `--stream` flag of the commands that can stream.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct StreamArgs {
    /// Read a binary trace block by block instead of loading it (memory bounded by the live
    /// allocations, not the events); chosen on its own for a binary trace too big for memory.
    #[arg(long)]
    pub stream: bool,
    /// Load the trace even where the command would stream it on its own (`stats` streams every
    /// binary trace: the same figures, faster and in less memory).
    #[arg(long, conflicts_with = "stream")]
    pub no_stream: bool,
}

/// Policy selection and knobs shared by the commands that replay.
#[derive(Clone, Debug, clap::Args)]
pub struct PolicyArgs {
    /// Policies to replay, comma-separated (default: all). Known: first-fit, best-fit, bfc,
    /// buddy, pool, glibc, oracle, pytorch, predictive. A variant takes parameters after the
    /// name, e.g. `pytorch:max_split_size_mb=128`, `bfc:allow_growth=false`,
    /// `buddy:min_block=4096` (docs/src/reference/policies.md lists every key); each variant is
    /// its own row.
    #[arg(long, value_name = "NAMES")]
    pub policy: Vec<String>,
    /// Memory limit for every policy (e.g. 512MiB, 2GiB); allocations past it fail and are
    /// reported as OOM events.
    #[arg(long, value_parser = crate::units::parse_bytes, value_name = "BYTES")]
    pub limit: Option<u64>,
    /// Alignment of every request, in bytes (a power of two).
    #[arg(long, default_value_t = 16, value_name = "BYTES")]
    pub align: u64,
    /// Replay at most this many policies at once (default: one per core).
    #[arg(long, value_name = "N")]
    pub jobs: Option<usize>,
}
