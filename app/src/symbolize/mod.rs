//! Symbolization of recorded call stacks, outside the traced program (the tracer only records
//! addresses: module + offset): `record` reads the modules and symbolizes the stacks written
//! so far while the program runs ([`Prefetch`], [`TraceStacks`]), and the rest once it has
//! exited.
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

use allocview_loaders::binary::{
    Location, NativeModule, NativeStacks, PYTHON_FRAMES_MODULE, SourceFrame, StackEnd,
};

mod growing;
mod prefetch;
mod resolver;

pub use growing::TraceStacks;
pub use prefetch::{ModuleFeed, Prefetch, Symbolized};
use resolver::Resolver;

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
        report.count_stacks(stacks);
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
        let frames = self.resolve(modules, locations);
        let mut report = self.module_report(modules, locations);
        report.locations = locations.len();
        report.count_named(&frames);
        (frames, report)
    }

    /// Source frames for each location (empty: unresolved), the modules they use read unless
    /// they were.
    #[must_use]
    pub fn resolve(
        &mut self,
        modules: &[NativeModule],
        locations: &[Location],
    ) -> Vec<Vec<SourceFrame>> {
        let mut used = std::collections::HashSet::new();
        for m in locations.iter().filter_map(|l| l.module) {
            if used.insert(m)
                && let Some(file) = modules.get(m as usize)
                && file.path != PYTHON_FRAMES_MODULE
            {
                self.open(file);
            }
        }
        let opened: Vec<Option<&Opened>> = modules
            .iter()
            .map(|f| self.modules.get(&(f.path.clone(), f.build_id.clone())))
            .collect();
        locations
            .iter()
            .map(|loc| {
                match loc
                    .module
                    .and_then(|m| opened.get(m as usize).copied().flatten())
                {
                    Some(Opened::Read(r)) => r.resolve(loc.offset.saturating_sub(1)),
                    _ => Vec::new(),
                }
            })
            .collect()
    }

    /// What reading the modules `locations` use gave (after [`Self::resolve`] read them): how
    /// many were read and had line information, which could not be read or had changed.
    #[must_use]
    pub fn module_report(&self, modules: &[NativeModule], locations: &[Location]) -> Report {
        let mut report = Report::default();
        let mut counted = std::collections::HashSet::new();
        for m in locations.iter().filter_map(|l| l.module) {
            let Some(file) = modules.get(m as usize).filter(|_| counted.insert(m)) else {
                continue;
            };
            match self
                .modules
                .get(&(file.path.clone(), file.build_id.clone()))
            {
                Some(Opened::Read(r)) => {
                    report.modules_read += 1;
                    report.modules_with_lines += usize::from(r.has_lines());
                }
                Some(Opened::NoFile) | None => {}
                Some(Opened::Unreadable(why)) => report.unreadable.push(why.clone()),
                Some(Opened::Changed) => report.build_id_mismatch.push(file.path.clone()),
            }
        }
        report
    }
}

impl Report {
    /// Counts the located frames of `found` that were named, and with a file and line.
    pub fn count_named(&mut self, found: &[Vec<SourceFrame>]) {
        for f in found.iter().filter(|f| !f.is_empty()) {
            self.named += 1;
            self.with_lines += usize::from(f.iter().any(|f| f.line > 0));
        }
    }

    /// Counts the distinct stacks of `stacks`, and the walks that ended early.
    pub fn count_stacks(&mut self, stacks: &NativeStacks) {
        self.stacks = stacks.stacks.len();
        for s in stacks.stacks.values() {
            let slot = match s.end {
                StackEnd::Complete => continue,
                StackEnd::DepthCap => 0,
                StackEnd::Unsupported => 1,
                StackEnd::NoInfo => 2,
                StackEnd::BadFrame => 3,
            };
            self.ended_early[slot] += 1;
        }
    }
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
}
