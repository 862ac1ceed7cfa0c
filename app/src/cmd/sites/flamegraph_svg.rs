//! A self-contained SVG flame graph from folded stacks (`outer;...;inner value`): the root at
//! the bottom, each frame as wide as its share, a tooltip per frame (`<title>`), no script.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::format;

/// One node of the merged stack tree.
#[derive(Default)]
struct Node {
    value: u64,
    children: BTreeMap<String, Node>,
}

/// Stacks can be tens of thousands of frames deep (a recursion in the traced program, or a
/// hostile file): the tree is freed from a list, not by the default drop's recursion, which
/// would overflow the thread's stack.
impl Drop for Node {
    fn drop(&mut self) {
        let mut pending: Vec<Node> = std::mem::take(&mut self.children).into_values().collect();
        while let Some(mut node) = pending.pop() {
            pending.extend(std::mem::take(&mut node.children).into_values());
        }
    }
}

const WIDTH: f64 = 1200.0;
const ROW: f64 = 17.0;
const TOP: f64 = 40.0;
/// Frames narrower than this are not drawn (their share stays in the parent).
const MIN_WIDTH: f64 = 0.3;

/// Renders `folded` lines. `bytes` formats values as sizes, otherwise as counts.
#[must_use]
pub fn render(folded: &[String], title: &str, bytes: bool) -> String {
    let mut root = Node::default();
    for line in folded {
        let Some((stack, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<u64>() else {
            continue;
        };
        root.value += value;
        let mut node = &mut root;
        for frame in stack.split(';') {
            node = node.children.entry(frame.to_owned()).or_default();
            node.value += value;
        }
    }
    let depth = max_depth(&root);
    let height = TOP + ROW * (depth as f64 + 1.0) + 10.0;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="monospace" font-size="11">"#
    );
    let _ = write!(
        svg,
        r##"<rect width="100%" height="100%" fill="#f8f8f4"/><text x="{}" y="20" text-anchor="middle" font-size="15">{}</text>"##,
        WIDTH / 2.0,
        escape(title)
    );
    let label = |v: u64| {
        if bytes {
            format::bytes(v)
        } else {
            format::count(v)
        }
    };
    let total = root.value.max(1);
    let _ = write!(
        svg,
        r##"<text x="10" y="34" fill="#555">total {}; hover a frame for its share</text>"##,
        escape(&label(root.value))
    );
    draw(&mut svg, "all", &root, total, height, &label);
    svg.push_str("</svg>\n");
    svg
}

/// Frames below the root on the deepest path, walked from a list (see [`Node`]'s drop).
fn max_depth(root: &Node) -> usize {
    let mut deepest = 0;
    let mut pending = vec![(root, 0usize)];
    while let Some((node, depth)) = pending.pop() {
        deepest = deepest.max(depth);
        pending.extend(node.children.values().map(|c| (c, depth + 1)));
    }
    deepest
}

/// Draws the tree below `root` (named `root_name`), each frame before its children and the
/// children in name order, walked from a list rather than by recursion (see [`Node`]'s drop).
fn draw(
    svg: &mut String,
    root_name: &str,
    root: &Node,
    total: u64,
    height: f64,
    label: &dyn Fn(u64) -> String,
) {
    let mut pending = vec![(root_name, root, 0.0, 0usize)];
    while let Some((name, node, x, depth)) = pending.pop() {
        if draw_frame(svg, name, node, x, depth, total, height, label) {
            // Reversed, so that the first child comes off the list first.
            let mut cx = x;
            let children: Vec<_> = node
                .children
                .iter()
                .map(|(child_name, child)| {
                    let at = cx;
                    cx += WIDTH * child.value as f64 / total as f64;
                    (child_name.as_str(), child, at, depth + 1)
                })
                .collect();
            pending.extend(children.into_iter().rev());
        }
    }
}

/// Draws one frame at `x`, `depth` rows above the bottom; false when it is too narrow to
/// draw, and so are its children.
#[allow(clippy::too_many_arguments)]
fn draw_frame(
    svg: &mut String,
    name: &str,
    node: &Node,
    x: f64,
    depth: usize,
    total: u64,
    height: f64,
    label: &dyn Fn(u64) -> String,
) -> bool {
    let w = WIDTH * node.value as f64 / total as f64;
    if w < MIN_WIDTH {
        return false;
    }
    let y = height - 10.0 - ROW * (depth as f64 + 1.0);
    let (r, g, b) = colour(name);
    let share = 100.0 * node.value as f64 / total as f64;
    let _ = write!(
        svg,
        r#"<g><title>{} ({}, {share:.2}%)</title><rect x="{x:.2}" y="{y:.1}" width="{w:.2}" height="{}" fill="rgb({r},{g},{b})" rx="2"/>"#,
        escape(name),
        escape(&label(node.value)),
        ROW - 1.0
    );
    // About 6.6 px a character at font-size 11.
    let chars = ((w - 6.0) / 6.6).floor();
    if chars >= 3.0 {
        let text: String = if name.chars().count() as f64 > chars {
            let keep = (chars as usize).saturating_sub(2);
            format!("{}..", name.chars().take(keep).collect::<String>())
        } else {
            name.to_owned()
        };
        let _ = write!(
            svg,
            r#"<text x="{:.2}" y="{:.1}">{}</text>"#,
            x + 3.0,
            y + ROW - 5.0,
            escape(&text)
        );
    }
    svg.push_str("</g>");
    true
}

/// A warm colour from the name, stable across runs.
fn colour(name: &str) -> (u8, u8, u8) {
    let h = name.bytes().fold(2_166_136_261u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(16_777_619)
    });
    (
        205 + (h % 50) as u8,
        (h >> 8) as u8 % 130 + 60,
        (h >> 16) as u8 % 55,
    )
}

