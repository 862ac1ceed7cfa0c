//! `allocview splice --events N --out FILE INPUT...`: a binary trace of exactly N records made
//! of copies of real traces one after the other, for benchmarks on traces larger than memory
//! (`scripts/make-big-trace.py` drives it).
//!
//! Copy k of an input is its records with times shifted to start 1 µs after copy k-1 ended,
//! and non-null pointers moved up by `(k mod 4096 + 1) << 44`, so that no copy's pointers meet
//! another's. At the end of a copy the allocations it left live are freed (in address order), so
//! the spliced trace is a long-running process doing the same work again and again rather than
//! one that leaks every copy's leftovers. The output is written as the inputs are read, block by
//! block: memory holds one input copy's live pointers, never the trace.

use std::fs::File;
use std::io::{self, BufWriter};
use std::path::PathBuf;

use allocview_loaders::binary::{BinaryWriter, TimeBase};
use allocview_loaders::events::Record;
use anyhow::{Context as _, Result, bail};

use crate::safe_write::PendingFile;

/// Arguments of `allocview splice`.
#[derive(Debug, clap::Args)]
pub struct SpliceArgs {
    /// The traces to copy (text or binary), used in turn until N records are written.
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
    /// Records to write.
    #[arg(long, value_name = "N")]
    pub events: u64,
    /// The binary trace to write.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
}

/// Address bits each copy's pointers are moved by (times the copy's number, modulo 4096).
const COPY_ADDR_SHIFT: u32 = 44;
/// Gap between one copy's last record and the next one's first.
const COPY_GAP_NS: i64 = 1_000;

/// Where the splice is: records written and the next copy's start.
struct Splice {
    writer: BinaryWriter<BufWriter<File>>,
    written: u64,
    target: u64,
    copies: u64,
    t_next_ns: i64,
}

/// Runs `allocview splice`.
pub fn run(args: &SpliceArgs) -> Result<()> {
    if args.events == 0 {
        bail!("--events must be at least 1");
    }
    let inputs: Vec<&std::path::Path> = args.inputs.iter().map(PathBuf::as_path).collect();
    let (pending, file) = PendingFile::create(&args.out, &inputs)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let meta = vec![
        ("source".to_owned(), "allocview splice".to_owned()),
        (
            "spliced_from".to_owned(),
            inputs
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" "),
        ),
    ];
    let writer = BinaryWriter::new(BufWriter::with_capacity(1 << 20, file), &meta)
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    let mut s = Splice {
        writer,
        written: 0,
        target: args.events,
        copies: 0,
        t_next_ns: 0,
    };
    'copies: loop {
        for input in &args.inputs {
            if s.written >= s.target {
                break 'copies;
            }
            let before = s.written;
            s.copy(input)?;
            if s.written == before {
                bail!("{} has no records to copy", input.display());
            }
        }
    }
    let out = s
        .writer
        .finish()
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    let file = out
        .into_inner()
        .map_err(io::IntoInnerError::into_error)
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    pending
        .commit(Some(file))
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    eprintln!(
        "wrote {} records ({} copies) to {}",
        crate::format::count(s.written),
        crate::format::count(s.copies),
        args.out.display()
    );
    Ok(())
}

impl Splice {
    /// Appends one shifted copy of `input` (or as much of it as the target leaves room for).
    fn copy(&mut self, input: &std::path::Path) -> Result<()> {
        let addr_shift = ((self.copies % 4096) + 1) << COPY_ADDR_SHIFT;
        let mut live: std::collections::HashSet<u64> = std::collections::HashSet::new();
        let mut t_first: Option<i64> = None;
        let mut t_last = self.t_next_ns;
        let mut last_tid = 0u64;
        // The leftovers' frees are named `free` when the input names its calls.
        let mut free_call = None;
        let (written, target) = (&mut self.written, self.target);
        let (writer, t_next) = (&mut self.writer, self.t_next_ns);
        crate::trace_file::read_any(input, false, TimeBase::default(), &mut |r: &Record| {
            if *written >= target {
                return Ok(());
            }
            let first = *t_first.get_or_insert(r.t_ns);
            let mut out = *r;
            out.t_ns = t_next + r.t_ns.saturating_sub(first).max(0);
            if r.addr != 0 {
                out.addr = r.addr.wrapping_add(addr_shift);
                if r.size_bytes.is_some() {
                    live.insert(out.addr);
                } else {
                    live.remove(&out.addr);
                }
            }
            t_last = t_last.max(out.t_ns);
            last_tid = r.tid;
            if r.call.is_some() {
                free_call = allocview_loaders::events::call_code(b"free");
            }
            *written += 1;
            writer.push(&out)
        })?;
        let mut leftovers: Vec<u64> = live.into_iter().collect();
        leftovers.sort_unstable();
        for addr in leftovers {
            if self.written >= self.target {
                break;
            }
            self.writer.push(&Record {
                t_ns: t_last,
                tid: last_tid,
                size_bytes: None,
                addr,
                call: free_call,
                stack: None,
                heap: 0,
            })?;
            self.written += 1;
        }
        self.copies += 1;
        self.t_next_ns = t_last + COPY_GAP_NS;
        Ok(())
    }
}
