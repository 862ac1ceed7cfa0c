//! minimalloc's CSV (google/minimalloc `src/converter.cc`), read and written.
//!
//! The header row names the columns, in any order: `id`, `lower`, `upper`, `size` are
//! required, `alignment` (default 1), `offset` (a solution), `hint` and `gaps` are optional.
//! Lifetimes are half-open `[lower, upper)`. Aliases: `start` and `begin` for `lower`, `buffer`
//! and `buffer_id` for `id`; a header with `end` instead of `upper` (older files) makes the end
//! inclusive, so `upper = end + 1`. `hint` is ignored, as minimalloc's solver ignores it; `gaps`
//! (times inside the lifetime when the buffer needs less memory) is ignored too, which is
//! conservative: the buffer is planned as live throughout. allocview adds two optional columns
//! for overwrite specs, `parent` (the id of the buffer this one lives inside) and
//! `parent_offset` (where inside it), so a plan with overwrites survives a round trip through
//! `allocview plan --out`.
//!
//! Fields may be double-quoted (`"a,b"`, with `""` for a quote). Every parse error names the
//! line, the column, the field and what was expected.

use std::collections::HashMap;
use std::io::{self, Write};
use std::path::Path;
use std::time::Instant;

use allocview_sim::plan::Buffer;

use super::{FrameColumns, MemoryPlan, PlanFormat, PlanRow, rows_frame};
use crate::error::{LineError, LoadError};
use crate::events::{MAX_REPORTED_BAD_LINES, Strictness};
use crate::input::{StreamEnd, read_all};

/// What a header column means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    Id,
    Lower,
    Upper,
    /// `end`: inclusive.
    End,
    Size,
    Alignment,
    Offset,
    Parent,
    ParentOffset,
    Ignored,
}

fn field_of(name: &str) -> Option<Field> {
    Some(match name {
        "id" | "buffer" | "buffer_id" => Field::Id,
        "lower" | "start" | "begin" => Field::Lower,
        "upper" => Field::Upper,
        "end" => Field::End,
        "size" => Field::Size,
        "alignment" => Field::Alignment,
        "offset" => Field::Offset,
        "parent" => Field::Parent,
        "parent_offset" => Field::ParentOffset,
        "hint" | "gaps" => Field::Ignored,
        _ => return None,
    })
}

const KNOWN_COLUMNS: &str = "id, lower, upper, size, alignment, offset, hint, gaps, parent, \
                             parent_offset (aliases: buffer, buffer_id, start, begin; end for an \
                             inclusive upper)";

/// True when `line` is a minimalloc header: known names only, with an id, a size and both ends.
#[must_use]
pub fn is_header(line: &str) -> bool {
    let Ok(cells) = split_line(line) else {
        return false;
    };
    let fields: Option<Vec<Field>> = cells
        .iter()
        .map(|(_, c)| field_of(&c.trim().to_ascii_lowercase()))
        .collect();
    let Some(fields) = fields else { return false };
    let has = |f: Field| fields.contains(&f);
    has(Field::Id)
        && has(Field::Size)
        && has(Field::Lower)
        && (has(Field::Upper) || has(Field::End))
}

/// When `line` looks like a CSV header (comma-separated names) but is not a minimalloc one:
/// what is wrong with it (unknown columns with their byte column, required ones missing) and
/// the columns expected. `None` for a minimalloc header or a line that is no CSV header.
#[must_use]
pub fn header_problem(line: &str) -> Option<String> {
    let cells = split_line(line).ok()?;
    let name_like = |c: &str| {
        let c = c.trim();
        c.bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
            && c.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b' ')
    };
    if cells.len() < 2 || !cells.iter().all(|(_, c)| name_like(c)) || is_header(line) {
        return None;
    }
    let mut problems: Vec<String> = cells
        .iter()
        .filter(|(_, c)| field_of(&c.trim().to_ascii_lowercase()).is_none())
        .map(|(column, c)| format!("unknown column {:?} (column {column})", c.trim()))
        .collect();
    let fields: Vec<Field> = cells
        .iter()
        .filter_map(|(_, c)| field_of(&c.trim().to_ascii_lowercase()))
        .collect();
    for (ok, name) in [
        (fields.contains(&Field::Id), "id"),
        (fields.contains(&Field::Lower), "lower"),
        (
            fields.contains(&Field::Upper) || fields.contains(&Field::End),
            "upper (or end)",
        ),
        (fields.contains(&Field::Size), "size"),
    ] {
        if !ok {
            problems.push(format!("no {name} column"));
        }
    }
    Some(format!(
        "line 1 is not a minimalloc CSV header: {}; a header needs id, lower, upper (or end) and \
         size, and may name {KNOWN_COLUMNS}",
        problems.join(", ")
    ))
}

