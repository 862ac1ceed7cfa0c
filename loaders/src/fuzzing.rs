//! What the fuzz targets (`fuzz/`) do with an input, shared with the regression tests that load
//! every input the fuzzer ever found (`loaders/tests/fuzz_regressions.rs`) and with the test
//! that runs every command on them (`app/tests/hostile_input.rs`).
//!
//! A target turns its input into a file ([`file_bytes`]: the binary targets write the header,
//! so the fuzzer spends no time rediscovering the magic; the gzip target compresses text that
//! is not gzip already) and loads it with its loader, then computes what the commands compute
//! from the result ([`exercise`]): the statistics, and the replays `compare` runs (a
//! TensorFlow log's BFC replay with its checkpoint search, a PyTorch snapshot's rebuilt
//! script through the caching allocator; a profiler trace's stream like any malloc trace). Only
//! for tests and fuzzing.

use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;

use allocview_sim::policy::config::PolicyConfig;
use allocview_sim::policy::pytorch::Pytorch;
use allocview_sim::policy::registry::build;
use allocview_sim::replay::{ReplayOptions, replay};

use crate::analysis::stats::{TraceStats, events_per_thread};
use crate::error::LoadError;
use crate::events::{LoadOptions, MallocTrace, Strictness};
use crate::malloc_trace::load_malloc_trace;

/// One fuzz target: one loader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    MallocText,
    MallocGzip,
    Binary,
    Spool,
    Stacks,
    TfDump,
    TfMemlog,
    MinimallocCsv,
    GraphJson,
    Pickle,
    Kineto,
    Heaptrack,
    /// Heap profiles: pprof's `profile.proto` and DHAT's JSON.
    Profile,
    Memray,
}

impl Target {
    /// Every target, in the order the fuzzing recipe runs them.
    pub const ALL: [Self; 14] = [
        Self::MallocText,
        Self::MallocGzip,
        Self::Binary,
        Self::Spool,
        Self::Stacks,
        Self::TfDump,
        Self::TfMemlog,
        Self::MinimallocCsv,
        Self::GraphJson,
        Self::Pickle,
        Self::Kineto,
        Self::Heaptrack,
        Self::Profile,
        Self::Memray,
    ];

    /// The target's name: its binary in `fuzz/` and its folders.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::MallocText => "malloc_text",
            Self::MallocGzip => "malloc_gzip",
            Self::Binary => "binary",
            Self::Spool => "spool",
            Self::Stacks => "stacks",
            Self::TfDump => "tf_dump",
            Self::TfMemlog => "tf_memlog",
            Self::MinimallocCsv => "minimalloc_csv",
            Self::GraphJson => "graph_json",
            Self::Pickle => "pickle",
            Self::Kineto => "kineto",
            Self::Heaptrack => "heaptrack",
            Self::Profile => "profile",
            Self::Memray => "memray",
        }
    }

    /// The target named `name`.
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }

    /// A file name for the target's input (the loaders detect by content; the extension only
    /// helps a person).
    #[must_use]
    pub fn file_name(self) -> &'static str {
        match self {
            Self::MallocText => "trace.txt",
            Self::MallocGzip => "trace.gz",
            Self::Binary | Self::Stacks => "trace.avt",
            Self::Spool => "trace.spool",
            Self::TfDump | Self::TfMemlog => "tf.log",
            Self::MinimallocCsv => "plan.csv",
            Self::GraphJson => "plan.json",
            Self::Pickle => "snapshot.pickle",
            Self::Kineto => "trace.pt.trace.json",
            Self::Heaptrack => "heaptrack.prog.1",
            Self::Profile => "heap.prof",
            Self::Memray => "capture.memray.bin",
        }
    }
}

/// The binary format's header for a trace (kind 0) or a spool (kind 1).
fn binary_header(kind: u8) -> Vec<u8> {
    let mut h = crate::binary::MAGIC.to_vec();
    h.push(crate::binary::VERSION);
    h.push(kind);
    h
}

fn frame(out: &mut Vec<u8>, tag: u8, payload: &[u8]) {
    out.push(tag);
    out.extend_from_slice(
        &u32::try_from(payload.len())
            .unwrap_or(u32::MAX)
            .to_le_bytes(),
    );
    out.extend_from_slice(payload);
}

