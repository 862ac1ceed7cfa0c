//! Symbolization of recorded call stacks, outside the traced program (the tracer only records
//! addresses: module + offset): `record` reads the modules while the program runs
//! ([`Prefetch`]) and symbolizes the stacks once it has exited.
//!
//! Each module is read from the path the tracer recorded and checked against the build id it
//! recorded (a file rebuilt or upgraded since is not used: its frames stay module + offset).
//! Source locations come from DWARF debug information, found in the module itself, in
//! `/usr/lib/debug/.build-id/xx/rest.debug` (what distributions' `-dbgsym` / `-debuginfo`
//! packages install), or through the module's `.gnu_debuglink`; inlined calls become frames of
//! their own (innermost first). Without debug information a frame is named by the symbol table
//! (`.symtab`, else `.dynsym`) when the address falls inside a symbol's extent, with no file or
//! line; otherwise it stays module + offset. Names are demangled (Rust, then Itanium C++).

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use allocview_loaders::binary::{
    Location, NativeModule, NativeStacks, PYTHON_FRAMES_MODULE, SourceFrame, StackEnd,
};
use object::{Object as _, ObjectSection as _, ObjectSymbol as _};

/// What symbolization found, for the user.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Modules read, and of those, with DWARF line information.
    pub modules_read: usize,
    pub modules_with_lines: usize,
    /// Modules whose file could not be read (path: reason).
    pub unreadable: Vec<String>,
    /// Modules whose file has another build id than the one recorded.
    pub build_id_mismatch: Vec<String>,
    /// Locations named by a function, and of those with a file and line.
    pub named: usize,
    pub with_lines: usize,
    /// Locations looked up, and of those, Python frames (named by the recording).
    pub locations: usize,
    pub python: usize,
    /// Distinct stacks, and of those, walks that ended before the outermost frame: at the
    /// depth cap, at a rule the unwinder does not follow, at code without unwind information,
    /// at a frame that failed a check.
    pub stacks: usize,
    pub ended_early: [usize; 4],
}

impl Report {
    /// Tells the user what was symbolized and what was not, on stderr.
    pub fn print_summary(&self) {
        eprintln!(
            "stacks: {} of {} code locations named ({} with file and line); {} modules read, {} \
             with line information",
            crate::format::count(self.named as u64),
            crate::format::count(self.locations as u64),
            crate::format::count(self.with_lines as u64),
            self.modules_read,
            self.modules_with_lines,
        );
        if self.python > 0 {
            eprintln!(
                "  and {} Python code locations (function, file and line, from the interpreter)",
                crate::format::count(self.python as u64)
            );
        }
        let [cap, unsupported, no_info, bad] = self.ended_early;
        if cap + unsupported + no_info + bad > 0 {
            eprintln!(
                "  {} distinct stacks; ended before the outermost frame: {cap} at the depth cap, \
                 {unsupported} at an unwind rule not followed (DWARF expression, signal frame), \
                 {no_info} at code without unwind information, {bad} at a frame that failed a \
                 check",
                crate::format::count(self.stacks as u64)
            );
        }
        for m in &self.build_id_mismatch {
            eprintln!(
                "  note: {m} changed since the run (another build id): its frames stay module + offset"
            );
        }
        for m in &self.unreadable {
            eprintln!("  note: cannot read {m}: its frames stay module + offset");
        }
    }
}

/// Reads modules once and keeps them: `record` symbolizes each process's stacks with one, so
/// a command that starts many processes reads the C library and its debug file once.
#[derive(Default)]
pub struct Symbolizer {
    modules: HashMap<(String, Vec<u8>), Opened>,
}

/// A module file as opened.
enum Opened {
    Read(Box<Resolver>),
    /// No file to read (the vDSO).
    NoFile,
    Unreadable(String),
    /// Another build id than the recorded one.
    Changed,
}

impl Symbolizer {
    /// Reads `file` unless it was read before.
    pub fn open(&mut self, file: &NativeModule) {
        self.modules
            .entry((file.path.clone(), file.build_id.clone()))
            .or_insert_with(|| Resolver::open(file));
    }

