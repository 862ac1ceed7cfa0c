//! `report`'s charts: each policy's footprint and the live bytes over time, fragmentation over
//! time, and the live bytes by size class.

use std::path::{Path, PathBuf};

use allocview_sim::classes::ClassSeries;
use allocview_sim::trace::NUM_SIZE_CLASSES;
use anyhow::Result;
use plotters::prelude::*;

use super::write::Line;
use crate::charts::{plot_err, rgb};
use crate::format;
use crate::theme;

/// Bytes in MiB for axes (charts label their unit).
fn mib(b: u64) -> f64 {
    b as f64 / f64::from(1u32 << 20)
}

pub(super) fn chart_timeline(
    path: &Path,
    size: (u32, u32),
    title: &str,
    done: &[Line<'_>],
) -> Result<PathBuf> {
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let span_s = done
        .first()
        .map_or(1.0, |r| r.series.bucketing.span_ns as f64 / 1e9);
    let all = || {
        done.iter()
            .flat_map(|r| {
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
        .map(|r| {
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
    let xs = |r: &Line<'_>| -> Vec<f64> {
        (0..r.series.len())
            .map(|b| (r.series.bucketing.start_ns(b) - r.series.bucketing.t0_ns) as f64 / 1e9)
            .collect()
    };
    if let Some(r) = done.first() {
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
    for (i, r) in done.iter().enumerate() {
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
                "{} {} (peak {})",
                r.name,
                // A real allocator's footprint is its measured resident memory.
                if r.measured { "RSS" } else { "footprint" },
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

pub(super) fn chart_fragmentation(
    path: &Path,
    size: (u32, u32),
    title: &str,
    done: &[Line<'_>],
) -> Result<PathBuf> {
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let span_s = done
        .first()
        .map_or(1.0, |r| r.series.bucketing.span_ns as f64 / 1e9);
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
    for (i, r) in done.iter().enumerate() {
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
                "{} (mean {:.1}%, at peak {:.1}%)",
                r.name,
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

pub(super) fn chart_classes(
    path: &Path,
    size: (u32, u32),
    title: &str,
    c: &ClassSeries,
) -> Result<PathBuf> {
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
