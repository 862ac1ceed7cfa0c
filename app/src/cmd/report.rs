//! `allocview report FILE [--policy ...] --out DIR`: CSVs and PNG charts for a bug report or a
//! paper, without any UI. CSVs are written through polars; charts are drawn with plotters.

use std::path::{Path, PathBuf};

use allocview_sim::classes::ClassSeries;
use allocview_sim::heap::Counters;
use allocview_sim::policy::Policy;
use allocview_sim::replay::Replay;
use allocview_sim::trace::NUM_SIZE_CLASSES;
use anyhow::{Context as _, Result, anyhow};
use plotters::prelude::*;
use polars::prelude::*;

use super::compare::{PolicyArgs, config_for_input, max_live_bytes, run_policies};
use super::load::{InputArgs, load_input, require_events};
use crate::format;
use crate::safe_write::PendingFile;
use crate::theme::{self, Rgb};

/// Arguments of `allocview report`.
#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// The trace to report on.
    pub file: PathBuf,
    #[command(flatten)]
    pub policies: PolicyArgs,
    /// Directory to write into (created if missing).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Also write each CSV's table as Parquet beside it (`summary.parquet`, `timeline.parquet`,
    /// `classes.parquet`).
    #[arg(long)]
    pub parquet: bool,
    /// Chart size in pixels, width x height.
    #[arg(long, default_value = "1200x700")]
    pub size: String,
    #[command(flatten)]
    pub input: InputArgs,
    #[command(flatten)]
    pub stream: super::stream::StreamArgs,
}

/// Time buckets of the size-class series (the charts are about a thousand pixels wide).
pub(super) const BUCKETS: usize = 1024;

pub(crate) fn rgb(c: Rgb) -> RGBColor {
    RGBColor(c.0, c.1, c.2)
}

/// Runs `allocview report`.
pub fn run(args: &ReportArgs) -> Result<()> {
    let size = chart_size(&args.size)?;
    let specs = args.policies.specs()?;
    if args.stream.applies(&args.file, &args.input)? {
        return super::stream_report::run(args, &specs, size);
    }
    let loaded = load_input(&args.file, &args.input)?;
    let config = config_for_input(&loaded, args.policies.config()?);
    let ev = require_events(&loaded, &args.file, "report")?;
    let view = allocview_loaders::trace_view(ev.events, &args.file)?;
    // The features `compare` gives `predictive` (each thread's calls, the sites).
    let config =
        super::predict::with_predictive_features(config, &specs, &loaded, &view, &args.file)?;
    let jobs = args.policies.jobs.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let runs = run_policies(&view, &specs, &config, jobs);
    let done = replayed(&runs)?;
    let bucketing = allocview_sim::series::Bucketing::for_trace(&view, BUCKETS);
    let classes = ClassSeries::build(&view, bucketing, 16_384);
    let (_, peak) = view.peak_live();
    let heaps = if view.is_empty() {
        // Nothing was replayed, so there is no moment to draw a heap at.
        eprintln!("note: the trace has no events: no heap maps");
        Vec::new()
    } else {
        states_at(&done, &view, peak, jobs)?
    };
    write_report(
        args,
        size,
        &Gathered {
            done,
            classes,
            max_live: max_live_bytes(&view),
            peak_event: peak,
            heaps,
        },
    )
}

/// `--size`, width x height.
fn chart_size(text: &str) -> Result<(u32, u32)> {
    text.split_once('x')
        .and_then(|(w, h)| Some((w.parse::<u32>().ok()?, h.parse::<u32>().ok()?)))
        .context("--size must look like 1200x700")
}

/// The policies that replayed (the others are noted on stderr); an error when none did.
/// Each replay's state just after `event`, `jobs` at a time: the replays keep no checkpoints
/// but their first state (`run_policies`), so each seek replays from the start, and the seeks
/// share the cores as the replays did.
fn states_at(
    done: &[(&str, &Replay)],
    view: &allocview_sim::trace::TraceView<'_>,
    event: usize,
    jobs: usize,
) -> Result<Vec<(Box<dyn Policy>, Counters)>> {
    let mut heaps = Vec::with_capacity(done.len());
    for chunk in done.chunks(jobs.max(1)) {
        let found: Vec<Result<_>> = std::thread::scope(|s| {
            let seeks: Vec<_> = chunk
                .iter()
                .map(|&(name, rep)| {
                    s.spawn(move || {
                        rep.state_at(view, event)
                            .map_err(|e| anyhow!("{name}: seeking to event {event}: {e}"))
                    })
                })
                .collect();
            seeks
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow!("a seek's thread panicked")))
                })
                .collect()
        });
        for heap in found {
            heaps.push(heap?);
        }
    }
    Ok(heaps)
}

