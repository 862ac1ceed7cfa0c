//! `report`'s heap maps: a policy's heap at the peak of live bytes, drawn as cells.

use std::path::{Path, PathBuf};

use allocview_sim::heap::Counters;
use allocview_sim::policy::Policy;
use anyhow::Result;
use plotters::prelude::*;

use crate::charts::{plot_err, rgb};
use crate::format;
use crate::model::heapmap::{self, CellKind};
use crate::theme;

/// A policy's heap at one event, for its map.
pub(super) struct Heap<'a> {
    pub(super) policy: &'a dyn Policy,
    pub(super) counters: &'a Counters,
    pub(super) event: usize,
}

pub(super) fn chart_heapmap(
    path: &Path,
    size: (u32, u32),
    title: &str,
    name: &str,
    heap: &Heap<'_>,
) -> Result<PathBuf> {
    let (policy, counters, event) = (heap.policy, heap.counters, heap.event);
    let mut blocks = Vec::new();
    policy.blocks(&mut blocks);
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let (top, rest) = root.split_vertically(70);
    let (map_area, legend) = rest.split_vertically(size.1.saturating_sub(70 + 60));
    top.draw(&Text::new(
        format!(
            "{title}: {name} heap at the peak of live bytes (event {})",
            format::count(event as u64)
        ),
        (15, 10),
        ("sans-serif", 26).into_font(),
    ))
    .map_err(plot_err)?;
    top.draw(&Text::new(
        format!(
            "live {}, allocated {}, footprint {}, free {} in {} blocks, fragmentation {:.1}%",
            format::bytes(counters.live_bytes),
            format::bytes(counters.allocated_bytes),
            format::bytes(counters.footprint_bytes),
            format::bytes(counters.free_bytes),
            format::count(counters.free_blocks),
            100.0 * allocview_sim::metrics::fragmentation(counters)
        ),
        (15, 42),
        ("sans-serif", 18).into_font(),
    ))
    .map_err(plot_err)?;
    let (mw, mh) = map_area.dim_in_pixel();
    let cell = 6u32;
    let cols = (mw.saturating_sub(30) / cell).max(1);
    let rows = (mh.saturating_sub(10) / cell).max(1);
    let map = heapmap::rasterise(&blocks, (cols * rows) as usize);
    for (i, k) in map.cells.iter().enumerate() {
        let i = u32::try_from(i).unwrap_or(u32::MAX);
        let (x, y) = (15 + (i % cols) * cell, (i / cols) * cell);
        let color = match *k {
            CellKind::Empty => continue,
            CellKind::Selected => rgb(theme::SELECTED),
            CellKind::Free => RGBColor(0xd8, 0xdc, 0xe4),
            CellKind::Dead => rgb(theme::DEAD),
            CellKind::Waste => rgb(theme::WASTE),
            CellKind::Used { class } => rgb(theme::class(class)),
        };
        map_area
            .draw(&Rectangle::new(
                [
                    (x as i32, y as i32),
                    ((x + cell - 1) as i32, (y + cell - 1) as i32),
                ],
                color.filled(),
            ))
            .map_err(plot_err)?;
    }
    let style = ("sans-serif", 16).into_font();
    let mut x = 15i32;
    let swatches: [(RGBColor, String); 6] = [
        (RGBColor(0xd8, 0xdc, 0xe4), "free".to_owned()),
        (rgb(theme::WASTE), "internal waste".to_owned()),
        (rgb(theme::class(5)), "live 16-31 B".to_owned()),
        (rgb(theme::class(12)), "2-4 KiB".to_owned()),
        (rgb(theme::class(22)), "2-4 MiB".to_owned()),
        (rgb(theme::class(27)), "64-128 MiB".to_owned()),
    ];
    for (c, label) in swatches {
        legend
            .draw(&Rectangle::new([(x, 15), (x + 16, 31)], c.filled()))
            .map_err(plot_err)?;
        legend
            .draw(&Text::new(label.clone(), (x + 22, 15), style.clone()))
            .map_err(plot_err)?;
        x += 34 + 8 * i32::try_from(label.len()).unwrap_or(10);
    }
    legend
        .draw(&Text::new(
            format!(
                "one cell = {} of the {} held",
                format::bytes(map.bytes_per_cell),
                format::bytes(map.held_bytes)
            ),
            (x, 15),
            style,
        ))
        .map_err(plot_err)?;
    root.present().map_err(plot_err)?;
    Ok(path.to_path_buf())
}