/// Splits one CSV line into `(1-based byte column, unquoted text)` cells.
fn split_line(line: &str) -> Result<Vec<(usize, String)>, usize> {
    let bytes = line.as_bytes();
    let mut cells = Vec::new();
    let mut i = 0usize;
    loop {
        let start = i;
        let mut cell = String::new();
        if bytes.get(i) == Some(&b'"') {
            i += 1;
            loop {
                match bytes.get(i) {
                    None => return Err(start + 1),
                    Some(b'"') if bytes.get(i + 1) == Some(&b'"') => {
                        cell.push('"');
                        i += 2;
                    }
                    Some(b'"') => {
                        i += 1;
                        break;
                    }
                    Some(_) => {
                        // Copy a whole UTF-8 character: `i` stays on char boundaries because
                        // quotes and commas are ASCII.
                        let rest = line.get(i..).unwrap_or("");
                        let ch = rest.chars().next().unwrap_or('\u{fffd}');
                        cell.push(ch);
                        i += ch.len_utf8().max(1);
                    }
                }
            }
            match bytes.get(i) {
                None | Some(b',') => {}
                Some(_) => return Err(i + 1),
            }
        } else {
            let end = bytes
                .get(i..)
                .and_then(|rest| rest.iter().position(|&b| b == b','))
                .map_or(bytes.len(), |p| i + p);
            cell.push_str(line.get(i..end).unwrap_or(""));
            i = end;
        }
        cells.push((start + 1, cell));
        if i >= bytes.len() {
            break;
        }
        // Skip the comma.
        i += 1;
        if i == bytes.len() {
            cells.push((i + 1, String::new()));
            break;
        }
    }
    Ok(cells)
}

/// What [`parse_minimalloc_csv`] found besides the rows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CsvSummary {
    /// The header had an `alignment` column.
    pub has_alignment: bool,
    /// The header had an `offset` column (a solution).
    pub has_offset: bool,
    /// The header used `end` (inclusive) instead of `upper`.
    pub inclusive_end: bool,
    /// Rows with a non-empty `gaps` field (planned as live throughout).
    pub rows_with_gaps: u64,
    /// Rows skipped in lenient mode, and the first few errors.
    pub bad_rows: u64,
    pub first_bad_rows: Vec<LineError>,
}

fn line_error(
    line: u64,
    column: usize,
    field: &'static str,
    expected: &'static str,
    found: &str,
) -> LineError {
    LineError {
        line,
        column,
        field,
        expected,
        found: found.chars().take(40).collect(),
    }
}

