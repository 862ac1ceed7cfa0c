//! `e` in the explorer: what is on screen, to files a report or a bug can carry.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context as _, Result};

use super::heapmap::CellKind;
use super::state::{AppState, Mode};

/// Characters of the text heap map (also its legend).
pub fn cell_char(c: CellKind) -> char {
    match c {
        CellKind::Empty => ' ',
        CellKind::Selected => '#',
        CellKind::Free => '.',
        CellKind::Dead => 'x',
        CellKind::Waste => '~',
        CellKind::Used { class } => {
            const DIGITS: &[u8] =
                b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ@#$%&*+=";
            DIGITS
                .get(usize::from(class))
                .map_or('#', |&b| char::from(b))
        }
    }
}

/// Writes `<stem>-event<N>-series.csv` (the visible buckets of every replayed policy) and
/// `<stem>-event<N>-heap.txt` (the heap maps on screen) into `dir`.
///
/// # Errors
/// When nothing is loaded yet or a file cannot be written.
pub fn export_screen(state: &AppState, dir: &Path) -> Result<Vec<String>> {
    let data = state.data.as_ref().context("nothing is loaded yet")?;
    let stem = data
        .path
        .file_name()
        .map_or_else(|| "trace".to_owned(), |s| s.to_string_lossy().into_owned());
    let stem = stem
        .trim_end_matches(".gz")
        .trim_end_matches(".trace")
        .to_owned();
    let base = format!("{stem}-event{}", state.cursor);

    let csv = series_csv(state, state.zoom);
    let csv_path = dir.join(format!("{base}-series.csv"));
    crate::safe_write::write_bytes(&csv_path, csv.as_bytes(), &[&data.path])?;
    let txt = heap_text(state);
    let txt_path = dir.join(format!("{base}-heap.txt"));
    crate::safe_write::write_bytes(&txt_path, txt.as_bytes(), &[&data.path])?;
    Ok(vec![
        csv_path.display().to_string(),
        txt_path.display().to_string(),
    ])
}

/// The buckets of every replayed policy inside `window` (fractions of the trace's time span)
/// as CSV.
#[must_use]
pub fn series_csv(state: &AppState, window: (f64, f64)) -> String {
    let mut csv = String::from(
        "policy,bucket,t_start_s,first_event,last_event,live_bytes_max,allocated_bytes_max,\
         footprint_bytes_max,fragmentation_last,external_fragmentation_last,free_blocks_last,ooms\n",
    );
    let (zlo, zhi) = window;
    for slot in &state.policies {
        let Some(r) = slot.replay() else { continue };
        let s = &r.series;
        let len = s.len();
        let lo = ((zlo * len as f64).floor() as usize).min(len);
        let hi = ((zhi * len as f64).ceil() as usize).clamp(lo, len);
        for b in lo..hi {
            let t = (s.bucketing.start_ns(b) - s.bucketing.t0_ns) as f64 / 1e9;
            let g = |v: &Vec<u64>| v.get(b).copied().unwrap_or(0);
            let f = |v: &Vec<f64>| v.get(b).copied().unwrap_or(0.0);
            writeln!(
                csv,
                "{},{b},{t:.9},{},{},{},{},{},{:.6},{:.6},{},{}",
                slot.name,
                s.first_event.get(b).copied().unwrap_or(0),
                s.last_event.get(b).copied().unwrap_or(0),
                g(&s.live_bytes.max),
                g(&s.allocated_bytes.max),
                g(&s.footprint_bytes.max),
                f(&s.fragmentation.last),
                f(&s.external_fragmentation.last),
                g(&s.free_blocks.last),
                g(&s.ooms),
            )
            .ok();
        }
    }
    csv
}

/// The heap maps on screen as text (64 cells a row, one character a cell).
#[must_use]
pub fn heap_text(state: &AppState) -> String {
    let path = state.data.as_ref().map_or_else(
        || state.path.display().to_string(),
        |d| d.path.display().to_string(),
    );
    let mut txt = format!(
        "allocview heap maps of {} at event {}\nlegend: '.' free, '~' internal waste, 'x' dead, \
         digit/letter = size class of the live allocation (0-9, a=10, ...)\n\n",
        path, state.cursor
    );
    for (i, slot) in state.policies.iter().enumerate() {
        if state.mode == Mode::Single && i != state.selected {
            continue;
        }
        let Some(h) = state.heaps.get(i).and_then(Option::as_ref) else {
            continue;
        };
        let map = h.raster(0, h.held_bytes, 64 * 32);
        writeln!(
            txt,
            "{}: footprint {}, one cell = {} B",
            slot.name, h.counters.footprint_bytes, map.bytes_per_cell
        )
        .ok();
        for row in map.cells.chunks(64) {
            txt.extend(row.iter().map(|&c| cell_char(c)));
            txt.push('\n');
        }
        txt.push('\n');
    }
    txt
}
