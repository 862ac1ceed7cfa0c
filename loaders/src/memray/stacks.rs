//! The stacks of a memray capture. Python frames come as pushes and pops on each thread's
//! stack (a code object and an instruction offset, named by the code object records);
//! native frames (`--native`) as a tree of return addresses that an allocation names by its
//! leaf, with the loaded images' segments to say which module each address is in. memray
//! names native frames by reading the modules' symbols when it reports; the capture holds
//! none, so here a native frame is its module and offset in it.

use std::collections::HashMap;

use super::linetable::line_of;
use crate::sites::{Frame, PYTHON_FRAMES_MODULE, StackTable};

/// One node of the native frame tree: a return address and the 1-based index of the frame
/// that called it (0 at the root).
#[derive(Clone, Copy)]
pub(super) struct NativeFrame {
    pub(super) ip: u64,
    pub(super) parent: u64,
}

/// The deepest native stack followed: deeper is a loop in a damaged tree.
const MAX_NATIVE_DEPTH: usize = 4096;

struct CodeObject {
    function: String,
    file: String,
    first_line: i32,
    table: Vec<u8>,
}

/// A loaded module: its path, load address and segments (virtual address, length).
struct Image {
    file: String,
    base: u64,
    segments: Vec<(u64, u64)>,
}

/// The threads' Python stacks as paths in a tree of (caller node, frame) nodes, so that an
/// allocation's stack is one node id and a stack is built once per distinct node.
pub(super) struct PythonStacks {
    python_version: i32,
    code_objects: HashMap<u64, CodeObject>,
    /// (code object, instruction offset) of each Python frame seen, by index.
    frame_keys: Vec<(u64, i64)>,
    frame_index: HashMap<(u64, i64), u32>,
    /// Node `i + 1` is `nodes[i]`: (parent node, frame index); node 0 is the empty stack.
    nodes: Vec<(u32, u32)>,
    node_index: HashMap<(u32, u32), u32>,
    threads: HashMap<u64, Vec<u32>>,
    pub(super) native: Vec<NativeFrame>,
    images: Vec<Image>,
    table: StackTable,
    /// (node, native leaf) -> stack id, for the current images.
    stack_cache: HashMap<(u32, u64), u32>,
}

impl PythonStacks {
    pub(super) fn new(python_version: i32) -> Self {
        Self {
            python_version,
            code_objects: HashMap::new(),
            frame_keys: Vec::new(),
            frame_index: HashMap::new(),
            nodes: Vec::new(),
            node_index: HashMap::new(),
            threads: HashMap::new(),
            native: Vec::new(),
            images: Vec::new(),
            table: StackTable::new(),
            stack_cache: HashMap::new(),
        }
    }

    pub(super) fn code_object(
        &mut self,
        id: u64,
        function: String,
        file: String,
        first_line: i32,
        table: Vec<u8>,
    ) {
        let code = CodeObject {
            function,
            file,
            first_line,
            table,
        };
        self.code_objects.insert(id, code);
    }

    /// A frame entered on thread `tid`. (memray's entry-frame flag only says where native
    /// and Python frames interleave, which needs the native frames' names: not kept.)
    pub(super) fn push(
        &mut self,
        tid: u64,
        code_object: u64,
        instruction_offset: i64,
        _entry: bool,
    ) {
        let key = (code_object, instruction_offset);
        let next_frame = u32::try_from(self.frame_keys.len()).unwrap_or(u32::MAX);
        let frame = *self.frame_index.entry(key).or_insert_with(|| {
            self.frame_keys.push(key);
            next_frame
        });
        let stack = self.threads.entry(tid).or_default();
        let parent = stack.last().copied().unwrap_or(0);
        let next_node = u32::try_from(self.nodes.len() + 1).unwrap_or(u32::MAX);
        let node = *self.node_index.entry((parent, frame)).or_insert_with(|| {
            self.nodes.push((parent, frame));
            next_node
        });
        stack.push(node);
    }

