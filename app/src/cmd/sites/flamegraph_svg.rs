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
    draw(&mut svg, "all", &root, 0.0, 0, total, height, &label);
    svg.push_str("</svg>\n");
    svg
}

fn max_depth(n: &Node) -> usize {
    n.children
        .values()
        .map(|c| 1 + max_depth(c))
        .max()
        .unwrap_or(0)
}

#[allow(clippy::too_many_arguments)]
fn draw(
    svg: &mut String,
    name: &str,
    node: &Node,
    x: f64,
    depth: usize,
    total: u64,
    height: f64,
    label: &dyn Fn(u64) -> String,
) {
    let w = WIDTH * node.value as f64 / total as f64;
    if w < MIN_WIDTH {
        return;
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
    let mut cx = x;
    for (child_name, child) in &node.children {
        draw(svg, child_name, child, cx, depth + 1, total, height, label);
        cx += WIDTH * child.value as f64 / total as f64;
    }
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

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
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
}
