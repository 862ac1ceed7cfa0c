//! Writing a report, however its trace was read: the CSVs (and Parquet beside them), the
//! charts and the heap maps, all replacing their outputs together.

use std::path::{Path, PathBuf};

use allocview_sim::classes::ClassSeries;
use allocview_sim::heap::Counters;
use allocview_sim::policy::Policy;
use allocview_sim::replay::Replay;
use allocview_sim::series::Series;
use anyhow::{Context as _, Result};
use polars::prelude::*;

use super::charts::{chart_classes, chart_fragmentation, chart_timeline};
use super::heapmap;
use crate::answers::series::timeline_frame;
use crate::charts::register_fonts;
use crate::safe_write::PendingFile;

/// Where a report goes: the trace it is about (never overwritten) and the directory.
pub(super) struct Destination<'a> {
    pub file: &'a Path,
    pub out: &'a Path,
    /// Also write each CSV's table as Parquet beside it.
    pub parquet: bool,
}

/// Time buckets of the size-class series (the charts are about a thousand pixels wide).
pub(super) use crate::answers::report::BUCKETS;

/// A line of the report's tables and charts: a replayed policy, or a real allocator's measured
/// resident memory ([`crate::real`]).
pub(super) struct Line<'a> {
    pub(super) name: &'a str,
    pub(super) series: &'a Series,
    pub(super) summary: Summary,
    /// A measurement (a real allocator's RSS), not a model's footprint.
    pub(super) measured: bool,
}

/// The figures of a [`Line`], as `compare` has them.
pub(super) struct Summary {
    pub(super) peak_footprint_bytes: u64,
    pub(super) final_footprint_bytes: u64,
    pub(super) peak_live_bytes: u64,
    pub(super) peak_allocated_bytes: u64,
    pub(super) fragmentation_at_peak: f64,
    pub(super) mean_fragmentation: f64,
    pub(super) oom_count: u64,
    pub(super) events_per_second: f64,
}

impl<'a> Line<'a> {
    fn of_replay(name: &'a str, r: &'a Replay) -> Self {
        let s = &r.summary;
        Self {
            name,
            series: &r.series,
            measured: false,
            summary: Summary {
                peak_footprint_bytes: s.peak_footprint_bytes,
                final_footprint_bytes: s.final_footprint_bytes,
                peak_live_bytes: s.peak_live_bytes,
                peak_allocated_bytes: s.peak_allocated_bytes,
                fragmentation_at_peak: s.fragmentation_at_peak,
                mean_fragmentation: s.mean_fragmentation,
                oom_count: s.oom_count,
                events_per_second: s.events_per_second,
            },
        }
    }

    fn of_real(real: &'a Real) -> Self {
        let r = &real.row;
        Self {
            name: &r.name,
            series: &real.series,
            measured: true,
            summary: Summary {
                peak_footprint_bytes: r.peak_footprint_bytes,
                final_footprint_bytes: r.final_footprint_bytes,
                peak_live_bytes: r.peak_live_bytes,
                peak_allocated_bytes: r.peak_allocated_bytes,
                fragmentation_at_peak: r.fragmentation_at_peak,
                mean_fragmentation: r.mean_fragmentation,
                oom_count: r.ooms,
                events_per_second: r.events_per_second,
            },
        }
    }
}

/// A real allocator's row and series, for the report.
pub(super) struct Real {
    pub(super) row: crate::answers::compare::Row,
    pub(super) series: Series,
}

/// What a report is drawn from, however the trace was read.
pub(super) struct Gathered<'a> {
    pub(super) done: Vec<(&'a str, &'a Replay)>,
    /// The real allocators' rows (`real-glibc`, ...), drawn after the policies.
    pub(super) real: Vec<Real>,
    pub(super) classes: ClassSeries,
    pub(super) max_live: u64,
    /// The first event at the peak of live bytes, where the heap maps are drawn.
    pub(super) peak_event: usize,
    /// Each replayed policy's heap just after `peak_event`, in `done`'s order (none for an
    /// empty trace).
    pub(super) heaps: Vec<(Box<dyn Policy>, Counters)>,
}

/// Each line's series, by name.
fn series_of<'a>(lines: &[Line<'a>]) -> Vec<(&'a str, &'a Series)> {
    lines.iter().map(|l| (l.name, l.series)).collect()
}

