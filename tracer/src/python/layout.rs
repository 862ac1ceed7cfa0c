//! Where CPython keeps what the frame walk reads, per minor version (x86-64 release builds).
//!
//! These are `offsetof` values of CPython's own structures (`PyThreadState`, `_PyCFrame`,
//! `_PyInterpreterFrame` or `PyFrameObject`, `PyCodeObject`, `PyASCIIObject`), as compiled
//! from each version's installed headers (`Include/internal` included) by
//! `scripts/python-layouts.sh`, which the test suite runs against every interpreter the
//! machine has to check this table. CPython keeps them fixed within a minor version. The
//! walk never trusts them alone: every code object it reads must have `PyCode_Type` as its
//! type and every name `PyUnicode_Type`, or the walk stops.

/// How a version chains its frames.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Chain {
    /// 3.9, 3.10: `tstate->frame`, a `PyFrameObject` per Python call, each run by its own
    /// C call of `_PyEval_EvalFrameDefault`; `f_lasti` in bytes (3.9) or code units (3.10).
    FrameObjects { lasti_in_units: bool },
    /// 3.11, 3.12: `tstate->cframe->current_frame`, `_PyInterpreterFrame`s; `prev_instr`
    /// points at the instruction executing.
    CFrame,
    /// 3.13: `tstate->current_frame`; `instr_ptr` points at the instruction executing.
    Current,
}

/// The offsets of one minor version.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    pub minor: u32,
    pub chain: Chain,
    /// `PyThreadState.frame` (3.9, 3.10), `.cframe` (3.11, 3.12), `.current_frame` (3.13).
    pub tstate_frame: usize,
    /// `_PyCFrame.current_frame` (3.11, 3.12).
    pub cframe_current: usize,
    /// The frame's code object (`f_code`, 3.13's `f_executable`).
    pub frame_code: usize,
    /// The next outer frame (`f_back`, `previous`).
    pub frame_back: usize,
    /// `f_lasti` (3.9, 3.10), `prev_instr` (3.11, 3.12), `instr_ptr` (3.13).
    pub frame_instr: usize,
    /// `owner` (3.11 on).
    pub frame_owner: usize,
    /// `is_entry` (3.11 only: 3.12 on marks a C call's first frame with a shim frame of
    /// owner [`OWNED_BY_CSTACK`] below it).
    pub frame_is_entry: Option<usize>,
    pub code_filename: usize,
    pub code_name: usize,
    /// `co_qualname` (3.11 on; earlier versions name functions without their class).
    pub code_qualname: Option<usize>,
    pub code_firstlineno: usize,
    /// `co_code_adaptive`, where the instructions start (3.11 on).
    pub code_instructions: usize,
    /// `_co_firsttraceable` (3.11 on): frames before it are still being set up.
    pub code_firsttraceable: usize,
    /// `sizeof(PyASCIIObject)`, `sizeof(PyCompactUnicodeObject)`: where a compact string's
    /// characters start, ASCII or not.
    pub ascii_data: usize,
    pub compact_data: usize,
}

/// `owner` of a generator's frame (3.11 on): never incomplete.
pub const OWNED_BY_GENERATOR: u8 = 1;
/// `owner` of the shim frame a C call of the interpreter starts with (3.12 on).
pub const OWNED_BY_CSTACK: u8 = 3;
/// `PyASCIIObject.state`'s offset and `ob_size`'s (the length in characters), every version.
pub const STR_STATE: usize = 32;
pub const STR_LENGTH: usize = 16;

const V39: Layout = Layout {
    minor: 9,
    chain: Chain::FrameObjects {
        lasti_in_units: false,
    },
    tstate_frame: 24,
    cframe_current: 0,
    frame_code: 32,
    frame_back: 24,
    frame_instr: 104,
    frame_owner: 0,
    frame_is_entry: None,
    code_filename: 104,
    code_name: 112,
    code_qualname: None,
    code_firstlineno: 40,
    code_instructions: 0,
    code_firsttraceable: 0,
    ascii_data: 48,
    compact_data: 72,
};

const V310: Layout = Layout {
    minor: 10,
    chain: Chain::FrameObjects {
        lasti_in_units: true,
    },
    frame_instr: 96,
    ..V39
};