/// Parses minimalloc CSV text. `path` names the file in errors.
///
/// # Errors
/// [`LoadError::Format`] for a bad header (line 1's problem named), [`LoadError::Parse`] with
/// line, column, field and expectation for a bad row (strict mode; lenient mode skips it).
pub fn parse_minimalloc_csv(
    text: &str,
    path: &Path,
    strictness: Strictness,
) -> Result<(Vec<PlanRow>, CsvSummary), LoadError> {
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| ((i as u64) + 1, l.trim_end_matches('\r')));
    let Some((header_line, header)) = lines.find(|(_, l)| !l.trim().is_empty()) else {
        return Err(LoadError::format(
            path,
            "empty file: expected a minimalloc CSV header such as `id,lower,upper,size`",
        ));
    };
    let header = header.trim_start_matches('\u{feff}');
    let cells = split_line(header).map_err(|column| {
        LoadError::format(
            path,
            format!("line {header_line}, column {column}: unterminated quote in the header"),
        )
    })?;
    let mut fields = Vec::with_capacity(cells.len());
    for (column, name) in &cells {
        let lower = name.trim().to_ascii_lowercase();
        let Some(f) = field_of(&lower) else {
            return Err(LoadError::format(
                path,
                format!(
                    "line {header_line}, column {column}: unknown column {name:?}; expected \
                     {KNOWN_COLUMNS}"
                ),
            ));
        };
        if f != Field::Ignored && fields.contains(&f) {
            return Err(LoadError::format(
                path,
                format!("line {header_line}, column {column}: column {name:?} appears twice"),
            ));
        }
        fields.push(f);
    }
    let has = |f: Field| fields.contains(&f);
    let missing: Vec<&str> = [
        (Field::Id, "id"),
        (Field::Lower, "lower"),
        (Field::Size, "size"),
    ]
    .iter()
    .filter(|(f, _)| !has(*f))
    .map(|&(_, n)| n)
    .chain((!has(Field::Upper) && !has(Field::End)).then_some("upper"))
    .collect();
    if !missing.is_empty() {
        return Err(LoadError::format(
            path,
            format!(
                "line {header_line}: the header lacks the column(s) {}; expected at least \
                 `id,lower,upper,size` (or `id,start,end,size`)",
                missing.join(", ")
            ),
        ));
    }
    if has(Field::Upper) && has(Field::End) {
        return Err(LoadError::format(
            path,
            format!(
                "line {header_line}: the header has both `upper` (exclusive) and `end` \
                 (inclusive); keep one"
            ),
        ));
    }
    if has(Field::ParentOffset) && !has(Field::Parent) {
        return Err(LoadError::format(
            path,
            format!("line {header_line}: `parent_offset` needs a `parent` column"),
        ));
    }
    let gaps_col = cells
        .iter()
        .position(|(_, n)| n.trim().eq_ignore_ascii_case("gaps"));
    let mut summary = CsvSummary {
        has_alignment: has(Field::Alignment),
        has_offset: has(Field::Offset),
        inclusive_end: has(Field::End),
        ..CsvSummary::default()
    };
    let mut rows: Vec<PlanRow> = Vec::new();
    let mut seen: HashMap<String, u64> = HashMap::new();
    for (line_no, line) in lines {
        if line.trim().is_empty() {
            continue;
        }
        let parsed = parse_row(line_no, line, &fields, gaps_col, &seen);
        match parsed {
            Ok((row, has_gaps)) => {
                summary.rows_with_gaps += u64::from(has_gaps);
                seen.insert(row.id.clone(), line_no);
                rows.push(row);
            }
            Err(detail) => match strictness {
                Strictness::Strict => {
                    return Err(LoadError::Parse {
                        path: path.to_path_buf(),
                        detail,
                    });
                }
                Strictness::Lenient => {
                    summary.bad_rows += 1;
                    if summary.first_bad_rows.len() < MAX_REPORTED_BAD_LINES {
                        summary.first_bad_rows.push(detail);
                    }
                }
            },
        }
    }
    Ok((rows, summary))
}