/// Writes the report's tables and charts into `args.out`, all replacing their outputs together.
pub(super) fn write_report(
    args: &Destination<'_>,
    size: (u32, u32),
    g: &Gathered<'_>,
) -> Result<()> {
    let (w, h) = size;
    let done = &g.done;
    let lines: Vec<Line<'_>> = done
        .iter()
        .map(|&(name, r)| Line::of_replay(name, r))
        .chain(g.real.iter().map(Line::of_real))
        .collect();
    std::fs::create_dir_all(args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let title = args.file.file_name().map_or_else(
        || args.file.display().to_string(),
        |f| f.to_string_lossy().into_owned(),
    );

    // Every file goes to a temporary file first; all replace their outputs together at the
    // end, so a failure part way leaves the folder as it was.
    let mut out = Outputs::new(args.file);
    let tables = [
        ("summary", summary_frame(&lines, g.max_live)?),
        ("timeline", timeline_frame(&series_of(&lines))?),
        ("classes", classes_frame(&g.classes)?),
    ];
    for (name, mut df) in tables {
        let csv = args.out.join(format!("{name}.csv"));
        let (_, file) = out.start_file(&csv)?;
        write_csv(&mut df, file, &csv)?;
        if args.parquet {
            let path = args.out.join(format!("{name}.parquet"));
            let (_, file) = out.start_file(&path)?;
            let meta = crate::parquet_out::metadata(name, Some(args.file));
            crate::parquet_out::write_to_temporary(file, &path, &df, meta)?;
        }
    }

    register_fonts()?;
    chart_timeline(
        &out.start(&args.out.join("timeline.png"))?,
        (w, h),
        &title,
        &lines,
    )?;
    chart_fragmentation(
        &out.start(&args.out.join("fragmentation.png"))?,
        (w, h),
        &title,
        &lines,
    )?;
    chart_classes(
        &out.start(&args.out.join("classes.png"))?,
        (w, h),
        &title,
        &g.classes,
    )?;
    for ((name, _), (policy, counters)) in done.iter().zip(&g.heaps) {
        // A variant's label holds `:`, `=` and brackets: keep file names portable.
        let file_name: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-_=.".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let path = out.start(&args.out.join(format!("heapmap_{file_name}.png")))?;
        let heap = heapmap::Heap {
            policy: policy.as_ref(),
            counters,
            event: g.peak_event,
        };
        heapmap::chart_heapmap(&path, (w, h), &title, name, &heap)?;
    }
    for p in out.commit_all()? {
        outln!("wrote {}", p.display());
    }
    Ok(())
}

/// The report's files while they are written: temporary files beside their outputs, which
/// replace them only in [`Outputs::commit_all`] (dropped before that, they are removed).
struct Outputs<'a> {
    input: &'a Path,
    pending: Vec<(PathBuf, PendingFile)>,
}

impl<'a> Outputs<'a> {
    fn new(input: &'a Path) -> Self {
        Self {
            input,
            pending: Vec::new(),
        }
    }

    /// Starts the output `path` (refused if it is the input); returns the temporary file to
    /// write instead, for writers that open a file by path.
    fn start(&mut self, path: &Path) -> Result<PathBuf> {
        Ok(self.start_file(path)?.0)
    }

    /// Starts the output `path` (refused if it is the input); returns the temporary file to
    /// write instead, and that file open for writing.
    ///
    /// The report names its files itself, so whatever is at `path` is replaced, never
    /// written through: a symbolic link planted in the directory under one of the report's
    /// names must not make it write (or create) a file outside the directory.
    fn start_file(&mut self, path: &Path) -> Result<(PathBuf, std::fs::File)> {
        let (pending, file) = PendingFile::create_own_name(path, &[self.input])?;
        let tmp = pending.tmp_path().to_path_buf();
        self.pending.push((path.to_path_buf(), pending));
        Ok((tmp, file))
    }

    /// Puts every file in place; returns their paths.
    fn commit_all(self) -> Result<Vec<PathBuf>> {
        let mut done = Vec::with_capacity(self.pending.len());
        for (path, pending) in self.pending {
            pending.commit(None)?;
            done.push(path);
        }
        Ok(done)
    }
}

/// Writes `df` as CSV into `file`, the temporary file of the output `path` (named in errors).
fn write_csv(df: &mut DataFrame, file: std::fs::File, path: &Path) -> Result<()> {
    let written = CsvWriter::new(file).include_header(true).finish(df);
    anyhow::Context::with_context(written, || format!("writing {}", path.display()))
}

/// Reads a CSV written by this module back with the schema it was written with.
///
/// # Errors
/// When the file cannot be read or does not match the schema.
#[cfg(test)]
pub fn read_csv(path: &Path, schema: SchemaRef) -> Result<DataFrame> {
    Ok(CsvReadOptions::default()
        .with_has_header(true)
        .with_schema(Some(schema))
        .try_into_reader_with_file_path(Some(path.to_path_buf()))?
        .finish()?)
}

