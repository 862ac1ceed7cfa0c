//! `allocview compare FILE --policy a,b,c [--limit X] [--json]`: one trace, several policies,
//! one table.

mod streamed;
mod table;

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;

use anyhow::{Result, bail};

use crate::answers::compare::{CompareOptions, evaluate};
use allocview_loaders::Requests;

use crate::session::InputArgs;
use crate::session::PolicyArgs;
use crate::session::StreamArgs;
use crate::session::input::{load_input, note_requests};

/// Arguments of `allocview compare`.
#[derive(Debug, clap::Args)]
pub struct CompareArgs {
    /// The trace to replay.
    pub file: PathBuf,
    #[command(flatten)]
    pub policies: PolicyArgs,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// For a TensorFlow memory log: replay `bfc` from process start instead of from the
    /// checkpoint rebuilt from the log (it then diverges from TensorFlow's addresses early, as
    /// the log does not show every allocation).
    #[arg(long)]
    pub from_start: bool,
    /// For a TensorFlow memory log: replay `bfc` without consulting TensorFlow's logged
    /// addresses for any choice the log leaves open (which other thread's free came first,
    /// where a variable goes, a raw chunk's size); its match rate is then its own.
    #[arg(long)]
    pub no_guidance: bool,
    /// Find, for each policy, the smallest `--limit` at which the replay has no OOM, and print
    /// it beside the peak live bytes (`min_limit_bytes` in the JSON).
    #[arg(long, conflicts_with = "limit")]
    pub min_limit: bool,
    /// Also write every policy's series (the `timeline.csv` of `report`: one row per policy
    /// and time bucket, with a `policy` column) to this Parquet file.
    #[arg(long, value_name = "OUT")]
    pub parquet: Option<PathBuf>,
    #[command(flatten)]
    pub stream: StreamArgs,
    #[command(flatten)]
    pub input: InputArgs,
}

impl CompareArgs {
    /// What the answer is asked, besides the trace.
    #[must_use]
    pub fn options(&self) -> CompareOptions {
        CompareOptions {
            policies: self.policies.clone(),
            from_start: self.from_start,
            no_guidance: self.no_guidance,
            min_limit: self.min_limit,
            windowed: self.input.window.is_set(),
        }
    }
}

/// Runs `allocview compare`.
pub fn run(args: &CompareArgs) -> Result<()> {
    let (specs, real) = args.policies.specs_and_real()?;
    // The policies replay what the process held: what reached the C library.
    let input = args.input.with_default_requests(Requests::Libc);
    // --min-limit and --parquet need the events in memory: a window of a trace too big to load
    // is loaded (read block by block, only the window kept) unless --stream is asked for.
    let needs_loaded = args.min_limit || args.parquet.is_some();
    let windowed_load = needs_loaded && !args.stream.stream && args.input.window.is_set();
    if !windowed_load && args.stream.applies(&args.file, &args.input)? {
        if needs_loaded {
            bail!(
                "--stream replays each policy once: --min-limit and --parquet need the trace loaded"
            );
        }
        if let Some(r) = real.first() {
            bail!(
                "{} replays the trace's calls from memory: it needs the trace loaded, not \
                 streamed (leave out --stream, or take a window with --from/--to/--events)",
                r.label
            );
        }
        return streamed::compare(
            &args.file,
            &args.policies,
            &args.input.window,
            input.requests_or(Requests::Libc),
            input.heap_id(&args.file)?,
            args.json,
            &specs,
        );
    }
    let loaded = load_input(&args.file, &input)?;
    note_requests(&args.file, &loaded, input.requests_or(Requests::Libc));
    let out = evaluate(
        &args.file,
        &args.options(),
        &loaded,
        args.parquet.is_some(),
        &AtomicU64::new(0),
    )?;
    if let (Some(path), Some(series)) = (&args.parquet, &out.series) {
        let meta = crate::parquet_out::metadata("series", Some(&args.file));
        crate::parquet_out::write_frame(path, series, &[&args.file], meta)?;
        let policies = series
            .column("policy")
            .and_then(|c| c.n_unique())
            .unwrap_or(0);
        eprintln!(
            "wrote the series of {policies} policies to {}",
            path.display()
        );
    }
    if args.json {
        outln!("{}", out.json(&args.file));
    } else {
        table::print_table(
            &args.file.display().to_string(),
            out.events,
            out.max_live_bytes,
            &out.rows,
        )?;
        table::print_recorded(out.recorded_memory.as_ref())?;
        table::print_advice(&out.advice)?;
        if args.min_limit {
            table::print_minima(&out.minima, out.max_live_bytes)?;
        }
    }
    Ok(())
}
