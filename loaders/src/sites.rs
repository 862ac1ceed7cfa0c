//! Allocation sites: where in the program an allocation was asked for.
//!
//! A site is a call stack: for a PyTorch snapshot, the `frames` of a trace entry or block; for a
//! recorded malloc trace, the stack the tracer captured; for a TensorFlow memory log, the
//! operation (a one-frame stack). Stacks repeat millions of times, so they are interned twice:
//! each distinct frame once in the frames table, each distinct stack (a list of frame ids,
//! innermost first) once in the stacks table, and events and blocks carry only a `stack_id`.
//!
//! # The frames table
//!
//! | column | dtype | meaning |
//! |---|---|---|
//! | `frame_id` | UInt32 | dense 0-based id |
//! | `function` | String | function name as the source gave it (demangled where it was) |
//! | `file` | String | source file, `??` when unknown |
//! | `line` | Int64 | source line, 0 when unknown |
//! | `module` | String | shared object or module, empty when unknown; `[python]` for a Python frame |
//! | `python` | Boolean | a frame of Python code (function, file and line executing), recorded in a CPython interpreter |
//!
//! # The stacks table
//!
//! One row per frame of every stack: `stack_id` (UInt32), `depth` (UInt32, 0 = innermost) and
//! `frame_id` (UInt32). A stack of no frames has no rows; [`NO_STACK`] in an event's `stack_id`
//! column (null in the DataFrame) means no stack was recorded.

use std::collections::HashMap;

use polars::prelude::*;

use crate::analysis::sampling::StackSampling;

/// `stack_id` of an event without a recorded stack (null in the DataFrame).
pub const NO_STACK: u32 = u32::MAX;

/// One source location.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    pub function: String,
    pub file: String,
    pub line: i64,
    pub module: String,
}

/// The `module` of a Python frame (a function of the traced Python program, its file and
/// the line executing), as recorded in a CPython interpreter.
pub const PYTHON_FRAMES_MODULE: &str = "[python]";

/// The `module` of a PyTorch operator (`aten::conv2d`) in a profiler trace's stack: the
/// allocation's site is the innermost operator it happened in ([`StackTable::site_frame`]).
pub const OPERATOR_FRAMES_MODULE: &str = "[operator]";

impl Frame {
    /// A frame of Python code (not of native code).
    #[must_use]
    pub fn is_python(&self) -> bool {
        self.module == PYTHON_FRAMES_MODULE
    }
}

impl std::fmt::Display for Frame {
    /// `function (file:line)`, or the function alone when the line is unknown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.line > 0 {
            write!(f, "{} ({}:{})", self.function, self.file, self.line)
        } else {
            f.write_str(&self.function)
        }
    }
}

/// Interned frames and stacks.
#[derive(Clone, Debug, Default)]
pub struct StackTable {
    frames: Vec<Frame>,
    frame_ids: HashMap<Frame, u32>,
    stacks: Vec<Vec<u32>>,
    stack_ids: HashMap<Vec<u32>, u32>,
    /// The build id (hex) of each module that has one, by the module's path as frames name
    /// it: what a symbolizer elsewhere needs to find the same binary.
    build_ids: HashMap<String, String>,
    /// For frames of native code: the address in their module (the virtual address in the
    /// file, load bias removed) of the first location that gave the frame.
    module_offsets: HashMap<u32, u64>,
    /// How the stacks were sampled (`record --stack-sample`): only some allocations have one,
    /// and figures by site weigh them ([`crate::analysis::sampling`]). `None`: every
    /// allocation's stack was recorded.
    sampling: Option<StackSampling>,
}

impl StackTable {
    /// An empty table.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The id of `frame`, adding it when new.
    pub fn intern_frame(&mut self, frame: Frame) -> u32 {
        if let Some(&id) = self.frame_ids.get(&frame) {
            return id;
        }
        let id = u32::try_from(self.frames.len()).unwrap_or(NO_STACK);
        self.frames.push(frame.clone());
        self.frame_ids.insert(frame, id);
        id
    }