/// The stacks target's file: a THREADS frame, an EVENTS frame (stored codec) of four
/// allocations naming stacks 1 to 4, then the input as (selector u8, length u16 LE, payload)
/// records, each written as a MODULES, LOCATIONS, STACKS or SYMBOLS frame (0x05 + selector %
/// 4), then END.
fn stacks_file(data: &[u8]) -> Vec<u8> {
    let mut out = binary_header(0);
    frame(&mut out, 0x02, &[1, 1]);
    let mut events = Vec::new();
    for stack in 1..=4u8 {
        // op: no call name (15) | a stack id follows (bit 6); time +1 (zigzag 2); size 16;
        // address +32 (zigzag 64); the stack id.
        events.extend_from_slice(&[0x4f, 2, 16, 64, stack]);
    }
    let mut payload = vec![0, 4, u8::try_from(events.len()).unwrap_or(0)];
    payload.extend_from_slice(&events);
    frame(&mut out, 0x03, &payload);
    let mut rest = data;
    while let [selector, lo, hi, tail @ ..] = rest {
        let len = usize::from(u16::from_le_bytes([*lo, *hi])).min(tail.len());
        let (payload, after) = tail.split_at(len);
        frame(&mut out, 0x05 + selector % 4, payload);
        rest = after;
    }
    frame(&mut out, 0x04, &[4]);
    out
}

/// The file a target loads for input `data`.
#[must_use]
pub fn file_bytes(target: Target, data: &[u8]) -> Vec<u8> {
    match target {
        Target::Binary => [binary_header(0), data.to_vec()].concat(),
        Target::Spool => [binary_header(1), data.to_vec()].concat(),
        Target::Stacks => stacks_file(data),
        Target::MallocGzip if !data.starts_with(&[0x1f, 0x8b]) => {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            // Writing to a Vec cannot fail.
            let _ = gz.write_all(data);
            gz.finish().unwrap_or_default()
        }
        _ => data.to_vec(),
    }
}

/// What one load came to: loaded (with a count the commands would print) or refused.
#[derive(Debug)]
pub enum Outcome {
    /// Loaded: how many records (events, chunks, rows) it holds.
    Loaded(u64),
    /// Refused with this error.
    Refused(LoadError),
}

fn options(strictness: Strictness) -> LoadOptions {
    LoadOptions {
        strictness,
        ..LoadOptions::default()
    }
}

/// Computes what `allocview stats` computes from a loaded trace, and a replay; returns its
/// event count.
fn trace_counts(path: &Path, trace: &MallocTrace, mode: Strictness) -> Result<u64, LoadError> {
    let view = crate::trace_view(&trace.events, path)?;
    let per_thread = events_per_thread(&trace.events, trace.threads.height())?;
    let stats = TraceStats::compute(&view, per_thread, &trace.summary);
    // One replay, through `bfc`, of what a lenient load keeps: replaying every policy in both
    // modes made the seeds' test (a debug build) ten times slower.
    if mode == Strictness::Lenient
        && let Ok(policy) = build("bfc", &PolicyConfig::default(), &view)
    {
        let r = replay(&view, policy, &replay_options());
        std::hint::black_box((r.ooms.len(), r.free_failures.len()));
    }
    std::hint::black_box(trace.summary.warnings());
    if let Some(stacks) = &trace.stacks {
        for id in 0..u32::try_from(stacks.num_stacks()).unwrap_or(0) {
            std::hint::black_box(stacks.site_lines(id, 8, true));
        }
    }
    Ok(stats.events)
}

fn outcome(r: Result<u64, LoadError>) -> Outcome {
    match r {
        Ok(n) => Outcome::Loaded(n),
        Err(e) => Outcome::Refused(e),
    }
}

