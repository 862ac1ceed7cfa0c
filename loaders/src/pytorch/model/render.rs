//! Settings values as short text, for reports: bounded in depth, in items and in bytes, since
//! a pickle can nest containers without end, make a list that holds itself, or share one long
//! string through the memo among thousands of items (a 10.8 KB file rendered to gigabytes).

use crate::pytorch::pickle::Val;

/// Containers nested deeper than this print as `...`.
const RENDER_DEPTH: u32 = 4;
/// Items printed per container; the rest are counted.
const RENDER_ITEMS: usize = 16;
/// Bytes of text one value renders to at most; a longer text is cut and ends with [`CUT`].
pub(super) const VALUE_TEXT_BYTES: usize = 1024;
/// Bytes of text all of a snapshot's settings values render to at most.
pub(super) const SETTINGS_TEXT_BYTES: usize = 64 << 10;
/// What ends a text cut at its byte limit.
pub(super) const CUT: &str = "... (cut)";

/// The text of `v`, at most `limit_bytes` long plus [`CUT`] when it was cut.
pub(super) fn render(v: Val<'_>, limit_bytes: usize) -> String {
    let mut text = Text {
        out: String::new(),
        limit_bytes,
        cut: false,
    };
    render_into(v, RENDER_DEPTH, &mut text);
    text.out
}

/// Text with a byte limit: what passes it is dropped and the text ends with [`CUT`].
struct Text {
    out: String,
    limit_bytes: usize,
    cut: bool,
}

impl Text {
    fn push(&mut self, s: &str) {
        if self.cut {
            return;
        }
        let room = self.limit_bytes.saturating_sub(self.out.len());
        if s.len() <= room {
            self.out.push_str(s);
            return;
        }
        let mut end = room;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.out.push_str(s.get(..end).unwrap_or(""));
        self.out.push_str(CUT);
        self.cut = true;
    }
}

fn render_into(v: Val<'_>, depth: u32, t: &mut Text) {
    if t.cut {
        return;
    }
    if let Some(s) = v.as_str() {
        return t.push(s);
    }
    if let Some(b) = v.as_bool() {
        return t.push(if b { "True" } else { "False" });
    }
    if let Some(i) = v.as_i64() {
        return t.push(&i.to_string());
    }
    if let Some(f) = v.as_f64() {
        return t.push(&f.to_string());
    }
    // Items are walked in place, the first RENDER_ITEMS only: a shared container of a million
    // items is not collected once per reference.
    let count = v.item_count().unwrap_or(0);
    if let Some(items) = v.dict_items() {
        if depth == 0 {
            return t.push("{...}");
        }
        t.push("{");
        for (i, (k, x)) in items.take(RENDER_ITEMS).enumerate() {
            if i > 0 {
                t.push(", ");
            }
            render_into(k, depth - 1, t);
            t.push(": ");
            render_into(x, depth - 1, t);
        }
        more(count, t);
        return t.push("}");
    }
    if let Some(seq) = v.seq() {
        if depth == 0 {
            return t.push("[...]");
        }
        t.push("[");
        for (i, x) in seq.take(RENDER_ITEMS).enumerate() {
            if i > 0 {
                t.push(", ");
            }
            render_into(x, depth - 1, t);
        }
        more(count, t);
        return t.push("]");
    }
    if v.is_none() {
        return t.push("None");
    }
    t.push(v.kind_name());
}

/// `, ... (N more)` after the items printed, when a container holds more.
fn more(count: usize, t: &mut Text) {
    if count > RENDER_ITEMS {
        t.push(&format!(", ... ({} more)", count - RENDER_ITEMS));
    }
}