    /// The id of the stack made of `frame_ids` (innermost first), adding it when new.
    pub fn intern_stack(&mut self, frame_ids: Vec<u32>) -> u32 {
        if let Some(&id) = self.stack_ids.get(&frame_ids) {
            return id;
        }
        let id = u32::try_from(self.stacks.len()).unwrap_or(NO_STACK);
        self.stacks.push(frame_ids.clone());
        self.stack_ids.insert(frame_ids, id);
        id
    }

    /// Number of distinct stacks.
    #[must_use]
    pub fn num_stacks(&self) -> usize {
        self.stacks.len()
    }

    /// Number of distinct frames.
    #[must_use]
    pub fn num_frames(&self) -> usize {
        self.frames.len()
    }

    /// The frames of stack `id`, innermost first (empty for [`NO_STACK`] or an unknown id).
    pub fn frames_of(&self, id: u32) -> impl Iterator<Item = &Frame> + '_ {
        self.stacks
            .get(id as usize)
            .into_iter()
            .flatten()
            .filter_map(|&f| self.frames.get(f as usize))
    }

    /// The frame that names a stack's site: the innermost frame of the program's own code.
    ///
    /// Walking from the innermost frame, frames of the allocator and the runtimes are passed
    /// over (PyTorch's capture and caching allocator, ATen, the C library's allocation
    /// functions, the C++ standard allocators, CPython's C API). Preferred is a frame with a
    /// source line outside installed libraries (by file: `site-packages`, `dist-packages`,
    /// `/usr/lib`, generated `torchinductor` code; by module: a shared object installed under
    /// `/lib` or `/usr/lib`, such as the C library's thread start); failing that, the first
    /// frame outside installed libraries, with or without a line (a program built without
    /// debug information); failing that, the first frame not passed over; failing that, the
    /// innermost.
    ///
    /// A PyTorch profiler trace's stack with operators ([`OPERATOR_FRAMES_MODULE`]): its site
    /// is the innermost operator.
    ///
    /// A stack recorded in a CPython interpreter with Python frames is the Python program's:
    /// its site is among its Python frames, chosen the same way (the native frames inside the
    /// innermost Python frame are the interpreter's or an extension's, called by that line).
    #[must_use]
    pub fn site_frame(&self, id: u32) -> Option<&Frame> {
        // A profiler trace's stack: the operator the allocation happened in, whatever Python
        // frames called it.
        if let Some(op) = self
            .frames_of(id)
            .find(|f| f.module == OPERATOR_FRAMES_MODULE)
        {
            return Some(op);
        }
        let mut frames: Vec<&Frame> = self.frames_of(id).collect();
        if frames.iter().any(|f| f.is_python()) {
            frames.retain(|f| f.is_python());
        }
        let own = |f: &&&Frame| !is_runtime_frame(f) && !is_library_frame(f);
        frames
            .iter()
            .find(|f| own(f) && f.line > 0)
            .or_else(|| frames.iter().find(|f| own(f)))
            .or_else(|| frames.iter().find(|f| !is_runtime_frame(f)))
            .or_else(|| frames.first())
            .copied()
    }

    /// The frame ids of stack `id` from its site ([`Self::site_frame`]) outward: the frames
    /// inside it (the allocator's, the interpreter's) left out, as `sites` passes over them.
    #[must_use]
    pub fn from_site(&self, id: u32) -> &[u32] {
        let all = self.stack(id);
        let Some(site) = self.site_frame(id) else {
            return all;
        };
        let at = all
            .iter()
            .position(|&f| self.frame(f).is_some_and(|x| std::ptr::eq(x, site)))
            .unwrap_or(0);
        all.get(at..).unwrap_or(all)
    }

    /// A stack as lines of text for a reader: its site (`at function (file:line)`), then the
    /// frames with a source line outward from it, at most `max_lines` in all; the allocator's
    /// and interpreters' frames are left out (the frames table has them all). Empty for a
    /// stack without frames. `short_paths` keeps only each file's name (narrow panels).
    #[must_use]
    pub fn site_lines(&self, id: u32, max_lines: usize, short_paths: bool) -> Vec<String> {
        let Some(site) = self.site_frame(id) else {
            return Vec::new();
        };
        let show = |f: &Frame| {
            if short_paths && f.line > 0 {
                let name = f.file.rsplit(['/', '\\']).next().unwrap_or(&f.file);
                format!("{} ({name}:{})", f.function, f.line)
            } else {
                f.to_string()
            }
        };
        let mut out = vec![format!("at {}", show(site))];
        out.extend(
            self.from_site(id)
                .iter()
                .skip(1)
                .filter_map(|&f| self.frame(f))
                .filter(|f| f.line > 0)
                .take(max_lines.saturating_sub(1))
                .map(|f| format!("   {}", show(f))),
        );
        out
    }

    /// Says how the stacks were sampled (a trace's `stack_sample_bytes`).
    pub fn set_sampling(&mut self, sampling: Option<StackSampling>) {
        self.sampling = sampling;
    }

    /// How the stacks were sampled, when only some allocations have one.
    #[must_use]
    pub fn sampling(&self) -> Option<StackSampling> {
        self.sampling
    }

    /// Records the build id (hex) of the module at `path`.
    pub fn set_build_id(&mut self, path: &str, build_id_hex: String) {
        self.build_ids.insert(path.to_owned(), build_id_hex);
    }

    /// The build id (hex) of the module at `path`, when the input recorded one.
    #[must_use]
    pub fn build_id(&self, path: &str) -> Option<&str> {
        self.build_ids.get(path).map(String::as_str)
    }

    /// Records where in its module frame `id` was seen (the first such place is kept).
    pub fn set_module_offset(&mut self, id: u32, offset: u64) {
        self.module_offsets.entry(id).or_insert(offset);
    }

    /// The address in its module of frame `id`, for a frame of native code whose input
    /// recorded it.
    #[must_use]
    pub fn module_offset(&self, id: u32) -> Option<u64> {
        self.module_offsets.get(&id).copied()
    }

    /// Frame `id`.
    #[must_use]
    pub fn frame(&self, id: u32) -> Option<&Frame> {
        self.frames.get(id as usize)
    }

    /// Frame ids of stack `id`, innermost first.
    #[must_use]
    pub fn stack(&self, id: u32) -> &[u32] {
        self.stacks.get(id as usize).map_or(&[], Vec::as_slice)
    }

    /// The frames table (schema in the module docs).
    ///
    /// # Errors
    /// Only when polars fails to assemble the columns.
    pub fn frames_frame(&self) -> PolarsResult<DataFrame> {
        let n = self.frames.len();
        DataFrame::new_infer_height(vec![
            UInt32Chunked::from_vec("frame_id".into(), (0..n as u32).collect()).into_column(),
            Column::new(
                "function".into(),
                self.frames
                    .iter()
                    .map(|f| f.function.as_str())
                    .collect::<Vec<_>>(),
            ),
            Column::new(
                "file".into(),
                self.frames
                    .iter()
                    .map(|f| f.file.as_str())
                    .collect::<Vec<_>>(),
            ),
            Int64Chunked::from_vec("line".into(), self.frames.iter().map(|f| f.line).collect())
                .into_column(),
            Column::new(
                "module".into(),
                self.frames
                    .iter()
                    .map(|f| f.module.as_str())
                    .collect::<Vec<_>>(),
            ),
            Column::new(
                "python".into(),
                self.frames.iter().map(Frame::is_python).collect::<Vec<_>>(),
            ),
        ])
    }

    /// The stacks table (schema in the module docs).
    ///
    /// # Errors
    /// Only when polars fails to assemble the columns.
    pub fn stacks_frame(&self) -> PolarsResult<DataFrame> {
        let ids = (0..self.stacks.len()).map(|id| (id as u32, id as u32));
        self.stacks_frame_keyed(ids)
    }

    /// The stacks table with other keys: for each `(key, id)`, stack `id`'s rows under
    /// `stack_id` `key` (a file's own stack ids, say), in the order given.
    ///
    /// # Errors
    /// Only when polars fails to assemble the columns.
    pub fn stacks_frame_keyed(
        &self,
        keys: impl Iterator<Item = (u32, u32)>,
    ) -> PolarsResult<DataFrame> {
        let (mut stack_id, mut depth, mut frame_id) = (Vec::new(), Vec::new(), Vec::new());
        for (key, id) in keys {
            for (d, &f) in (0u32..).zip(self.stack(id)) {
                stack_id.push(key);
                depth.push(d);
                frame_id.push(f);
            }
        }
        DataFrame::new_infer_height(vec![
            UInt32Chunked::from_vec("stack_id".into(), stack_id).into_column(),
            UInt32Chunked::from_vec("depth".into(), depth).into_column(),
            UInt32Chunked::from_vec("frame_id".into(), frame_id).into_column(),
        ])
    }
}