/// Loads `path` with `target`'s loader (the trace loaders in both strictness modes) and
/// computes what the commands derive from it.
#[must_use]
pub fn exercise(target: Target, path: &Path) -> Vec<Outcome> {
    let trace = |load: fn(&Path, &LoadOptions) -> Result<MallocTrace, LoadError>| {
        [Strictness::Strict, Strictness::Lenient]
            .into_iter()
            .map(|mode| {
                outcome(load(path, &options(mode)).and_then(|t| trace_counts(path, &t, mode)))
            })
            .collect()
    };
    match target {
        Target::MallocText | Target::MallocGzip => trace(load_malloc_trace),
        Target::Binary | Target::Spool | Target::Stacks => trace(crate::binary::load_binary),
        Target::Heaptrack => trace(crate::heaptrack::load_heaptrack),
        Target::Memray => trace(crate::memray::load_memray),
        Target::TfDump => vec![outcome(crate::tf::dump::load_bfc_dumps(path).map(
            |dumps| {
                for d in &dumps {
                    std::hint::black_box((d.blocks(), d.stats_bytes(), d.diagnosis()));
                    let _ = std::hint::black_box(d.to_bfc());
                }
                dumps.iter().map(|d| d.chunks.len() as u64).sum()
            },
        ))],
        Target::TfMemlog => vec![outcome(crate::tf::memlog::load_memory_log(path).map(
            |log| {
                std::hint::black_box(log.summary.warnings());
                tf_replays(&log);
                log.events.height() as u64
            },
        ))],
        Target::MinimallocCsv => [Strictness::Strict, Strictness::Lenient]
            .into_iter()
            .map(|mode| {
                outcome(
                    crate::plan::minimalloc::load_minimalloc_csv(path, mode)
                        .and_then(|plan| plan.to_buffers().map(|b| b.buffers.len() as u64)),
                )
            })
            .collect(),
        Target::GraphJson => vec![outcome(
            crate::plan::graph::load_graph_json(path)
                .and_then(|plan| plan.to_buffers().map(|b| b.buffers.len() as u64)),
        )],
        Target::Kineto => trace(crate::kineto::load_kineto),
        Target::Profile => vec![outcome(profile_figures(path))],
        Target::Pickle => vec![outcome(
            crate::pytorch::load_snapshot(path, &options(Strictness::Lenient))
                .and_then(|s| snapshot_replay(path, &s)),
        )],
    }
}

/// A heap profile (pprof or DHAT, by content) and what `sites` and `flamegraph` make of it.
fn profile_figures(path: &Path) -> Result<u64, LoadError> {
    use crate::analysis::profile_sites::{ProfileMoment, profile_folded, profile_rows};
    use crate::analysis::site_stats::GroupBy;
    let head = crate::profile::read_bytes(path)?;
    let format = crate::profile::detect(&head)
        .ok_or_else(|| LoadError::format(path, "neither a pprof profile nor DHAT's JSON"))?;
    let _ = std::hint::black_box(crate::profile::load_profile(
        path,
        format,
        Strictness::Lenient,
    ));
    let p = crate::profile::load_profile(path, format, Strictness::Strict)?;
    for moment in [ProfileMoment::Live, ProfileMoment::Peak] {
        for by in [GroupBy::Stack, GroupBy::Function, GroupBy::Module] {
            std::hint::black_box(profile_rows(&p, moment, by));
        }
        std::hint::black_box(profile_folded(&p, moment, "live", &|f| f.to_owned()));
    }
    Ok(p.samples.len() as u64)
}

/// What `compare` (and its limit search) replays of a TensorFlow memory log: BFC from the
/// checkpoint (guided and not), from the start, and up to a first OOM under a small limit. A
/// replay's error is a fine outcome.
fn tf_replays(log: &crate::tf::memlog::TfMemoryLog) {
    use crate::analysis::tf_fidelity::{FidelityOptions, replay_checkpointed, replay_from_start};
    let checkpointed = [
        FidelityOptions::default(),
        FidelityOptions {
            no_guidance: true,
            ..FidelityOptions::default()
        },
        FidelityOptions {
            limit_bytes: Some(1 << 20),
            stop_at_first_oom: true,
            ..FidelityOptions::default()
        },
    ];
    for opts in &checkpointed {
        let _ = std::hint::black_box(replay_checkpointed(log, opts).map(|f| f.describe()));
    }
    let _ = std::hint::black_box(
        replay_from_start(log, &FidelityOptions::default()).map(|f| f.describe()),
    );
}

/// What `compare`'s `pytorch` row replays of a snapshot: its rebuilt script through the
/// caching allocator, checked against the recorded addresses. Returns the event count.
fn snapshot_replay(path: &Path, s: &crate::pytorch::PytorchSnapshot) -> Result<u64, LoadError> {
    let view = crate::trace_view(&s.events, path)?;
    let config = PolicyConfig {
        pytorch: s.settings.policy.clone(),
        pytorch_script: Some(Arc::new(s.script.clone())),
        ..PolicyConfig::default()
    };
    // A configuration the policy refuses is a fine outcome.
    if let Ok(policy) = build("pytorch", &config, &view) {
        let r = replay(&view, policy, &replay_options());
        let fidelity = r
            .final_state
            .as_any()
            .downcast_ref::<Pytorch>()
            .and_then(|p| p.fidelity().cloned());
        std::hint::black_box((r.ooms.len(), r.free_failures.len(), fidelity));
    }
    Ok(s.events.height() as u64)
}

/// Replays without seek checkpoints (commands that do not seek take none).
fn replay_options() -> ReplayOptions {
    ReplayOptions {
        checkpoint_every: 0,
        ..ReplayOptions::default()
    }
}
