//! What `attach` needs to know of the target process before it touches it: that it exists,
//! that it is an x86-64 Linux process, where its shared objects are mapped (`/proc/PID/maps`)
//! and where a symbol of one of them is (its ELF dynamic symbol table, read from the file the
//! process mapped, through `/proc/PID/root` so that a process in a container is read in its
//! own file system). And, when ptrace is refused, why.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};

/// ELF machine number of x86-64.
const EM_X86_64: u16 = 62;
/// CAP_SYS_PTRACE's bit in /proc/PID/status's capability masks.
const CAP_SYS_PTRACE_BIT: u32 = 19;

/// One file-backed mapping of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// Offset in the file of the mapping's first byte.
    pub file_offset: u64,
    pub executable: bool,
    /// The path as the process sees it, with a ` (deleted)` suffix removed.
    pub path: String,
    /// The file was deleted since it was mapped.
    pub deleted: bool,
}

/// The file-backed mappings of `pid`, in address order.
pub fn mappings(pid: i32) -> Result<Vec<Mapping>> {
    let path = format!("/proc/{pid}/maps");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    Ok(parse_maps(&text))
}

/// The file-backed mappings of a `/proc/PID/maps` text.
pub fn parse_maps(text: &str) -> Vec<Mapping> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.splitn(6, ' ');
            let range = fields.next()?;
            let perms = fields.next()?;
            let offset = fields.next()?;
            let _dev = fields.next()?;
            let _inode = fields.next()?;
            let path = fields.next()?.trim_start();
            if !path.starts_with('/') {
                return None;
            }
            let (start, end) = range.split_once('-')?;
            let (path, deleted) = match path.strip_suffix(" (deleted)") {
                Some(p) => (p, true),
                None => (path, false),
            };
            Some(Mapping {
                start: u64::from_str_radix(start, 16).ok()?,
                end: u64::from_str_radix(end, 16).ok()?,
                file_offset: u64::from_str_radix(offset, 16).ok()?,
                executable: perms.as_bytes().get(2) == Some(&b'x'),
                path: path.to_owned(),
                deleted,
            })
        })
        .collect()
}

/// Where the process maps the file `path`: the address its file offset 0 is mapped at.
pub fn base_of(maps: &[Mapping], path: &str) -> Option<u64> {
    maps.iter()
        .find(|m| m.path == path && m.file_offset == 0)
        .map(|m| m.start)
}

/// The C library the process mapped (glibc's `libc.so.6`), as its path in the process.
pub fn libc_path(maps: &[Mapping]) -> Option<&str> {
    maps.iter().map(|m| m.path.as_str()).find(|p| {
        let name = p.rsplit('/').next().unwrap_or(p);
        name == "libc.so.6" || (name.starts_with("libc-2.") && name.ends_with(".so"))
    })
}

/// A path of the process's file system, as this process opens it.
pub fn in_root(pid: i32, path: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/root{path}"))
}

/// The address of the exported function `name` in an ELF file whose offset 0 is mapped at
/// `base`: the symbol's value plus the load bias (`base` less the first loaded segment's
/// page-aligned address, 0 for a shared library).
pub fn symbol_address(elf: &[u8], base: u64, name: &str, file: &Path) -> Result<Option<u64>> {
    let obj = object::File::parse(elf)
        .with_context(|| format!("{}: not an ELF file this build can read", file.display()))?;
    let first_vaddr = obj.segments().map(|s| s.address()).min().unwrap_or(0) & !0xfff;
    let bias = base.wrapping_sub(first_vaddr);
    Ok(obj
        .dynamic_symbols()
        .find(|s| s.is_definition() && s.name() == Ok(name))
        .map(|s| bias.wrapping_add(s.address())))
}

/// Fails unless `pid` names a running x86-64 process (its executable's ELF header says so).
pub fn check_process(pid: i32) -> Result<()> {
    if pid <= 0 {
        bail!("{pid} is not a process id");
    }
    let stat = format!("/proc/{pid}/stat");
    let text = match std::fs::read_to_string(&stat) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("no process {pid} (nothing at /proc/{pid})")
        }
        Err(e) => return Err(e).with_context(|| format!("reading {stat}")),
    };
    // The state follows the command name, which is in parentheses and may hold anything.
    let state = text
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    if state == Some("Z") {
        bail!("process {pid} has exited (a zombie waiting for its parent)");
    }
    let exe = format!("/proc/{pid}/exe");
    let mut head = [0u8; 20];
    let read =
        std::fs::File::open(&exe).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head));
    if let Err(e) = read {
        if e.kind() == std::io::ErrorKind::PermissionDenied {
            bail!("{}", permission_message(pid, "reading its executable"));
        }
        return Err(e).with_context(|| format!("reading the ELF header of {exe}"));
    }
    let machine = u16::from_le_bytes([head[18], head[19]]);
    if &head[..4] != b"\x7fELF" || head[4] != 2 || machine != EM_X86_64 {
        bail!(
            "process {pid} is not an x86-64 program (ELF class {}, machine {machine}); attach \
             works on x86-64 Linux processes only",
            head[4]
        );
    }
    Ok(())
}