/// Frames of the allocator or a runtime, never a site (see [`StackTable::site_frame`]).
fn is_runtime_frame(f: &Frame) -> bool {
    const PREFIXES: &[&str] = &[
        "torch::unwind",
        "torch::CapturedTraceback",
        "torch::cuda::",
        "c10::",
        "at::",
        "_Py",
        "Py",
        "malloc",
        "calloc",
        "realloc",
        "free",
        "operator new",
        "std::allocator",
        "std::__new_allocator",
        "__gnu_cxx::new_allocator",
        "__libc_",
        "_start",
    ];
    let name = f.function.as_str();
    name.is_empty() || PREFIXES.iter().any(|p| name.starts_with(p))
}

/// A frame of an installed library rather than the program's own code: by its source file,
/// or by its module (a shared object of the system's library directories).
fn is_library_frame(f: &Frame) -> bool {
    const MODULE_DIRS: &[&str] = &["/lib/", "/lib64/", "/usr/lib/", "/usr/lib64/"];
    is_library_file(&f.file) || MODULE_DIRS.iter().any(|d| f.module.starts_with(d))
}

/// Source files of installed libraries rather than the program's own code.
fn is_library_file(file: &str) -> bool {
    const PARTS: &[&str] = &[
        "site-packages",
        "dist-packages",
        "/usr/lib",
        "/lib/python",
        "torchinductor",
        "<frozen",
    ];
    PARTS.iter().any(|p| file.contains(p))
}

