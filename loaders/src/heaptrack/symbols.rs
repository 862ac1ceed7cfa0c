//! heaptrack's string, instruction-pointer and trace tables (`s`, `i` and `t` lines), and the
//! call stacks they make, interned into a [`StackTable`].
//!
//! An `i` line names one instruction pointer: its module, and the function, file and line it
//! is in, followed by the frames inlined at that address (innermost first, then outwards). A
//! `t` line is a node of heaptrack's call tree: an instruction pointer and the node of its
//! caller. A stack is the walk from a node to the root. Every index refers to a line already
//! read (heaptrack writes a string, an instruction pointer or a node before its first use),
//! which the reader checks line by line: a stack is then always built without error.

use crate::sites::{Frame, NO_STACK, StackTable};

use super::parse::{Fault, Fields};

/// Most frames of one stack (heaptrack unwinds at most 64 frames; inlined frames add some).
/// Deeper stacks keep their innermost frames.
const MAX_STACK_FRAMES: usize = 256;

/// Most frame ids all the stacks of a file may hold together (64 MiB of ids): a hostile file of
/// deep traces each named by an allocation would otherwise cost memory quadratic in its size.
/// Past it, stacks keep their innermost [`STACK_FRAMES_PAST_BUDGET`] frames.
const MAX_TOTAL_STACK_FRAMES: usize = 16 << 20;
const STACK_FRAMES_PAST_BUDGET: usize = 8;

/// The frames of one instruction pointer: `frames[start..start + len]`.
struct Ip {
    address: u64,
    module: u32,
    start: u32,
    len: u32,
}

/// One frame as the file names it: string indices (0: none) and a line.
#[derive(Clone, Copy)]
struct RawFrame {
    function: u32,
    file: u32,
    line: u32,
}

/// The tables read so far, and the stacks built from them.
#[derive(Default)]
pub(super) struct Symbols {
    /// String `i` (1-based in the file) is `strings[i - 1]`.
    strings: Vec<String>,
    ips: Vec<Ip>,
    raw_frames: Vec<RawFrame>,
    /// The interned id of each of `raw_frames` ([`NO_STACK`] until first used).
    frame_ids: Vec<u32>,
    /// Trace node `n` (1-based) is `(ip index, parent node)` at `traces[n - 1]`.
    traces: Vec<(u32, u32)>,
    /// The interned stack of each node ([`NO_STACK`] until first used).
    trace_stacks: Vec<u32>,
    pub stacks: StackTable,
    stack_frames: usize,
    /// Stacks cut to [`MAX_STACK_FRAMES`] or to the budget.
    pub stacks_cut: u64,
}

impl Symbols {
    pub fn add_string(&mut self, s: String) {
        self.strings.push(s);
    }

    /// A string index that names a string already read (0: none).
    fn string_index(&self, fields: &mut Fields<'_>, field: &'static str) -> Result<u32, Fault> {
        fields.index(
            field,
            self.strings.len(),
            "a string index already defined by an `s` line",
        )
    }