/// `s` as XML text: markup escaped, and control characters (XML 1.0 forbids most; a function
/// name from a trace can hold any byte) replaced by U+FFFD as in every text output
/// ([`crate::format::trace_text`]), so the SVG stays well-formed.
fn escape(s: &str) -> String {
    crate::format::trace_text(s)
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_merge_and_widths_follow_values() {
        let folded = vec![
            "main;a;x 300".to_owned(),
            "main;a;y 100".to_owned(),
            "main;b<T> 600".to_owned(),
        ];
        let svg = render(&folded, "t", true);
        assert!(svg.starts_with("<svg"));
        assert!(
            svg.contains("<title>main (1000 B, 100.00%)</title>"),
            "{svg}"
        );
        assert!(svg.contains("<title>a (400 B, 40.00%)</title>"));
        assert!(svg.contains("<title>b&lt;T&gt; (600 B, 60.00%)</title>"));
        // `a` spans 40% of the width, `b<T>` starts where it ends.
        assert!(svg.contains(r#"width="480.00""#));
        assert!(svg.contains(r#"x="480.00""#));
    }

    /// A stack 100,000 frames deep renders, and is freed, without overflowing the test
    /// thread's stack (recursion over the frames did, with a SIGABRT).
    #[test]
    fn a_very_deep_stack_renders() {
        let frames: Vec<String> = (0..100_000).map(|i| format!("f{i}")).collect();
        let folded = vec![format!("{} 7", frames.join(";"))];
        let svg = render(&folded, "deep", false);
        assert!(svg.ends_with("</svg>\n"));
        assert!(svg.contains("<title>f99999 (7, 100.00%)</title>"));
    }

    /// A control character in a function name would make the SVG ill-formed XML.
    #[test]
    fn control_characters_do_not_reach_the_svg() {
        let folded = vec!["main;evil\u{1b}[31m\u{7}name 5".to_owned()];
        let svg = render(&folded, "t\u{0}", true);
        assert!(!svg.chars().any(|c| c.is_control() && c != '\n'), "{svg:?}");
        assert!(svg.contains("evil\u{fffd}[31m\u{fffd}name"));
    }
}