/// Why ptrace (or a file of `/proc/PID` that needs its permission) was refused, and what to
/// do: the Yama setting, another user's process, a container without `CAP_SYS_PTRACE`.
pub fn permission_message(pid: i32, doing: &str) -> String {
    let mut causes = Vec::new();
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok());
    let has_cap = own_capability(CAP_SYS_PTRACE_BIT);
    match scope {
        Some(1) if !has_cap => causes.push(
            "kernel.yama.ptrace_scope is 1: only a parent may trace its children. Run \
             `sudo sysctl kernel.yama.ptrace_scope=0`, or run allocview attach as root (or \
             with CAP_SYS_PTRACE)"
                .to_owned(),
        ),
        Some(2) if !has_cap => causes.push(
            "kernel.yama.ptrace_scope is 2: only a process with CAP_SYS_PTRACE may trace. Run \
             allocview attach as root"
                .to_owned(),
        ),
        Some(3) => causes.push(
            "kernel.yama.ptrace_scope is 3: ptrace is disabled on this machine until reboot"
                .to_owned(),
        ),
        _ => {}
    }
    let own_uid = rustix::process::geteuid().as_raw();
    if let Some(uid) = process_uid(pid)
        && uid != own_uid
        && !has_cap
    {
        causes.push(format!(
            "process {pid} belongs to user {uid} and allocview runs as user {own_uid}: run it \
             as that user, or as root"
        ));
    }
    if !has_cap {
        causes.push(
            "in a container, ptrace needs the CAP_SYS_PTRACE capability (`docker run \
             --cap-add SYS_PTRACE`, or `securityContext.capabilities.add: [SYS_PTRACE]` in \
             Kubernetes) and a seccomp profile that allows ptrace"
                .to_owned(),
        );
    } else {
        causes.push(
            "allocview has CAP_SYS_PTRACE: a seccomp profile or an LSM (AppArmor, SELinux) \
             may forbid ptrace here, or the process is being traced already (a debugger)"
                .to_owned(),
        );
    }
    let mut msg = format!(
        "not allowed to trace process {pid} ({doing}): attach needs ptrace permission over it"
    );
    for c in causes {
        msg.push_str("\n  - ");
        msg.push_str(&c);
    }
    msg
}

/// The effective user id of `pid` (from /proc/PID/status).
fn process_uid(pid: i32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// Whether this process holds capability `bit` in its effective set.
fn own_capability(bit: u32) -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("CapEff:"))?.to_owned();
            u64::from_str_radix(line.trim_start_matches("CapEff:").trim(), 16).ok()
        })
        .is_some_and(|caps| caps >> bit & 1 == 1)
}

/// The user and group ids of `pid` (from /proc/PID/status), to give it the files it must read
/// and write.
pub fn process_ids(pid: i32) -> Option<(u32, u32)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |key: &str| -> Option<u32> {
        let line = status.lines().find(|l| l.starts_with(key))?;
        line.split_whitespace().nth(2)?.parse().ok()
    };
    Some((field("Uid:")?, field("Gid:")?))
}

/// The process's start time (clock ticks after boot, field 22 of /proc/PID/stat): tells the
/// process from a later one that got its id.
pub fn start_time(pid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = text.rsplit_once(')')?;
    // Fields after the command name start at field 3 (the state).
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether `pid` is the process that started at `started` and has not exited.
pub fn still_running(pid: i32, started: u64) -> bool {
    start_time(pid) == Some(started) && u32::try_from(pid).is_ok_and(crate::procfs::running)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn maps_lines_are_parsed_with_deleted_files_and_anonymous_ones_skipped() {
        let text = "\
55d0c0a00000-55d0c0a02000 r--p 00000000 08:01 123 /usr/bin/cat
7f0000000000-7f0000028000 r--p 00000000 08:01 77 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000028000-7f000019d000 r-xp 00028000 08:01 77 /usr/lib/x86_64-linux-gnu/libc.so.6
7f00001a0000-7f00001a1000 rw-p 00000000 00:00 0
7f00002a0000-7f00002a1000 r-xp 00001000 00:2a 9 /tmp/a b/liballocview_tracer.so (deleted)
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
";
        let maps = parse_maps(text);
        assert_eq!(maps.len(), 4);
        assert_eq!(
            libc_path(&maps),
            Some("/usr/lib/x86_64-linux-gnu/libc.so.6")
        );
        assert_eq!(
            base_of(&maps, "/usr/lib/x86_64-linux-gnu/libc.so.6"),
            Some(0x7f00_0000_0000)
        );
        assert!(maps[2].executable && !maps[1].executable);
        assert_eq!(maps[3].path, "/tmp/a b/liballocview_tracer.so");
        assert!(maps[3].deleted);
    }

    #[test]
    fn this_process_is_x86_64_and_its_dlopen_is_found() {
        let pid = std::process::id() as i32;
        check_process(pid).unwrap();
        let maps = mappings(pid).unwrap();
        let libc = libc_path(&maps).unwrap();
        let file = in_root(pid, libc);
        let elf = std::fs::read(&file).unwrap();
        let base = base_of(&maps, libc).unwrap();
        let dlopen = symbol_address(&elf, base, "dlopen", &file)
            .unwrap()
            .unwrap();
        let m = maps
            .iter()
            .find(|m| m.start <= dlopen && dlopen < m.end)
            .unwrap();
        assert!(m.executable && m.path == libc);
        assert!(start_time(pid).is_some());
        assert!(still_running(pid, start_time(pid).unwrap()));
        assert!(check_process(0).is_err());
    }
}