    /// `i <ip> <module> [<function> [<file> <line> [<function> <file> <line>]...]]`.
    pub fn add_ip(&mut self, fields: &mut Fields<'_>) -> Result<(), Fault> {
        let address = fields.hex("instruction pointer")?;
        let module = self.string_index(fields, "module")?;
        let start = self.raw_frames.len();
        let frame = |f: &mut Fields<'_>, s: &Self, function| -> Result<RawFrame, Fault> {
            let file = s.string_index(f, "file")?;
            let line = f.hex("line")?;
            Ok(RawFrame {
                function,
                file,
                line: u32::try_from(line).unwrap_or(u32::MAX),
            })
        };
        let mut frames = Vec::new();
        if !fields.is_empty() {
            let function = self.string_index(fields, "function")?;
            if fields.is_empty() {
                frames.push(RawFrame {
                    function,
                    file: 0,
                    line: 0,
                });
            } else {
                frames.push(frame(fields, self, function)?);
                while !fields.is_empty() {
                    let function = self.string_index(fields, "inlined function")?;
                    frames.push(frame(fields, self, function)?);
                }
            }
        }
        if frames.is_empty() {
            frames.push(RawFrame {
                function: 0,
                file: 0,
                line: 0,
            });
        }
        self.frame_ids
            .extend(std::iter::repeat_n(NO_STACK, frames.len()));
        self.raw_frames.extend(frames);
        self.ips.push(Ip {
            address,
            module,
            start: u32::try_from(start).unwrap_or(u32::MAX),
            len: u32::try_from(self.raw_frames.len() - start).unwrap_or(0),
        });
        Ok(())
    }

    /// `t <ip index> <parent node>`: the parent is a node already read (0: the root).
    pub fn add_trace(&mut self, fields: &mut Fields<'_>) -> Result<(), Fault> {
        let ip = fields.index(
            "instruction pointer index",
            self.ips.len(),
            "an index already defined by an `i` line",
        )?;
        let parent = fields.index(
            "parent trace",
            self.traces.len(),
            "a trace index already defined by a `t` line",
        )?;
        self.traces.push((ip, parent));
        self.trace_stacks.push(NO_STACK);
        Ok(())
    }

    /// The number of trace nodes read.
    pub fn num_traces(&self) -> usize {
        self.traces.len()
    }

    /// The stack of trace node `trace` (1-based; 0 or an unknown node: none), innermost first.
    pub fn stack_of(&mut self, trace: u32) -> Option<u32> {
        let slot = usize::try_from(trace).ok()?.checked_sub(1)?;
        match self.trace_stacks.get(slot) {
            Some(&id) if id != NO_STACK => return Some(id),
            Some(_) => {}
            None => return None,
        }
        let max = if self.stack_frames < MAX_TOTAL_STACK_FRAMES {
            MAX_STACK_FRAMES
        } else {
            STACK_FRAMES_PAST_BUDGET
        };
        let mut frames = Vec::new();
        let mut node = trace;
        let mut cut = false;
        while let Some(&(ip, parent)) = node
            .checked_sub(1)
            .and_then(|n| self.traces.get(n as usize))
        {
            for f in self.ip_frames(ip) {
                if frames.len() == max {
                    cut = true;
                    break;
                }
                frames.push(f);
            }
            // Parents precede their children, so the walk ends at the root.
            if cut || parent >= node {
                break;
            }
            node = parent;
        }
        self.stacks_cut += u64::from(cut);
        self.stack_frames += frames.len();
        let id = self.stacks.intern_stack(frames);
        if let Some(s) = self.trace_stacks.get_mut(slot) {
            *s = id;
        }
        Some(id)
    }

    /// The interned frames of instruction pointer `ip` (1-based), innermost first.
    fn ip_frames(&mut self, ip: u32) -> Vec<u32> {
        let Some(entry) = ip.checked_sub(1).and_then(|i| self.ips.get(i as usize)) else {
            return Vec::new();
        };
        let (address, module, start, len) = (entry.address, entry.module, entry.start, entry.len);
        let mut out = Vec::with_capacity(len as usize);
        for i in start as usize..(start + len) as usize {
            let (Some(&id), Some(&raw)) = (self.frame_ids.get(i), self.raw_frames.get(i)) else {
                break;
            };
            let id = if id == NO_STACK {
                let module_name = self.string(module);
                let frame = Frame {
                    // heaptrack's "<unresolved function> in MODULE", with the address kept.
                    function: match (self.string(raw.function), module_name.rsplit('/').next()) {
                        ("", Some(m)) if !m.is_empty() => format!("0x{address:x} in {m}"),
                        ("", _) => format!("0x{address:x}"),
                        (name, _) => name.to_owned(),
                    },
                    file: self.string(raw.file).to_owned(),
                    line: i64::from(raw.line),
                    module: module_name.to_owned(),
                };
                let id = self.stacks.intern_frame(frame);
                if let Some(slot) = self.frame_ids.get_mut(i) {
                    *slot = id;
                }
                id
            } else {
                id
            };
            out.push(id);
        }
        out
    }

    fn string(&self, index: u32) -> &str {
        index
            .checked_sub(1)
            .and_then(|i| self.strings.get(i as usize))
            .map_or("", String::as_str)
    }
}
