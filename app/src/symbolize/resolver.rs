//! One module file read for symbolization: its function symbols and, when found, its DWARF
//! (in the file, a build-id debug file, or through its debuglink).

use std::path::{Path, PathBuf};

use allocview_loaders::binary::{NativeModule, SourceFrame};
use object::{Object as _, ObjectSection as _, ObjectSymbol as _};

use super::{Opened, demangle};

/// A function symbol: `[start, end)` and its name.
struct Symbol {
    start: u64,
    end: u64,
    name: String,
}

/// One module's symbol table and, when found, its DWARF.
pub(super) struct Resolver {
    symbols: Vec<Symbol>,
    dwarf: Option<addr2line::Loader>,
}

impl Resolver {
    pub(super) fn open(file: &NativeModule) -> Opened {
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
    pub(super) fn resolve(&self, probe: u64) -> Vec<SourceFrame> {
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

    /// Whether the module's DWARF (line information) was found.
    pub(super) fn has_lines(&self) -> bool {
        self.dwarf.is_some()
    }

    /// Whether the module has function symbols.
    #[cfg(test)]
    pub(super) fn has_symbols(&self) -> bool {
        !self.symbols.is_empty()
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