fn summary_frame(lines: &[Line<'_>], max_live: u64) -> Result<DataFrame> {
    let s = |f: fn(&Summary) -> u64| lines.iter().map(|l| f(&l.summary)).collect::<Vec<u64>>();
    let fl = |f: fn(&Summary) -> f64| lines.iter().map(|l| f(&l.summary)).collect::<Vec<f64>>();
    let ratio: Vec<f64> = lines
        .iter()
        .map(|l| {
            if max_live == 0 {
                0.0
            } else {
                l.summary.peak_footprint_bytes as f64 / max_live as f64
            }
        })
        .collect();
    let names: Vec<&str> = lines.iter().map(|l| l.name).collect();
    Ok(DataFrame::new(
        lines.len(),
        vec![
            Column::new("name".into(), names),
            Column::new("peak_footprint_bytes".into(), s(|r| r.peak_footprint_bytes)),
            Column::new(
                "final_footprint_bytes".into(),
                s(|r| r.final_footprint_bytes),
            ),
            Column::new("peak_live_bytes".into(), s(|r| r.peak_live_bytes)),
            Column::new("peak_allocated_bytes".into(), s(|r| r.peak_allocated_bytes)),
            Column::new(
                "fragmentation_at_peak".into(),
                fl(|r| r.fragmentation_at_peak),
            ),
            Column::new("mean_fragmentation".into(), fl(|r| r.mean_fragmentation)),
            Column::new("footprint_over_max_live".into(), ratio),
            Column::new("ooms".into(), s(|r| r.oom_count)),
            Column::new("events_per_second".into(), fl(|r| r.events_per_second)),
        ],
    )?)
}

/// Class x time-bucket live counts and bytes (after each bucket's last event), long format,
/// only the cells with something live.
fn classes_frame(c: &ClassSeries) -> Result<DataFrame> {
    let mut bucket = Vec::new();
    let mut t_s = Vec::new();
    let mut class = Vec::new();
    let mut count = Vec::new();
    let mut bytes = Vec::new();
    for b in 0..c.buckets() {
        let (Some(counts), Some(bs)) = (c.live_count_at_end(b), c.live_bytes_at_end(b)) else {
            continue;
        };
        for (k, (&n, &v)) in counts.iter().zip(bs).enumerate() {
            if n > 0 {
                bucket.push(b as u32);
                t_s.push((c.bucketing.start_ns(b) - c.bucketing.t0_ns) as f64 / 1e9);
                class.push(k as u32);
                count.push(n);
                bytes.push(v);
            }
        }
    }
    let n = bucket.len();
    Ok(DataFrame::new(
        n,
        vec![
            Column::new("bucket".into(), bucket),
            Column::new("t_s".into(), t_s),
            Column::new("class".into(), class),
            Column::new("live_count".into(), count),
            Column::new("live_bytes".into(), bytes),
        ],
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::runs::{max_live_bytes, run_policies};
    use allocview_sim::policy::config::PolicyConfig;
    use allocview_sim::policy::spec::PolicySpec;

    #[test]
    fn csvs_read_back_identically() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../sample-traces/xz_T2_8KiB_blocks.trace.gz");
        let t =
            allocview_loaders::malloc_trace::load_malloc_trace(&path, &Default::default()).unwrap();
        let view = allocview_loaders::trace_view(&t.events, &path).unwrap();
        let config = PolicyConfig {
            limit_bytes: Some(150 << 20),
            ..PolicyConfig::default()
        };
        let specs: Vec<PolicySpec> = ["bfc", "first-fit", "glibc"]
            .into_iter()
            .map(PolicySpec::plain)
            .collect();
        let runs = run_policies(&view, &specs, &config, 2);
        let done: Vec<(&str, &Replay)> = runs
            .iter()
            .map(|r| (r.name.as_str(), r.result.as_ref().unwrap()))
            .collect();
        let lines: Vec<Line<'_>> = done.iter().map(|&(n, r)| Line::of_replay(n, r)).collect();
        let bucketing = allocview_sim::series::Bucketing::for_trace(&view, BUCKETS);
        let classes = ClassSeries::build(&view, bucketing, 16_384);
        let dir_guard = tempfile::Builder::new()
            .prefix("allocview-report-")
            .tempdir()
            .unwrap();
        let dir = dir_guard.path().to_path_buf();
        for (name, mut df) in [
            (
                "summary",
                summary_frame(&lines, max_live_bytes(&view)).unwrap(),
            ),
            ("timeline", timeline_frame(&series_of(&lines)).unwrap()),
            ("classes", classes_frame(&classes).unwrap()),
        ] {
            assert!(df.height() > 0, "{name} is empty");
            let file = dir.join(format!("{name}.csv"));
            write_csv(&mut df, std::fs::File::create(&file).unwrap(), &file).unwrap();
            let back = read_csv(&file, df.schema().clone()).unwrap();
            assert_eq!(back.shape(), df.shape(), "{name}");
            assert!(
                back.equals_missing(&df),
                "{name} differs after a round trip:\n{df}\n{back}"
            );
        }
        // The summary holds the replays' exact figures.
        let summary = summary_frame(&lines, max_live_bytes(&view)).unwrap();
        let ooms: Vec<u64> = summary
            .column("ooms")
            .unwrap()
            .u64()
            .unwrap()
            .into_no_null_iter()
            .collect();
        assert_eq!(ooms.len(), 3);
        assert!(
            ooms.iter().all(|&n| n > 0),
            "every policy runs out under 150 MiB: {ooms:?}"
        );
    }
}
