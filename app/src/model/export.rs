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

    let csv = series_csv(state, state.zoom)?;
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

/// The columns of [`series_csv`].
const SERIES_COLUMNS: [&str; 12] = [
    "policy",
    "bucket",
    "t_start_s",
    "first_event",
    "last_event",
    "live_bytes_max",
    "allocated_bytes_max",
    "footprint_bytes_max",
    "fragmentation_last",
    "external_fragmentation_last",
    "free_blocks_last",
    "ooms",
];

/// The buckets of every replayed policy inside `window` (fractions of the trace's time span)
/// as CSV, written by the `csv` crate: a variant's label can hold commas
/// (`pytorch:roundup_power2_divisions=[256:1,512:2]`) and is quoted then.
///
/// # Errors
/// When the CSV writer fails (it writes to memory, so only on a bug).
pub fn series_csv(state: &AppState, window: (f64, f64)) -> Result<String> {
    let mut csv = csv::Writer::from_writer(Vec::new());
    csv.write_record(SERIES_COLUMNS)?;
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
            csv.write_record([
                slot.name.clone(),
                b.to_string(),
                format!("{t:.9}"),
                s.first_event.get(b).copied().unwrap_or(0).to_string(),
                s.last_event.get(b).copied().unwrap_or(0).to_string(),
                g(&s.live_bytes.max).to_string(),
                g(&s.allocated_bytes.max).to_string(),
                g(&s.footprint_bytes.max).to_string(),
                format!("{:.6}", f(&s.fragmentation.last)),
                format!("{:.6}", f(&s.external_fragmentation.last)),
                g(&s.free_blocks.last).to_string(),
                g(&s.ooms).to_string(),
            ])?;
        }
    }
    let bytes = csv.into_inner().context("finishing the series CSV")?;
    String::from_utf8(bytes).context("the series CSV is not UTF-8")
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

    use std::path::Path;

    use allocview_sim::policy::config::PolicyConfig;
    use allocview_sim::policy::spec::PolicySpec;

    use super::series_csv;
    use crate::model::state::AppState;
    use crate::model::workers::load_blocking;

    /// A variant's label can hold commas (PyTorch's `roundup_power2_divisions=[256:1,...]`):
    /// the series CSV quotes it, so every row still has the header's 12 fields.
    #[test]
    fn series_csv_quotes_a_label_with_commas() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../sample-traces/find_usr_include.trace.gz");
        let label = "pytorch:roundup_power2_divisions=[256:1,512:2,>:8]";
        let specs = vec![
            PolicySpec::plain("first-fit"),
            PolicySpec::parse(label).unwrap(),
        ];
        let mut state = AppState::new(&path, &specs, PolicyConfig::default());
        load_blocking(&mut state, false, 2).unwrap();
        let text = series_csv(&state, (0.0, 1.0)).unwrap();
        let mut lines = text.lines();
        let header = lines.next().unwrap();
        assert_eq!(header.split(',').count(), 12);
        let variant_rows: Vec<&str> = lines.filter(|l| l.contains("roundup")).collect();
        assert!(!variant_rows.is_empty(), "{text}");
        for row in variant_rows {
            assert!(row.starts_with(&format!("\"{label}\",")), "{row}");
        }
    }
}