const V311: Layout = Layout {
    minor: 11,
    chain: Chain::CFrame,
    tstate_frame: 56,
    cframe_current: 8,
    frame_code: 32,
    frame_back: 48,
    frame_instr: 56,
    frame_owner: 69,
    frame_is_entry: Some(68),
    code_filename: 112,
    code_name: 120,
    code_qualname: Some(128),
    code_firstlineno: 72,
    code_instructions: 184,
    code_firsttraceable: 168,
    ascii_data: 48,
    compact_data: 72,
};

const V312: Layout = Layout {
    minor: 12,
    chain: Chain::CFrame,
    tstate_frame: 56,
    cframe_current: 0,
    frame_code: 0,
    frame_back: 8,
    frame_instr: 56,
    frame_owner: 70,
    frame_is_entry: None,
    code_filename: 112,
    code_name: 120,
    code_qualname: Some(128),
    code_firstlineno: 68,
    code_instructions: 192,
    code_firsttraceable: 176,
    ascii_data: 40,
    compact_data: 56,
};

const V313: Layout = Layout {
    minor: 13,
    chain: Chain::Current,
    tstate_frame: 72,
    code_instructions: 200,
    code_firsttraceable: 184,
    ..V312
};

/// The layout of CPython 3.`minor`, when the walk knows it.
pub fn of_minor(minor: u32) -> Option<&'static Layout> {
    [&V39, &V310, &V311, &V312, &V313]
        .into_iter()
        .find(|l| l.minor == minor)
}

/// The table as `scripts/python-layouts.sh` prints it, one line per version, for the test
/// that compares the two.
#[cfg(test)]
pub fn describe(l: &Layout) -> String {
    format!(
        "3.{} tstate_frame={} cframe_current={} frame_code={} frame_back={} frame_instr={} \
         frame_owner={} frame_is_entry={} code_filename={} code_name={} code_qualname={} \
         code_firstlineno={} code_instructions={} code_firsttraceable={} ascii_data={} \
         compact_data={}",
        l.minor,
        l.tstate_frame,
        l.cframe_current,
        l.frame_code,
        l.frame_back,
        l.frame_instr,
        l.frame_owner,
        l.frame_is_entry.map_or(-1, |v| v as i64),
        l.code_filename,
        l.code_name,
        l.code_qualname.map_or(-1, |v| v as i64),
        l.code_firstlineno,
        l.code_instructions,
        l.code_firsttraceable,
        l.ascii_data,
        l.compact_data,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// The include directories of the CPython 3.9 to 3.13 this machine has (pyenv's and the
    /// distribution's).
    fn include_dirs() -> Vec<PathBuf> {
        let mut roots = vec![PathBuf::from("/usr/include")];
        if let Some(home) = std::env::var_os("HOME") {
            let versions = PathBuf::from(home).join(".pyenv/versions");
            if let Ok(entries) = std::fs::read_dir(versions) {
                roots.extend(entries.flatten().map(|e| e.path().join("include")));
            }
        }
        let mut dirs = Vec::new();
        for root in roots {
            for minor in 9..=13 {
                let dir = root.join(format!("python3.{minor}"));
                if dir.join("internal").is_dir() {
                    dirs.push(dir);
                }
            }
        }
        dirs
    }

    /// The table matches what the machine's CPython headers compile to.
    #[test]
    fn the_table_matches_every_installed_interpreters_headers() {
        let dirs = include_dirs();
        assert!(
            !dirs.is_empty(),
            "no CPython 3.9-3.13 headers found (python3-dev)"
        );
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/python-layouts.sh");
        let out = std::process::Command::new("bash")
            .arg(script)
            .args(&dirs)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lines = String::from_utf8(out.stdout).unwrap();
        assert_eq!(lines.lines().count(), dirs.len());
        for line in lines.lines() {
            let minor: u32 = line[2..line.find(' ').unwrap()].parse().unwrap();
            let ours = of_minor(minor).map(describe);
            assert_eq!(ours.as_deref(), Some(line), "{dirs:?}");
        }
    }

    #[test]
    fn versions_outside_the_table_have_no_layout() {
        assert!(of_minor(8).is_none() && of_minor(14).is_none());
    }
}