pub(super) fn replayed(runs: &[super::compare::PolicyRun]) -> Result<Vec<(&str, &Replay)>> {
    let done: Vec<(&str, &Replay)> = runs
        .iter()
        .filter_map(|r| match &r.result {
            Ok(rep) => Some((r.name.as_str(), rep)),
            Err(e) => {
                eprintln!("note: skipping {}: {e}", r.name);
                None
            }
        })
        .collect();
    if done.is_empty() {
        return Err(anyhow!("no policy could be replayed"));
    }
    Ok(done)
}

/// What a report is drawn from, however the trace was read.
pub(super) struct Gathered<'a> {
    pub(super) done: Vec<(&'a str, &'a Replay)>,
    pub(super) classes: ClassSeries,
    pub(super) max_live: u64,
    /// The first event at the peak of live bytes, where the heap maps are drawn.
    pub(super) peak_event: usize,
    /// Each replayed policy's heap just after `peak_event`, in `done`'s order (none for an
    /// empty trace).
    pub(super) heaps: Vec<(Box<dyn Policy>, Counters)>,
}

/// Writes the report's tables and charts into `args.out`, all replacing their outputs together.
pub(super) fn write_report(args: &ReportArgs, size: (u32, u32), g: &Gathered<'_>) -> Result<()> {
    let (w, h) = size;
    let done = &g.done;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let title = args.file.file_name().map_or_else(
        || args.file.display().to_string(),
        |f| f.to_string_lossy().into_owned(),
    );

    // Every file goes to a temporary file first; all replace their outputs together at the
    // end, so a failure part way leaves the folder as it was.
    let mut out = Outputs::new(&args.file);
    let tables = [
        ("summary", summary_frame(done, g.max_live)?),
        ("timeline", timeline_frame(done)?),
        ("classes", classes_frame(&g.classes)?),
    ];
    for (name, mut df) in tables {
        write_csv(&mut df, &out.start(&args.out.join(format!("{name}.csv")))?)?;
        if args.parquet {
            let path = out.start(&args.out.join(format!("{name}.parquet")))?;
            let meta = crate::parquet_out::metadata(name, Some(&args.file));
            crate::parquet_out::write_to_temporary(&path, &df, meta)?;
        }
    }

    register_fonts()?;
    chart_timeline(
        &out.start(&args.out.join("timeline.png"))?,
        (w, h),
        &title,
        done,
    )?;
    chart_fragmentation(
        &out.start(&args.out.join("fragmentation.png"))?,
        (w, h),
        &title,
        done,
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
        let heap = super::report_heapmap::Heap {
            policy: policy.as_ref(),
            counters,
            event: g.peak_event,
        };
        super::report_heapmap::chart_heapmap(&path, (w, h), &title, name, &heap)?;
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
    /// write instead.
    fn start(&mut self, path: &Path) -> Result<PathBuf> {
        let (pending, _file) = PendingFile::create(path, &[self.input])?;
        let tmp = pending.tmp_path().to_path_buf();
        self.pending.push((path.to_path_buf(), pending));
        Ok(tmp)
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

fn write_csv(df: &mut DataFrame, path: &Path) -> Result<PathBuf> {
    let file =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let written = CsvWriter::new(file).include_header(true).finish(df);
    anyhow::Context::with_context(written, || format!("writing {}", path.display()))?;
    Ok(path.to_path_buf())
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

fn summary_frame(done: &[(&str, &Replay)], max_live: u64) -> Result<DataFrame> {
    let s = |f: fn(&Replay) -> u64| done.iter().map(|(_, r)| f(r)).collect::<Vec<u64>>();
    let fl = |f: fn(&Replay) -> f64| done.iter().map(|(_, r)| f(r)).collect::<Vec<f64>>();
    let ratio: Vec<f64> = done
        .iter()
        .map(|(_, r)| {
            if max_live == 0 {
                0.0
            } else {
                r.summary.peak_footprint_bytes as f64 / max_live as f64
            }
        })
        .collect();
    let names: Vec<&str> = done.iter().map(|(n, _)| *n).collect();
    Ok(DataFrame::new(
        done.len(),
        vec![
            Column::new("name".into(), names),
            Column::new(
                "peak_footprint_bytes".into(),
                s(|r| r.summary.peak_footprint_bytes),
            ),
            Column::new(
                "final_footprint_bytes".into(),
                s(|r| r.summary.final_footprint_bytes),
            ),
            Column::new("peak_live_bytes".into(), s(|r| r.summary.peak_live_bytes)),
            Column::new(
                "peak_allocated_bytes".into(),
                s(|r| r.summary.peak_allocated_bytes),
            ),
            Column::new(
                "fragmentation_at_peak".into(),
                fl(|r| r.summary.fragmentation_at_peak),
            ),
            Column::new(
                "mean_fragmentation".into(),
                fl(|r| r.summary.mean_fragmentation),
            ),
            Column::new("footprint_over_max_live".into(), ratio),
            Column::new("ooms".into(), s(|r| r.summary.oom_count)),
            Column::new(
                "events_per_second".into(),
                fl(|r| r.summary.events_per_second),
            ),
        ],
    )?)
}

/// Every bucket of every replay's series: bytes as the bucket's maximum (peaks survive),
/// fractions as the value after the bucket's last event. The charts draw the same values.
/// Every policy's series, one row per policy and time bucket (what `compare --parquet` writes
/// too).
pub(crate) fn timeline_frame(done: &[(&str, &Replay)]) -> Result<DataFrame> {
    let mut policy = Vec::new();
    let mut t_s = Vec::new();
    let mut live = Vec::new();
    let mut allocated = Vec::new();
    let mut footprint = Vec::new();
    let mut frag = Vec::new();
    let mut ext = Vec::new();
    for (name, r) in done {
        let s = &r.series;
        let t0 = s.bucketing.t0_ns;
        for b in 0..s.len() {
            policy.push(*name);
            t_s.push((s.bucketing.start_ns(b) - t0) as f64 / 1e9);
            let g = |v: &Vec<u64>| v.get(b).copied().unwrap_or(0);
            let f = |v: &Vec<f64>| v.get(b).copied().unwrap_or(0.0);
            live.push(g(&s.live_bytes.max));
            allocated.push(g(&s.allocated_bytes.max));
            footprint.push(g(&s.footprint_bytes.max));
            frag.push(f(&s.fragmentation.last));
            ext.push(f(&s.external_fragmentation.last));
        }
    }
    let n = policy.len();
    Ok(DataFrame::new(
        n,
        vec![
            Column::new("policy".into(), policy),
            Column::new("t_s".into(), t_s),
            Column::new("live_bytes".into(), live),
            Column::new("allocated_bytes".into(), allocated),
            Column::new("footprint_bytes".into(), footprint),
            Column::new("fragmentation".into(), frag),
            Column::new("external_fragmentation".into(), ext),
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

pub(crate) fn register_fonts() -> Result<()> {
    plotters::style::register_font(
        "sans-serif",
        FontStyle::Normal,
        epaint_default_fonts::UBUNTU_LIGHT,
    )
    .map_err(|_| anyhow!("the embedded chart font is invalid"))?;
    plotters::style::register_font(
        "monospace",
        FontStyle::Normal,
        epaint_default_fonts::HACK_REGULAR,
    )
    .map_err(|_| anyhow!("the embedded chart font is invalid"))?;
    Ok(())
}

pub(crate) fn plot_err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing a chart: {e:?}")
}

/// Bytes in MiB for axes (charts label their unit).
fn mib(b: u64) -> f64 {
    b as f64 / f64::from(1u32 << 20)
}

fn chart_timeline(
    path: &Path,
    size: (u32, u32),
    title: &str,
    done: &[(&str, &Replay)],
) -> Result<PathBuf> {
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let span_s = done
        .first()
        .map_or(1.0, |(_, r)| r.series.bucketing.span_ns as f64 / 1e9);
    let all = || {
        done.iter()
            .flat_map(|(_, r)| {
                r.series
                    .footprint_bytes
                    .max
                    .iter()
                    .chain(&r.series.live_bytes.max)
            })
            .copied()
    };
    let y_max = all().max().unwrap_or(1).max(1);
    let smallest_peak = done
        .iter()
        .map(|(_, r)| {
            r.summary
                .peak_footprint_bytes
                .max(r.summary.peak_live_bytes)
        })
        .filter(|&b| b > 0)
        .min()
        .unwrap_or(1);
    // Policies can differ by orders of magnitude (a 64 MiB buddy arena beside a 300 KiB
    // heap): then a log scale keeps every line readable.
    let log = y_max / smallest_peak.max(1) > 20;
    let to_y = |b: u64| {
        if log {
            (b.max(1) as f64).log10()
        } else {
            mib(b)
        }
    };
    let (y_lo, y_hi) = if log {
        let lo = all().filter(|&b| b > 0).min().unwrap_or(1);
        ((lo as f64).log10().floor(), (y_max as f64).log10() + 0.15)
    } else {
        (0.0, mib(y_max) * 1.08)
    };
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{title}: live bytes and each policy's footprint"),
            ("sans-serif", 26),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(90)
        .build_cartesian_2d(0.0..span_s.max(1e-9), y_lo..y_hi)
        .map_err(plot_err)?;
    let y_fmt = |v: &f64| {
        if log {
            format::bytes(10f64.powf(*v).round() as u64)
        } else {
            format!("{v:.1}")
        }
    };
    chart
        .configure_mesh()
        .x_desc("time since the first event (s)")
        .y_desc(if log {
            "bytes (log scale)"
        } else {
            "bytes (MiB)"
        })
        .y_label_formatter(&y_fmt)
        .label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 18))
        .draw()
        .map_err(plot_err)?;
    let xs = |r: &Replay| -> Vec<f64> {
        (0..r.series.len())
            .map(|b| (r.series.bucketing.start_ns(b) - r.series.bucketing.t0_ns) as f64 / 1e9)
            .collect()
    };
    if let Some((_, r)) = done.first() {
        let x = xs(r);
        chart
            .draw_series(LineSeries::new(
                x.iter()
                    .zip(&r.series.live_bytes.max)
                    .map(|(&x, &y)| (x, to_y(y))),
                ShapeStyle::from(&BLACK).stroke_width(2),
            ))
            .map_err(plot_err)?
            .label("live bytes (requested)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(2)));
    }
    for (i, (name, r)) in done.iter().enumerate() {
        let color = rgb(theme::series(i + 1));
        let x = xs(r);
        chart
            .draw_series(LineSeries::new(
                x.iter()
                    .zip(&r.series.footprint_bytes.max)
                    .map(|(&x, &y)| (x, to_y(y))),
                ShapeStyle::from(&color).stroke_width(2),
            ))
            .map_err(plot_err)?
            .label(format!(
                "{name} footprint (peak {})",
                format::bytes(r.summary.peak_footprint_bytes)
            ))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 16))
        .draw()
        .map_err(plot_err)?;
    root.present().map_err(plot_err)?;
    Ok(path.to_path_buf())
}

fn chart_fragmentation(
    path: &Path,
    size: (u32, u32),
    title: &str,
    done: &[(&str, &Replay)],
) -> Result<PathBuf> {
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let span_s = done
        .first()
        .map_or(1.0, |(_, r)| r.series.bucketing.span_ns as f64 / 1e9);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{title}: fragmentation = 1 - live / footprint"),
            ("sans-serif", 26),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..span_s.max(1e-9), 0.0..100.0)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("time since the first event (s)")
        .y_desc("fragmentation (%)")
        .label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 18))
        .draw()
        .map_err(plot_err)?;
    for (i, (name, r)) in done.iter().enumerate() {
        let color = rgb(theme::series(i + 1));
        let s = &r.series;
        let pts: Vec<(f64, f64)> = (0..s.len())
            .filter(|&b| s.event_count.get(b).copied().unwrap_or(0) > 0)
            .map(|b| {
                (
                    (s.bucketing.start_ns(b) - s.bucketing.t0_ns) as f64 / 1e9,
                    100.0 * s.fragmentation.last.get(b).copied().unwrap_or(0.0),
                )
            })
            .collect();
        chart
            .draw_series(LineSeries::new(
                pts,
                ShapeStyle::from(&color).stroke_width(2),
            ))
            .map_err(plot_err)?
            .label(format!(
                "{name} (mean {:.1}%, at peak {:.1}%)",
                100.0 * r.summary.mean_fragmentation,
                100.0 * r.summary.fragmentation_at_peak
            ))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 16))
        .draw()
        .map_err(plot_err)?;
    root.present().map_err(plot_err)?;
    Ok(path.to_path_buf())
}

fn chart_classes(path: &Path, size: (u32, u32), title: &str, c: &ClassSeries) -> Result<PathBuf> {
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let buckets = c.buckets();
    let mut used = [false; NUM_SIZE_CLASSES];
    let mut max = 1u64;
    for b in 0..buckets {
        if let Some(row) = c.live_bytes_peak(b) {
            for (k, &v) in row.iter().enumerate() {
                if v > 0 {
                    if let Some(u) = used.get_mut(k) {
                        *u = true;
                    }
                    max = max.max(v);
                }
            }
        }
    }
    let lo = used.iter().position(|&u| u).unwrap_or(0) as u32;
    let hi = used.iter().rposition(|&u| u).unwrap_or(0) as u32 + 1;
    let span_s = c.bucketing.span_ns as f64 / 1e9;
    let (plot_area, bar_area) = root.split_horizontally(size.0.saturating_sub(140));
    let mut chart = ChartBuilder::on(&plot_area)
        .caption(
            format!("{title}: live bytes per size class over time"),
            ("sans-serif", 26),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(150)
        .build_cartesian_2d(0.0..span_s.max(1e-9), lo..hi)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .disable_mesh()
        .x_desc("time since the first event (s)")
        .y_desc("size class (request bit length)")
        .y_label_formatter(&|k| {
            format!(
                "{k}: {}",
                format::class_range(u8::try_from(*k).unwrap_or(0))
            )
        })
        .y_labels(usize::try_from(hi - lo).unwrap_or(1).min(24))
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 18))
        .draw()
        .map_err(plot_err)?;
    let log_max = (max as f64).ln_1p();
    let dt = span_s / buckets.max(1) as f64;
    let cells = (0..buckets).flat_map(|b| {
        let row = c
            .live_bytes_peak(b)
            .map(<[u64]>::to_vec)
            .unwrap_or_default();
        let x0 = b as f64 * dt;
        (lo..hi).filter_map(move |k| {
            let v = row.get(k as usize).copied().unwrap_or(0);
            (v > 0).then(|| {
                let t = (v as f64).ln_1p() / log_max;
                Rectangle::new([(x0, k), (x0 + dt, k + 1)], rgb(theme::heat(t)).filled())
            })
        })
    });
    chart.draw_series(cells).map_err(plot_err)?;
    // A colour bar: what the shades mean.
    let bar = bar_area.margin(60, 60, 10, 40);
    let (_, bh) = bar.dim_in_pixel();
    for y in 0..bh {
        let t = 1.0 - f64::from(y) / f64::from(bh.max(1));
        bar.draw(&Rectangle::new(
            [(0, y as i32), (20, y as i32 + 1)],
            rgb(theme::heat(t)).filled(),
        ))
        .map_err(plot_err)?;
    }
    let style = ("sans-serif", 14).into_font();
    bar.draw(&Text::new(format::bytes(max), (24, 0), style.clone()))
        .map_err(plot_err)?;
    bar.draw(&Text::new("1 B", (24, bh as i32 - 14), style.clone()))
        .map_err(plot_err)?;
    bar.draw(&Text::new("(log)", (24, bh as i32 / 2), style))
        .map_err(plot_err)?;
    root.present().map_err(plot_err)?;
    Ok(path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;
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
                summary_frame(&done, max_live_bytes(&view)).unwrap(),
            ),
            ("timeline", timeline_frame(&done).unwrap()),
            ("classes", classes_frame(&classes).unwrap()),
        ] {
            assert!(df.height() > 0, "{name} is empty");
            let file = dir.join(format!("{name}.csv"));
            write_csv(&mut df, &file).unwrap();
            let back = read_csv(&file, df.schema().clone()).unwrap();
            assert_eq!(back.shape(), df.shape(), "{name}");
            assert!(
                back.equals_missing(&df),
                "{name} differs after a round trip:\n{df}\n{back}"
            );
        }
        // The summary holds the replays' exact figures.
        let summary = summary_frame(&done, max_live_bytes(&view)).unwrap();
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
