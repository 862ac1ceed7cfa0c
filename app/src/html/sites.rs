//! The page's sites: the top sites at the peak of live bytes with their stacks, and a flame
//! graph of the live bytes by stack, both capped so the page stays small.

use std::collections::BTreeMap;
use std::path::Path;

use allocview_loaders::Loaded;
use allocview_loaders::analysis::site_stats::{self, SiteRow};
use allocview_loaders::sites::StackTable;
use anyhow::Result;
use serde::Serialize;

use crate::answers::sites::{SiteMoment, SitesQuery, site_view};

/// Sites listed in the table (the rest are counted).
const TOP_SITES: usize = 200;
/// Frames kept of a stack (innermost first): past them a stack says little more.
const MAX_FRAMES: usize = 48;
/// Nodes of the flame graph; a node under a 2000th of the total is too narrow to see.
const MAX_FLAME_NODES: usize = 5_000;
/// Characters kept of a flame graph's frame name (a box never shows more).
const FLAME_NAME_CHARS: usize = 160;
/// Distinct frames the table holds (shared by the stacks), and characters kept of a frame's
/// function and file: a C++ template's name can run to thousands.
const MAX_TABLE_FRAMES: usize = 4_000;
const FRAME_TEXT_CHARS: usize = 400;
const FLAME_MIN_FRACTION: f64 = 1.0 / 2000.0;

/// The sites table.
#[derive(Debug, Serialize)]
pub struct Sites {
    /// What the sites are (`call stacks`, `TensorFlow operations`, `size classes`), and, with
    /// sampled stacks, that the figures are estimates.
    pub kind: String,
    pub at_event: Option<u64>,
    pub rows: Vec<Site>,
    /// The frames of the rows' stacks, each once.
    pub frames: Vec<Frame>,
    /// Sites with live bytes or allocations that the table leaves out.
    pub left_out: usize,
}

/// One site.
#[derive(Debug, Serialize)]
pub struct Site {
    pub name: String,
    pub live_bytes: u64,
    pub live_blocks: u64,
    pub alloc_count: u64,
    pub alloc_bytes: u64,
    /// Indices into [`Sites::frames`], innermost first.
    pub frames: Vec<u32>,
    /// Frames past [`MAX_FRAMES`] left out.
    pub frames_left_out: usize,
}

/// A stack frame.
#[derive(Debug, Serialize)]
pub struct Frame {
    pub function: String,
    pub file: String,
    pub line: i64,
    pub module: String,
    pub python: bool,
}

/// A node of the flame graph: a frame and the live bytes under it.
#[derive(Debug, Default, Serialize)]
pub struct FlameNode {
    pub n: String,
    pub v: u64,
    pub c: Vec<FlameNode>,
}

/// A row of `diff`'s sites table: a site's `[live bytes, allocations, bytes allocated]` in A
/// and in B.
#[derive(Debug, Serialize)]
pub struct SiteDiff {
    pub name: String,
    pub a: [u64; 3],
    pub b: [u64; 3],
}

/// The sites table and flame graph of `loaded` at its peak of live bytes (`None` for an
/// input with no allocations).
///
/// # Errors
/// When the sites cannot be read.
pub fn of(path: &Path, loaded: &Loaded) -> Result<(Option<Sites>, Option<FlameNode>)> {
    if crate::session::input::sites_of(loaded).is_none() {
        return Ok((None, None));
    }
    let query = SitesQuery {
        at: "peak".to_owned(),
        by: "stack".to_owned(),
        policy: None,
    };
    let v = site_view(path, &query, loaded)?;
    let flame = flame(&v.rows, &v.stacks);
    let listed: Vec<&SiteRow> = v
        .rows
        .iter()
        .filter(|r| r.live_bytes > 0 || r.alloc_count > 0)
        .collect();
    let mut table = FrameTable::default();
    let rows: Vec<Site> = listed
        .iter()
        .take(TOP_SITES)
        .map(|r| site(r, &v.stacks, &mut table))
        .collect();
    let sites = Sites {
        kind: site_stats::describe_sites(v.kind, v.stacks.sampling()),
        at_event: match v.moment {
            SiteMoment::Event { at, .. } => Some(at as u64),
            SiteMoment::Profile(_) => None,
        },
        left_out: listed.len().saturating_sub(rows.len()),
        rows,
        frames: table.frames,
    };
    Ok((Some(sites), Some(flame)))
}