fn parse_row(
    line_no: u64,
    line: &str,
    fields: &[Field],
    gaps_col: Option<usize>,
    seen: &HashMap<String, u64>,
) -> Result<(PlanRow, bool), LineError> {
    let cells = split_line(line).map_err(|column| {
        line_error(
            line_no,
            column,
            "row",
            "a closing double quote",
            line.get(column.saturating_sub(1)..).unwrap_or(""),
        )
    })?;
    if cells.len() != fields.len() {
        let column = cells.get(fields.len()).map_or(line.len() + 1, |c| c.0);
        return Err(line_error(
            line_no,
            column,
            "row",
            if cells.len() < fields.len() {
                "as many fields as the header (too few)"
            } else {
                "as many fields as the header (too many)"
            },
            line,
        ));
    }
    let mut row = PlanRow::new(String::new(), 0, 0, 0);
    let (mut lower, mut upper, mut end) = (None, None, None);
    let mut parent: Option<String> = None;
    let mut parent_offset = 0u64;
    let number = |column: usize, text: &str, field: &'static str| -> Result<u64, LineError> {
        text.trim()
            .parse::<u64>()
            .map_err(|_| line_error(line_no, column, field, "an unsigned decimal integer", text))
    };
    for (&f, (column, text)) in fields.iter().zip(&cells) {
        let column = *column;
        match f {
            Field::Id => {
                let id = text.trim();
                if id.is_empty() {
                    return Err(line_error(line_no, column, "id", "a buffer id", text));
                }
                if seen.contains_key(id) {
                    return Err(line_error(
                        line_no,
                        column,
                        "id",
                        "an id not used on an earlier line",
                        text,
                    ));
                }
                id.clone_into(&mut row.id);
            }
            Field::Lower => lower = Some(number(column, text, "lower")?),
            Field::Upper => upper = Some((column, number(column, text, "upper")?)),
            Field::End => end = Some((column, number(column, text, "end")?)),
            Field::Size => row.size_bytes = number(column, text, "size")?,
            Field::Alignment => {
                let a = if text.trim().is_empty() {
                    1
                } else {
                    number(column, text, "alignment")?
                };
                if !a.is_power_of_two() {
                    return Err(line_error(
                        line_no,
                        column,
                        "alignment",
                        "a power of two (1, 2, 4, ...)",
                        text,
                    ));
                }
                row.align_bytes = a;
            }
            Field::Offset => row.planned_offset_bytes = Some(number(column, text, "offset")?),
            Field::Parent => {
                let p = text.trim();
                if !p.is_empty() {
                    parent = Some(p.to_owned());
                }
            }
            Field::ParentOffset => {
                if !text.trim().is_empty() {
                    parent_offset = number(column, text, "parent_offset")?;
                }
            }
            Field::Ignored => {}
        }
    }
    row.lower = lower.unwrap_or(0);
    row.upper = match (upper, end) {
        (Some((_, u)), _) => u,
        (None, Some((column, e))) => e.checked_add(1).ok_or_else(|| {
            line_error(
                line_no,
                column,
                "end",
                "an end below 2^64 - 1",
                &e.to_string(),
            )
        })?,
        (None, None) => 0,
    };
    if row.upper < row.lower {
        let (column, field) = match (upper, end) {
            (Some((c, _)), _) => (c, "upper"),
            (None, Some((c, _))) => (c, "end"),
            (None, None) => (1, "upper"),
        };
        return Err(line_error(
            line_no,
            column,
            field,
            "an end not before the start (lifetimes are [lower, upper))",
            &cells
                .iter()
                .find(|(c, _)| *c == column)
                .map_or(String::new(), |(_, t)| t.clone()),
        ));
    }
    row.overwrite = parent.map(|p| (p, parent_offset));
    let has_gaps = gaps_col
        .and_then(|g| cells.get(g))
        .is_some_and(|(_, t)| !t.trim().is_empty());
    Ok((row, has_gaps))
}

/// Loads a minimalloc CSV (plain or gzip).
///
/// # Errors
/// When the file cannot be read or does not parse (see [`parse_minimalloc_csv`]).
pub fn load_minimalloc_csv(path: &Path, strictness: Strictness) -> Result<MemoryPlan, LoadError> {
    let start = Instant::now();
    let (bytes, end) = read_all(path)?;
    let text = String::from_utf8(bytes).map_err(|e| {
        LoadError::format(
            path,
            format!(
                "not UTF-8 text (byte {} is invalid): expected a minimalloc CSV",
                e.utf8_error().valid_up_to()
            ),
        )
    })?;
    let (rows, summary) = parse_minimalloc_csv(&text, path, strictness)?;
    let mut notes = Vec::new();
    if let StreamEnd::Truncated(why) = end {
        notes.push(format!("the compressed stream is truncated ({why})"));
    }
    if summary.rows_with_gaps > 0 {
        notes.push(format!(
            "{} buffers have gaps, ignored: they are planned as live throughout",
            summary.rows_with_gaps
        ));
    }
    if summary.bad_rows > 0 {
        let first: Vec<String> = summary
            .first_bad_rows
            .iter()
            .map(ToString::to_string)
            .collect();
        notes.push(format!(
            "{} malformed rows skipped (first: {})",
            summary.bad_rows,
            first.join("; ")
        ));
    }
    let buffers = rows_frame(
        &rows,
        FrameColumns {
            align: summary.has_alignment,
        },
    )?;
    Ok(MemoryPlan {
        path: path.to_path_buf(),
        format: PlanFormat::MinimallocCsv,
        buffers,
        time_unit: "time point",
        notes,
        load_seconds: start.elapsed().as_secs_f64(),
    })
}