    /// Symbolizes every location of `stacks` in place (its `symbols`).
    pub fn symbolize_stacks(&mut self, stacks: &mut NativeStacks) -> Report {
        let (symbols, mut report) = self.symbolize(&stacks.modules, &stacks.locations);
        // The Python frames come named from the recording.
        let recorded = std::mem::take(&mut stacks.symbols);
        stacks.symbols = symbols
            .into_iter()
            .enumerate()
            .map(|(i, found)| match recorded.get(i) {
                Some(named) if found.is_empty() && !named.is_empty() => named.clone(),
                _ => found,
            })
            .collect();
        report.python = recorded.iter().filter(|s| !s.is_empty()).count();
        report.stacks = stacks.stacks.len();
        for s in stacks.stacks.values() {
            let slot = match s.end {
                StackEnd::Complete => continue,
                StackEnd::DepthCap => 0,
                StackEnd::Unsupported => 1,
                StackEnd::NoInfo => 2,
                StackEnd::BadFrame => 3,
            };
            report.ended_early[slot] += 1;
        }
        report
    }

    /// Source frames for each location (empty: unresolved, shown as module + offset), and a
    /// report.
    #[must_use]
    pub fn symbolize(
        &mut self,
        modules: &[NativeModule],
        locations: &[Location],
    ) -> (Vec<Vec<SourceFrame>>, Report) {
        let mut report = Report {
            locations: locations.len(),
            ..Report::default()
        };
        // Open each module the locations use, unless an earlier call did.
        let mut used = std::collections::HashSet::new();
        for m in locations.iter().filter_map(|l| l.module) {
            if used.insert(m)
                && let Some(file) = modules.get(m as usize)
                && file.path != PYTHON_FRAMES_MODULE
            {
                self.open(file);
            }
        }
        let keys: Vec<Option<(String, Vec<u8>)>> = modules
            .iter()
            .map(|f| Some((f.path.clone(), f.build_id.clone())))
            .collect();
        let mut frames = Vec::with_capacity(locations.len());
        let mut counted = std::collections::HashSet::new();
        for loc in locations {
            let file = loc.module.and_then(|m| modules.get(m as usize));
            let module = loc
                .module
                .and_then(|m| keys.get(m as usize))
                .and_then(Option::as_ref)
                .and_then(|k| self.modules.get(k));
            if let (Some(m), Some(file), Some(module)) = (loc.module, file, module)
                && counted.insert(m)
            {
                match module {
                    Opened::Read(r) => {
                        report.modules_read += 1;
                        report.modules_with_lines += usize::from(r.dwarf.is_some());
                    }
                    Opened::NoFile => {}
                    Opened::Unreadable(why) => report.unreadable.push(why.clone()),
                    Opened::Changed => report.build_id_mismatch.push(file.path.clone()),
                }
            }
            let found = match module {
                Some(Opened::Read(r)) => r.resolve(loc.offset.saturating_sub(1)),
                _ => Vec::new(),
            };
            if !found.is_empty() {
                report.named += 1;
                report.with_lines += usize::from(found.iter().any(|f| f.line > 0));
            }
            frames.push(found);
        }
        (frames, report)
    }
}

/// A [`Symbolizer`] that reads modules on a thread of its own while the traced program runs:
/// `record` sends it each module a stack uses as its conversion meets the first such stack,
/// and finds them read when the program exits (the C library's debug information alone takes
/// some 50 ms to read), instead of reading them all after.
pub struct Prefetch {
    tx: mpsc::Sender<Prefetched>,
    thread: Option<std::thread::JoinHandle<Symbolizer>>,
}

/// Sends modules to a [`Prefetch`]'s thread.
pub struct ModuleFeed(mpsc::Sender<Prefetched>);

impl ModuleFeed {
    /// Reads `file` on the thread (unless it was read).
    pub fn read(&self, file: &NativeModule) {
        // The reading needs no segments. A send fails only once the thread has stopped: the
        // module is then read when the stacks are symbolized.
        let file = NativeModule {
            segments: Vec::new(),
            ..file.clone()
        };
        self.0.send(Prefetched::Module(file)).ok();
    }
}

enum Prefetched {
    Module(NativeModule),
    Done,
}

impl Prefetch {
    /// Starts the reading thread (none when it cannot start: the modules are then read
    /// after the run, as without prefetching).
    #[must_use]
    pub fn start() -> Self {
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("allocview-symbols".into())
            .spawn(move || {
                let mut symbolizer = Symbolizer::default();
                while let Ok(Prefetched::Module(m)) = rx.recv() {
                    symbolizer.open(&m);
                }
                symbolizer
            })
            .ok();
        Self { tx, thread }
    }