/// A `stack_id` column: [`NO_STACK`] becomes null, the slot keeping the sentinel.
#[must_use]
pub fn stack_id_column(name: &str, ids: Vec<u32>) -> Column {
    if ids.contains(&NO_STACK) {
        let validity: Vec<bool> = ids.iter().map(|&s| s != NO_STACK).collect();
        UInt32Chunked::from_vec_validity(name.into(), ids, Some(validity.into())).into_column()
    } else {
        UInt32Chunked::from_vec(name.into(), ids).into_column()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(f: &str, line: i64) -> Frame {
        Frame {
            function: f.to_owned(),
            file: "a.py".to_owned(),
            line,
            module: String::new(),
        }
    }

    #[test]
    fn frames_and_stacks_are_interned_once() {
        let mut t = StackTable::new();
        let a = t.intern_frame(frame("f", 1));
        let b = t.intern_frame(frame("g", 2));
        assert_eq!(t.intern_frame(frame("f", 1)), a);
        let s1 = t.intern_stack(vec![a, b]);
        let s2 = t.intern_stack(vec![b]);
        assert_eq!(t.intern_stack(vec![a, b]), s1);
        assert_ne!(s1, s2);
        assert_eq!((t.num_frames(), t.num_stacks()), (2, 2));
        let names: Vec<&str> = t.frames_of(s1).map(|f| f.function.as_str()).collect();
        assert_eq!(names, ["f", "g"]);
        assert_eq!(t.frames_of(NO_STACK).count(), 0);
        let stacks = t.stacks_frame().unwrap();
        assert_eq!(stacks.height(), 3);
        let frames = t.frames_frame().unwrap();
        assert_eq!(frames.height(), 2);
        let col = stack_id_column("stack_id", vec![0, NO_STACK]);
        assert_eq!(col.null_count(), 1);
    }

    #[test]
    fn the_site_is_the_innermost_frame_of_the_programs_own_code() {
        let mut t = StackTable::new();
        let mk = |t: &mut StackTable, f: &str, file: &str, line: i64| {
            t.intern_frame(Frame {
                function: f.to_owned(),
                file: file.to_owned(),
                line,
                module: String::new(),
            })
        };
        let ids = vec![
            mk(&mut t, "torch::unwind::unwind()", "??", 0),
            mk(
                &mut t,
                "c10::cuda::CUDACachingAllocator::malloc",
                "x.cpp",
                0,
            ),
            mk(&mut t, "_PyEval_EvalFrameDefault", "??", 0),
            mk(&mut t, "call", "/tmp/torchinductor_u/ab.py", 371),
            mk(
                &mut t,
                "_call_impl",
                "/x/site-packages/torch/nn/module.py",
                1787,
            ),
            mk(&mut t, "attention", "/home/u/model.py", 432),
        ];
        let s = t.intern_stack(ids);
        assert_eq!(t.site_frame(s).unwrap().function, "attention");
        let only_lib = t.intern_stack(vec![1, 4]);
        assert_eq!(t.site_frame(only_lib).unwrap().function, "_call_impl");
        assert!(t.site_frame(NO_STACK).is_none());
    }

    /// A recorded C++ program built without debug information: its own frames have no line,
    /// the C library's thread start has one, and the site is still the program's function
    /// that called `operator new`.
    /// A table and a function that adds a frame to it.
    fn table_with_frames() -> (
        StackTable,
        impl Fn(&mut StackTable, &str, &str, i64, &str) -> u32,
    ) {
        let mk = |t: &mut StackTable, f: &str, file: &str, line: i64, module: &str| {
            t.intern_frame(Frame {
                function: f.to_owned(),
                file: file.to_owned(),
                line,
                module: module.to_owned(),
            })
        };
        (StackTable::new(), mk)
    }

    #[test]
    fn the_site_of_a_program_without_lines_is_its_own_function_not_libc() {
        let (mut t, add) = table_with_frames();
        let mut mk =
            |f: &str, file: &str, line: i64, module: &str| add(&mut t, f, file, line, module);
        let libstdcxx = "/lib/x86_64-linux-gnu/libstdc++.so.6";
        let libc = "/usr/lib/x86_64-linux-gnu/libc.so.6";
        let ids = vec![
            mk("operator new(unsigned long)", "??", 0, libstdcxx),
            mk("std::__new_allocator<int>::allocate", "??", 0, "/tmp/cw"),
            mk("fill_map(int, int)", "??", 0, "/tmp/cw"),
            mk("round_of_work(int, int)", "??", 0, "/tmp/cw"),
            mk("libstdc++.so.6+0xd44a3", "??", 0, libstdcxx),
            mk("start_thread", "./nptl/pthread_create.c", 442, libc),
            mk("clone3", "clone3.S", 81, libc),
        ];
        let s = t.intern_stack(ids.clone());
        assert_eq!(t.site_frame(s).unwrap().function, "fill_map(int, int)");
        // Only the C library's frames: the first of them that is not an allocation function.
        let libc_only = t.intern_stack(vec![ids[0], ids[5], ids[6]]);
        assert_eq!(t.site_frame(libc_only).unwrap().function, "start_thread");
    }

    /// A Python program's stack: the interpreter's native frames inside the innermost Python
    /// frame have lines too (an interpreter built with debug information), but the site is
    /// the program's line; the standard library's frames are passed over.
    #[test]
    fn the_site_of_a_python_stack_is_the_programs_innermost_python_frame() {
        let (mut t, add) = table_with_frames();
        let mut mk =
            |f: &str, file: &str, line: i64, module: &str| add(&mut t, f, file, line, module);
        let python = "/root/.pyenv/versions/3.12.1/bin/python3.12";
        let ids = vec![
            mk("tuple_alloc", "Objects/tupleobject.c", 40, python),
            mk(
                "json.loads",
                "/usr/lib/python3.12/json/__init__.py",
                346,
                PYTHON_FRAMES_MODULE,
            ),
            mk("build_table", "/app/prog.py", 4, PYTHON_FRAMES_MODULE),
            mk("main", "/app/prog.py", 30, PYTHON_FRAMES_MODULE),
            mk("Py_RunMain", "Modules/main.c", 700, python),
        ];
        let s = t.intern_stack(ids.clone());
        assert_eq!(t.site_frame(s).unwrap().function, "build_table");
        assert!(t.frame(ids[2]).unwrap().is_python() && !t.frame(ids[0]).unwrap().is_python());
        // Only the standard library's Python frames: the innermost of them.
        let stdlib = t.intern_stack(vec![ids[0], ids[1], ids[4]]);
        assert_eq!(t.site_frame(stdlib).unwrap().function, "json.loads");
    }
}
