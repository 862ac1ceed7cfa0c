//! The PNG of `spill --sweep`: spilled bytes and estimated I/O time against the limit, one
//! line per eviction policy, the OS swap baseline and (for bytes) the lower bound.

use std::path::Path;

use anyhow::Result;
use plotters::prelude::*;

use allocview_sim::spill::{OsSwapStats, SpillStats};

use crate::charts::{plot_err, register_fonts, rgb};
use crate::theme;

/// One line of a chart: label, colour, `(percent of peak live, value)` points.
type Line = (String, RGBColor, Vec<(f64, f64)>);

/// Draws the two charts side by side into `path`.
pub fn draw(path: &Path, title: &str, peak_live_bytes: u64, points: &[(u64, Point)]) -> Result<()> {
    register_fonts()?;
    let root = BitMapBackend::new(path, (1600, 700)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let (top, rest) = root.split_vertically(50);
    top.draw(&Text::new(
        format!(
            "{title}: spilling under a limit (peak live {}; limits where allocations failed are \
             left out)",
            crate::format::bytes(peak_live_bytes)
        ),
        (15, 12),
        ("sans-serif", 24).into_font(),
    ))
    .map_err(plot_err)?;
    let (left, right) = rest.split_horizontally(800);
    let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
    let evicts: Vec<_> = points
        .first()
        .map(|(_, p)| p.evictions.iter().map(|e| e.evict).collect())
        .unwrap_or_default();
    let mut bytes_lines: Vec<Line> = Vec::new();
    let mut time_lines: Vec<Line> = Vec::new();
    for (i, evict) in evicts.iter().enumerate() {
        let color = rgb(theme::series(i + 1));
        let pick = |f: &dyn Fn(&allocview_sim::spill::SpillStats) -> f64| {
            points
                .iter()
                .filter_map(|(pc, p)| {
                    // With failed allocations the figures leave data out: not comparable.
                    p.evictions
                        .iter()
                        .find(|e| e.evict == *evict && e.failed == 0)
                        .map(|e| (*pc as f64, f(e)))
                })
                .collect::<Vec<_>>()
        };
        bytes_lines.push((
            evict.name().to_owned(),
            color,
            pick(&|e| mib(e.spilled_bytes)),
        ));
        time_lines.push((
            evict.name().to_owned(),
            color,
            pick(&|e| e.estimated_io_seconds),
        ));
    }
    let os_color = rgb(theme::series(evicts.len() + 1));
    bytes_lines.push((
        "OS swap (4 KiB pages, LRU)".to_owned(),
        os_color,
        points
            .iter()
            .map(|(pc, p)| (*pc as f64, mib(p.os_swap.spilled_bytes)))
            .collect(),
    ));
    time_lines.push((
        "OS swap (4 KiB pages, LRU)".to_owned(),
        os_color,
        points
            .iter()
            .map(|(pc, p)| (*pc as f64, p.os_swap.estimated_io_seconds))
            .collect(),
    ));
    bytes_lines.push((
        "lower bound (peak live - limit)".to_owned(),
        BLACK,
        points
            .iter()
            .map(|(pc, p)| (*pc as f64, mib(p.lower_bound_bytes)))
            .collect(),
    ));
    chart(&left, "spilled bytes", "spilled (MiB)", &bytes_lines)?;
    chart(&right, "estimated I/O time", "seconds", &time_lines)?;
    root.present().map_err(plot_err)?;
    Ok(())
}

fn chart(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    caption: &str,
    y_desc: &str,
    lines: &[Line],
) -> Result<()> {
    let y_max = lines
        .iter()
        .flat_map(|(_, _, pts)| pts.iter().map(|p| p.1))
        .fold(0.0f64, f64::max)
        .max(1e-9);
    let x_lo = lines
        .iter()
        .flat_map(|(_, _, pts)| pts.iter().map(|p| p.0))
        .fold(100.0f64, f64::min);
    let mut c = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .build_cartesian_2d((x_lo - 2.0)..102.0, 0.0..y_max * 1.08)
        .map_err(plot_err)?;
    c.configure_mesh()
        .x_desc("limit (% of peak live bytes)")
        .y_desc(y_desc)
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .draw()
        .map_err(plot_err)?;
    for (label, color, pts) in lines {
        let color = *color;
        c.draw_series(LineSeries::new(
            pts.iter().copied(),
            ShapeStyle::from(&color).stroke_width(2),
        ))
        .map_err(plot_err)?
        .label(label.clone())
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        c.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(plot_err)?;
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .draw()
        .map_err(plot_err)?;
    Ok(())
}

/// All eviction policies and the baseline at one limit.
pub struct Point {
    pub limit_bytes: u64,
    pub lower_bound_bytes: u64,
    pub evictions: Vec<SpillStats>,
    pub os_swap: OsSwapStats,
}