/// The frames of the listed stacks, each once.
#[derive(Default)]
struct FrameTable {
    frames: Vec<Frame>,
    index: std::collections::HashMap<(String, String, i64, String), u32>,
}

impl FrameTable {
    /// `f`'s index, added if new; `None` when the table is full.
    fn index_of(&mut self, f: &allocview_loaders::sites::Frame) -> Option<u32> {
        let key = (f.function.clone(), f.file.clone(), f.line, f.module.clone());
        if let Some(&i) = self.index.get(&key) {
            return Some(i);
        }
        if self.frames.len() >= MAX_TABLE_FRAMES {
            return None;
        }
        let i = u32::try_from(self.frames.len()).ok()?;
        self.frames.push(Frame {
            function: cut(&f.function, FRAME_TEXT_CHARS),
            file: cut(&f.file, FRAME_TEXT_CHARS),
            line: f.line,
            module: cut(&f.module, FRAME_TEXT_CHARS),
            python: f.is_python(),
        });
        self.index.insert(key, i);
        Some(i)
    }
}

/// `text` cut to `chars` characters, marked with an ellipsis.
fn cut(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((at, _)) => format!("{}\u{2026}", &text[..at]),
        None => text.to_owned(),
    }
}

fn site(r: &SiteRow, stacks: &StackTable, table: &mut FrameTable) -> Site {
    let total = stacks.frames_of(r.stack).count();
    // Frames past the cap, or once the table is full, are left out (and counted).
    let frames: Vec<u32> = stacks
        .frames_of(r.stack)
        .take(MAX_FRAMES)
        .map_while(|f| table.index_of(f))
        .collect();
    Site {
        name: r.name.clone(),
        live_bytes: r.live_bytes,
        live_blocks: r.live_blocks,
        alloc_count: r.alloc_count,
        alloc_bytes: r.alloc_bytes,
        frames_left_out: total - frames.len(),
        frames,
    }
}

/// A tree under construction: children by frame name.
#[derive(Default)]
struct Tree {
    v: u64,
    c: BTreeMap<String, Tree>,
}

/// The flame graph of the rows' live bytes, outermost frame at the root.
fn flame(rows: &[SiteRow], stacks: &StackTable) -> FlameNode {
    let mut root = Tree::default();
    for r in rows.iter().filter(|r| r.live_bytes > 0) {
        let frames: Vec<String> = stacks.frames_of(r.stack).map(flame_name).collect();
        root.v += r.live_bytes;
        let mut node = &mut root;
        let path = if frames.is_empty() {
            vec![r.name.clone()]
        } else {
            frames
        };
        for name in path.into_iter().rev() {
            node = node.c.entry(name).or_default();
            node.v += r.live_bytes;
        }
    }
    let min_bytes = (root.v as f64 * FLAME_MIN_FRACTION) as u64;
    let mut budget = MAX_FLAME_NODES;
    prune("all".to_owned(), root, min_bytes, &mut budget)
}

fn flame_name(f: &allocview_loaders::sites::Frame) -> String {
    let name = if f.function.is_empty() {
        &f.module
    } else {
        &f.function
    };
    cut(name, FLAME_NAME_CHARS)
}

/// The node of `tree`, without children under `min_bytes` and with at most `budget` nodes,
/// widest first (breadth within each level by size).
fn prune(name: String, tree: Tree, min_bytes: u64, budget: &mut usize) -> FlameNode {
    *budget = budget.saturating_sub(1);
    let mut kids: Vec<(String, Tree)> = tree
        .c
        .into_iter()
        .filter(|(_, t)| t.v >= min_bytes.max(1))
        .collect();
    kids.sort_by_key(|k| std::cmp::Reverse(k.1.v));
    let mut c = Vec::new();
    for (n, t) in kids {
        if *budget == 0 {
            break;
        }
        c.push(prune(n, t, min_bytes, budget));
    }
    FlameNode {
        n: name,
        v: tree.v,
        c,
    }
}