    /// `count` frames returned on thread `tid`; false when its stack held fewer (then it is
    /// emptied).
    pub(super) fn pop(&mut self, tid: u64, count: usize) -> bool {
        let stack = self.threads.entry(tid).or_default();
        let keep = stack.len().checked_sub(count);
        stack.truncate(keep.unwrap_or(0));
        keep.is_some()
    }

    /// A new set of loaded modules begins (memray writes them again after a `dlopen`).
    pub(super) fn clear_images(&mut self) {
        self.images.clear();
        self.stack_cache.clear();
    }

    pub(super) fn image(&mut self, file: String, base: u64, segments: Vec<(u64, u64)>) {
        self.images.push(Image {
            file,
            base,
            segments,
        });
        self.stack_cache.clear();
    }

    /// The stack of an allocation on thread `tid` whose native leaf is `native_leaf` (0:
    /// none): its native frames innermost first, then its Python frames innermost first.
    pub(super) fn stack_of(&mut self, tid: u64, native_leaf: u64) -> Option<u32> {
        let node = self
            .threads
            .get(&tid)
            .and_then(|s| s.last().copied())
            .unwrap_or(0);
        if node == 0 && native_leaf == 0 {
            return None;
        }
        if let Some(&id) = self.stack_cache.get(&(node, native_leaf)) {
            return Some(id);
        }
        let mut frames = Vec::new();
        let mut index = native_leaf;
        while index != 0 && frames.len() < MAX_NATIVE_DEPTH {
            let Some(f) = usize::try_from(index - 1)
                .ok()
                .and_then(|i| self.native.get(i).copied())
            else {
                break;
            };
            let (frame, module_offset) = self.native_frame(f.ip);
            let id = self.table.intern_frame(frame);
            if let Some(offset) = module_offset {
                self.table.set_module_offset(id, offset);
            }
            frames.push(id);
            index = f.parent;
        }
        let mut at = node;
        while let Some(&(parent, frame)) = at
            .checked_sub(1)
            .and_then(|i| self.nodes.get(usize::try_from(i).ok()?))
        {
            let frame = self.python_frame(frame);
            frames.push(self.table.intern_frame(frame));
            at = parent;
        }
        let id = self.table.intern_stack(frames);
        self.stack_cache.insert((node, native_leaf), id);
        Some(id)
    }

    fn python_frame(&self, frame: u32) -> Frame {
        let (code_id, offset) = usize::try_from(frame)
            .ok()
            .and_then(|i| self.frame_keys.get(i).copied())
            .unwrap_or((u64::MAX, 0));
        match self.code_objects.get(&code_id) {
            Some(code) => Frame {
                function: code.function.clone(),
                file: code.file.clone(),
                // memray shows line 0 where the table has no entry for the offset.
                line: line_of(self.python_version, &code.table, offset, code.first_line)
                    .unwrap_or(0),
                module: PYTHON_FRAMES_MODULE.to_owned(),
            },
            None => Frame {
                function: format!("<code object {code_id} not in the capture>"),
                file: String::new(),
                line: 0,
                module: PYTHON_FRAMES_MODULE.to_owned(),
            },
        }
    }

    /// The frame of return address `ip`, and its offset in its module when it is in one.
    fn native_frame(&self, ip: u64) -> (Frame, Option<u64>) {
        let image = self.images.iter().find(|im| {
            im.segments.iter().any(|&(vaddr, len)| {
                let start = im.base.wrapping_add(vaddr);
                ip >= start && ip - start < len
            })
        });
        match image {
            Some(im) => {
                let offset = ip.wrapping_sub(im.base);
                let frame = Frame {
                    function: format!("{offset:#x}"),
                    file: String::new(),
                    line: 0,
                    module: im.file.clone(),
                };
                (frame, Some(offset))
            }
            None => {
                let frame = Frame {
                    function: format!("{ip:#x}"),
                    file: String::new(),
                    line: 0,
                    module: String::new(),
                };
                (frame, None)
            }
        }
    }

    pub(super) fn into_table(self) -> StackTable {
        self.table
    }
}