    /// Where to send the modules to read.
    #[must_use]
    pub fn feed(&self) -> ModuleFeed {
        ModuleFeed(self.tx.clone())
    }

    /// Waits for the modules sent so far, and hands over what was read.
    #[must_use]
    pub fn finish(mut self) -> Symbolizer {
        self.tx.send(Prefetched::Done).ok();
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

/// A function symbol: `[start, end)` and its name.
struct Symbol {
    start: u64,
    end: u64,
    name: String,
}

/// One module's symbol table and, when found, its DWARF.
struct Resolver {
    symbols: Vec<Symbol>,
    dwarf: Option<addr2line::Loader>,
}

impl Resolver {
    fn open(file: &NativeModule) -> Opened {
        let path = Path::new(&file.path);
        if file.path.is_empty() || !path.is_absolute() {
            // The vDSO and other modules without a file.
            return Opened::NoFile;
        }
        let data = match std::fs::read(path) {
            Ok(d) => d,
            Err(e) => return Opened::Unreadable(format!("{}: {e}", file.path)),
        };
        let object = match object::File::parse(&*data) {
            Ok(o) => o,
            Err(e) => return Opened::Unreadable(format!("{}: {e}", file.path)),
        };
        let build_id = object.build_id().ok().flatten().unwrap_or(&[]);
        if !file.build_id.is_empty() && build_id != file.build_id.as_slice() {
            return Opened::Changed;
        }
        let debug_path = debug_file(path, &object);
        let mut symbols = function_symbols(&object);
        let debug_data = debug_path
            .as_ref()
            .filter(|p| p.as_path() != path)
            .and_then(|p| std::fs::read(p).ok());
        if let Some(d) = &debug_data
            && let Ok(debug) = object::File::parse(&**d)
            && debug.build_id().ok().flatten() == object.build_id().ok().flatten()
        {
            // A separate debug file has the full symbol table.
            symbols.extend(function_symbols(&debug));
        }
        symbols.sort_by_key(|s| (s.start, std::cmp::Reverse(s.end)));
        symbols.dedup_by_key(|s| s.start);
        let dwarf = debug_path.and_then(|p| addr2line::Loader::new(p).ok());
        Opened::Read(Box::new(Self { symbols, dwarf }))
    }

    /// Source frames at `probe` (a virtual address of the module), innermost first.
    fn resolve(&self, probe: u64) -> Vec<SourceFrame> {
        let mut out = Vec::new();
        if let Some(dwarf) = &self.dwarf
            && let Ok(mut frames) = dwarf.find_frames(probe)
        {
            while let Ok(Some(frame)) = frames.next() {
                let function = frame
                    .function
                    .as_ref()
                    .and_then(|f| f.raw_name().ok())
                    .map(|n| demangle(&n));
                let (file, line) = frame
                    .location
                    .as_ref()
                    .map(|l| (l.file.unwrap_or_default().to_owned(), l.line.unwrap_or(0)))
                    .unwrap_or_default();
                let Some(function) = function.or_else(|| self.symbol_at(probe)) else {
                    continue;
                };
                out.push(SourceFrame {
                    function,
                    file,
                    line,
                });
            }
        }
        if out.is_empty()
            && let Some(function) = self.symbol_at(probe)
        {
            out.push(SourceFrame {
                function,
                file: String::new(),
                line: 0,
            });
        }
        out
    }

    /// The demangled name of the function symbol whose extent holds `probe`.
    fn symbol_at(&self, probe: u64) -> Option<String> {
        let i = self.symbols.partition_point(|s| s.start <= probe);
        let s = self.symbols.get(i.checked_sub(1)?)?;
        (probe < s.end).then(|| demangle(&s.name))
    }
}

/// Function symbols with a size, from `.symtab`, or `.dynsym` when there is no `.symtab`.
fn function_symbols(object: &object::File<'_>) -> Vec<Symbol> {
    let from = |syms: &mut dyn Iterator<Item = object::Symbol<'_, '_>>| -> Vec<Symbol> {
        syms.filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0 && s.address() > 0)
            .filter_map(|s| {
                Some(Symbol {
                    start: s.address(),
                    end: s.address().checked_add(s.size())?,
                    name: s.name().ok()?.to_owned(),
                })
            })
            .collect()
    };
    let symtab = from(&mut object.symbols());
    if symtab.is_empty() {
        from(&mut object.dynamic_symbols())
    } else {
        symtab
    }
}

/// Where `object`'s DWARF is: the file itself, its build-id debug file, or its debuglink.
fn debug_file(path: &Path, object: &object::File<'_>) -> Option<PathBuf> {
    let has_lines = |o: &object::File<'_>| {
        o.section_by_name(".debug_info")
            .is_some_and(|s| s.size() > 0)
    };
    if has_lines(object) {
        return Some(path.to_path_buf());
    }
    let mut candidates = Vec::new();
    if let Ok(Some(id)) = object.build_id()
        && let Some((first, rest)) = id.split_first()
    {
        let rest: String = rest.iter().map(|b| format!("{b:02x}")).collect();
        candidates.push(PathBuf::from(format!(
            "/usr/lib/debug/.build-id/{first:02x}/{rest}.debug"
        )));
    }
    if let Ok(Some((name, _crc))) = object.gnu_debuglink()
        && let Ok(name) = std::str::from_utf8(name)
        && let Some(dir) = path.parent()
    {
        candidates.push(dir.join(name));
        candidates.push(dir.join(".debug").join(name));
        let relative = dir.strip_prefix("/").unwrap_or(dir);
        candidates.push(Path::new("/usr/lib/debug").join(relative).join(name));
    }
    candidates.into_iter().find(|c| {
        std::fs::read(c)
            .ok()
            .and_then(|d| object::File::parse(&*d).ok().map(|o| has_lines(&o)))
            .unwrap_or(false)
    })
}