/// A CSV field, quoted when it holds a comma, a quote or surrounding spaces.
fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) || text.trim() != text {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_owned()
    }
}

/// Writes buffers (and a plan's offsets) as minimalloc CSV: `id,lower,upper,size`, then
/// `alignment` when a buffer is aligned, `parent,parent_offset` when one overwrites another, and
/// `offset` when `offsets` is given. minimalloc itself reads the file unless it has the overwrite
/// columns.
///
/// # Errors
/// A write error, or `InvalidInput` when `ids`, `buffers` and `offsets` differ in length.
pub fn write_minimalloc_csv(
    out: &mut dyn Write,
    ids: &[String],
    buffers: &[Buffer],
    offsets: Option<&[u64]>,
) -> io::Result<()> {
    if ids.len() != buffers.len() || offsets.is_some_and(|o| o.len() != buffers.len()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "ids, buffers and offsets differ in length",
        ));
    }
    let aligned = buffers.iter().any(|b| b.align_bytes != 1);
    let overwrites = buffers.iter().any(|b| b.overwrite.is_some());
    let mut header = String::from("id,lower,upper,size");
    if aligned {
        header.push_str(",alignment");
    }
    if overwrites {
        header.push_str(",parent,parent_offset");
    }
    if offsets.is_some() {
        header.push_str(",offset");
    }
    writeln!(out, "{header}")?;
    for (i, (id, b)) in ids.iter().zip(buffers).enumerate() {
        let mut line = format!("{},{},{},{}", csv_field(id), b.lower, b.upper, b.size_bytes);
        if aligned {
            line.push_str(&format!(",{}", b.align_bytes));
        }
        if overwrites {
            match b.overwrite {
                Some(ow) => {
                    let parent = ids.get(ow.parent).map_or("", String::as_str);
                    line.push_str(&format!(",{},{}", csv_field(parent), ow.offset_bytes));
                }
                None => line.push_str(",,"),
            }
        }
        if let Some(o) = offsets.and_then(|o| o.get(i)) {
            line.push_str(&format!(",{o}"));
        }
        writeln!(out, "{line}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_handles_quotes_and_empty_fields() {
        let cells = split_line(r#"a,"b,c",,"d""e""#).unwrap();
        let texts: Vec<&str> = cells.iter().map(|(_, t)| t.as_str()).collect();
        assert_eq!(texts, ["a", "b,c", "", "d\"e"]);
        let columns: Vec<usize> = cells.iter().map(|(c, _)| *c).collect();
        assert_eq!(columns, [1, 3, 9, 10]);
        assert_eq!(split_line("x,").unwrap().len(), 2);
        assert!(split_line(r#""open"#).is_err());
    }

    #[test]
    fn header_recognition() {
        assert!(is_header("id,lower,upper,size"));
        assert!(is_header("size,upper,lower,id,alignment,offset"));
        assert!(is_header("buffer,start,end,size"));
        assert!(!is_header("id,lower,size"));
        assert!(!is_header("0.000006\t1\t472\t0x558667a602c0"));
        assert!(!is_header("id,lower,upper,size,colour"));
    }

    #[test]
    fn csv_field_quotes_only_when_needed() {
        assert_eq!(csv_field("conv1"), "conv1");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
    }
}
