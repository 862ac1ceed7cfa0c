//! `allocview tune FILE [--limit BYTES] [--policy FAMILY] [--json]`: the settings of the
//! input's allocator family that replay it whole under the limit, best first, each with the
//! line a user sets and the variant `compare --policy` takes to prove it.

use std::path::PathBuf;

use anyhow::Result;

use crate::answers::tune::{TuneOptions, Tuned, tune};
use crate::format;
use crate::session::InputArgs;
use allocview_loaders::Requests;

use crate::session::input::{load_input, note_requests};

/// Arguments of `allocview tune`.
#[derive(Debug, clap::Args)]
pub struct TuneArgs {
    /// The input: a PyTorch snapshot, a TensorFlow memory log or a malloc trace.
    pub file: PathBuf,
    /// The memory the run must fit in (e.g. 9.12GB, 512MiB); without it, the setting with the
    /// lowest peak footprint.
    #[arg(long, value_parser = crate::units::parse_bytes, value_name = "BYTES")]
    pub limit: Option<u64>,
    /// The allocator family whose settings are searched: pytorch, bfc or glibc (default: the
    /// input's own).
    #[arg(long, value_name = "FAMILY")]
    pub policy: Option<String>,
    /// Replays run at once (default: one per core).
    #[arg(long, value_name = "N")]
    pub jobs: Option<usize>,
    /// Rows of the table (the JSON has every candidate).
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub input: InputArgs,
}

/// Runs `allocview tune`.
pub fn run(args: &TuneArgs) -> Result<()> {
    // As `compare`: the allocator serves what reached the C library (a Python recording's
    // pymalloc arenas included, not its objects).
    let input = args.input.with_default_requests(Requests::Libc);
    let loaded = load_input(&args.file, &input)?;
    note_requests(&args.file, &loaded, input.requests_or(Requests::Libc));
    let replayed = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let opts = TuneOptions {
        limit_bytes: args.limit,
        family: args.policy.clone(),
        jobs: args.jobs.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        }),
        replayed: Some(std::sync::Arc::clone(&replayed)),
    };
    // A long input's search takes a while: its replays are counted on stderr.
    let events = crate::session::input::events_of(&loaded).map_or(0, |e| e.events.height());
    let bar = crate::progress::ByteProgress::start_counting("tune", replayed, events >= 1 << 20);
    let tuned = tune(&loaded, &args.file, &opts);
    drop(bar);
    let tuned = tuned?;
    if args.json {
        outln!("{}", serde_json::to_string(&tuned)?);
        return Ok(());
    }
    print(&args.file.display().to_string(), &tuned, args.top)
}

fn print(file: &str, t: &Tuned, top: usize) -> Result<()> {
    use format::bytes;
    let limit = t.limit_bytes.map_or_else(
        || "no limit".to_owned(),
        |l| format!("a limit of {}", bytes(l)),
    );
    outln!(
        "{file}: {} settings, under {limit}; peak live {} (no setting goes below it); {} replays",
        t.family,
        bytes(t.peak_live_bytes),
        t.replays
    );
    if t.family.starts_with("real-") {
        outln!(
            "  each setting replayed through the library itself: its peak footprint is the peak \
             RSS measured (a real allocator fails under no limit; it fits when its RSS does)"
        );
    }
    if !t.pruned_keys.is_empty() {
        outln!(
            "  left out: {} (no value of theirs changed the replay)",
            t.pruned_keys.join(", ")
        );
    }
    outln!();
    let w = t
        .candidates
        .iter()
        .take(top)
        .map(|c| c.policy.len())
        .max()
        .unwrap_or(10)
        .max(10);
    outln!(
        "  {:<w$} {:>4} {:>12} {:>12}  set",
        "policy",
        "fits",
        "peak foot",
        "headroom"
    );
    for c in t.candidates.iter().take(top) {
        outln!(
            "  {:<w$} {:>4} {:>12} {:>12}  {}",
            c.policy,
            if c.fits { "yes" } else { "no" },
            bytes(c.peak_footprint_bytes),
            c.headroom_bytes.map_or_else(|| "-".to_owned(), bytes),
            c.env
        );
    }
    outln!();
    match &t.best {
        Some(best) if t.limit_bytes.is_some() => {
            outln!(
                "  best: {}  ({} changed, peak {}, {} to spare)",
                best.env,
                match best.changed.len() {
                    1 => "1 key".to_owned(),
                    n => format!("{n} keys"),
                },
                bytes(best.peak_footprint_bytes),
                best.headroom_bytes.map_or_else(|| "-".to_owned(), bytes)
            );
            outln!(
                "  proof: allocview compare {file} --policy {} --limit {}",
                best.policy,
                t.limit_bytes.unwrap_or(0)
            );
            if !t.default.fits {
                outln!(
                    "  the recorded or default settings OOM at event {}",
                    t.default.first_oom_event.unwrap_or(0)
                );
            }
        }
        Some(best) if best.changed.is_empty() => {
            outln!(
                "  the recorded or default settings already have the lowest peak footprint ({})",
                bytes(best.peak_footprint_bytes)
            );
        }
        Some(best) => {
            let saved = t
                .default
                .peak_footprint_bytes
                .saturating_sub(best.peak_footprint_bytes);
            outln!(
                "  lowest peak footprint: {} with {} ({} less than the recorded or default \
                 settings' {})",
                bytes(best.peak_footprint_bytes),
                best.env,
                bytes(saved),
                bytes(t.default.peak_footprint_bytes)
            );
        }
        None => {
            outln!("  no setting fits: the smallest limit each needs");
            for m in &t.min_limits {
                outln!(
                    "    {:<w$} {:>12}  {}",
                    m.policy,
                    m.min_limit_bytes
                        .map_or_else(|| "none works".to_owned(), bytes),
                    m.env
                );
            }
            if let Some(s) = &t.shrink {
                outln!(
                    "  for {} to fit, the live bytes at the peak must lose about {} (the limit \
                     it needs less the one asked for); the sites that hold the most of them then:",
                    s.policy,
                    bytes(s.bytes)
                );
                for site in &s.sites {
                    outln!(
                        "    {:>12} of its {:>12}  {}",
                        bytes(site.shrink_bytes),
                        bytes(site.live_bytes),
                        site.site
                    );
                }
            }
        }
    }
    Ok(())
}