/// A function name for people: Rust (legacy and v0) and Itanium C++ names demangled, others
/// as they are.
#[must_use]
pub fn demangle(name: &str) -> String {
    if let Ok(d) = rustc_demangle::try_demangle(name) {
        return format!("{d:#}");
    }
    if name.starts_with("_Z")
        && let Ok(sym) = cpp_demangle::Symbol::new(name.as_bytes())
        && let Ok(s) = sym.demangle()
    {
        return s;
    }
    Cow::Borrowed(name).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_demangled_for_rust_and_cpp() {
        assert_eq!(demangle("_Z12make_widgetsi"), "make_widgets(int)");
        assert_eq!(
            demangle("_ZN4core3ptr13drop_in_place17h0123456789abcdefE"),
            "core::ptr::drop_in_place"
        );
        assert_eq!(demangle("PyObject_Malloc"), "PyObject_Malloc");
    }

    #[test]
    fn a_missing_module_leaves_its_locations_unresolved() {
        let modules = [NativeModule {
            path: "/nonexistent/libx.so".to_owned(),
            ..NativeModule::default()
        }];
        let (frames, report) = Symbolizer::default().symbolize(
            &modules,
            &[Location {
                module: Some(0),
                offset: 0x1234,
            }],
        );
        assert_eq!(frames, vec![Vec::<SourceFrame>::new()]);
        assert_eq!(report.unreadable.len(), 1);
    }

    #[test]
    fn modules_sent_to_a_prefetch_are_read_on_its_thread_once() {
        let exe = std::env::current_exe().unwrap().display().to_string();
        let module = |path: &str| NativeModule {
            path: path.to_owned(),
            segments: vec![(0x1000, 0x2000)],
            ..NativeModule::default()
        };
        let prefetch = Prefetch::start();
        let feed = prefetch.feed();
        feed.read(&module(&exe));
        feed.read(&module(&exe));
        feed.read(&module("/nonexistent/liby.so"));
        // What the thread read comes back with `finish`: this symbolizer opened nothing itself.
        let mut symbolizer = prefetch.finish();
        assert_eq!(symbolizer.modules.len(), 2);
        assert!(matches!(
            symbolizer.modules.get(&(exe.clone(), Vec::new())),
            Some(Opened::Read(_))
        ));
        let Some(Opened::Read(r)) = symbolizer.modules.get(&(exe.clone(), Vec::new())) else {
            unreachable!()
        };
        assert!(!r.symbols.is_empty());
        // The symbolization's own open finds it there.
        symbolizer.open(&module(&exe));
        assert_eq!(symbolizer.modules.len(), 2);
        // A feed that outlives its prefetch sends to no one, and does not fail.
        feed.read(&module("/nonexistent/libz.so"));
    }
}
