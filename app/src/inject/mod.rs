//! Loading allocview's tracer into a running process and starting and stopping its recording
//! there: what `allocview attach` does (x86-64 Linux).
//!
//! [`Attached::start`] writes the tracer library into a private directory of the target's
//! file system (`/proc/PID/root/tmp`, so that a process in a container sees it too; owned by
//! the target's user, who must read the library and write the spool), stops one thread of the
//! target ([`call::Hijack`]) and makes it call the C library's `dlopen(path, RTLD_NOW)` (found
//! in the target's `libc.so.6` from its base in `/proc/PID/maps` and the symbol in the file's
//! ELF dynamic symbol table) and then the tracer's `allocview_attach_start(prefix)`, a
//! native-only run that needs no GIL. The thread is put back as it was and the process runs on,
//! recording. [`Attached::stop`] stops a thread again to call `allocview_tracker_stop`, which
//! puts back every redirected call and writes the spool out. The library is never unloaded
//! (threads may still be inside its functions); a later attach finds it loaded and reuses it.

mod call;
pub mod target;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use self::call::{Arg, Hijack};

/// glibc's `RTLD_NOW`.
const RTLD_NOW: u64 = 2;
/// How many times the stop is asked of a thread that turns out to hold a lock of the tracer's
/// (10 ms apart: a spool write takes microseconds).
const STOP_TRIES: usize = 50;
/// glibc's private `__RTLD_DLOPEN` flag, which `__libc_dlopen_mode` callers pass.
const RTLD_DLOPEN_PRIVATE: u64 = 0x8000_0000;

/// A recording started in another process by loading the tracer into it.
pub struct Attached {
    pid: i32,
    /// The process's start time: tells it from a later process given its id.
    started: u64,
    /// The tracer's base address in the target.
    tracer_base: u64,
    /// The private directory; kept only to be removed on drop.
    _dir: tempfile::TempDir,
    /// The directory as this process reaches it, also after the target exits: its path when
    /// the target shares this process's mount namespace, else through an open handle
    /// (`/proc/self/fd/N`: `/proc/PID/root` goes away with the process).
    dir_access: PathBuf,
    _dir_handle: std::fs::File,
    /// The spool's path prefix, as the target sees it.
    prefix_in_target: String,
    /// `<prefix>.owner`, locked (shared) while this process lives: the tracer ends the run
    /// by itself once the lock is gone (this process killed without stopping it).
    _owner: std::fs::File,
}

/// The name of the tracer library written for the target: it carries a hash of the library's
/// bytes, so that a later attach recognises a tracer of the same build already loaded.
fn tracer_file_name(so: &[u8]) -> String {
    // FNV-1a: stable across builds of allocview, unlike std's hasher.
    let hash = so.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("liballocview_tracer-{hash:016x}.so")
}

impl Attached {
    /// Loads the tracer `so` into process `pid` (or finds it loaded by an earlier attach) and
    /// starts recording there.
    ///
    /// # Errors
    /// When the process is not there, not x86-64, may not be traced (the message says why),
    /// has no C library this can find `dlopen` in, has another allocview tracer loaded, or
    /// refuses to start (a recording is already on in it).
    pub fn start(pid: i32, so: &[u8]) -> Result<Self> {
        if so.is_empty() {
            bail!("this allocview was built without its tracer library: attach cannot work");
        }
        target::check_process(pid)?;
        let started = target::start_time(pid).with_context(|| format!("process {pid} ended"))?;
        let name = tracer_file_name(so);
        let dir = private_dir(pid)?;
        let dir_handle = std::fs::File::open(dir.path())
            .with_context(|| format!("opening {}", dir.path().display()))?;
        let dir_access = if same_mount_namespace(pid) {
            dir.path().to_path_buf()
        } else {
            PathBuf::from(format!(
                "/proc/self/fd/{}",
                std::os::fd::AsRawFd::as_raw_fd(&dir_handle)
            ))
        };
        let dir_in_target = format!(
            "/tmp/{}",
            dir.path()
                .file_name()
                .and_then(|n| n.to_str())
                .context("the private directory's name")?
        );
        let prefix_in_target = format!("{dir_in_target}/attach");
        let owner = owner_lock(pid, &dir.path().join("attach.owner"))?;
        let mut thread = Hijack::new(pid)?;
        let maps = target::mappings(pid)?;
        let tracer_base = match loaded_tracer(&maps, &name)? {
            Some(base) => base,
            None => {
                let so_path = dir.path().join(&name);
                write_new_for_target(pid, &so_path, so)?;
                let so_in_target = format!("{dir_in_target}/{name}");
                dlopen(&mut thread, pid, &maps, &so_in_target)?;
                let maps = target::mappings(pid)?;
                target::base_of(&maps, &so_in_target).with_context(|| {
                    format!("the tracer was loaded but is not in /proc/{pid}/maps")
                })?
            }
        };
        let start = tracer_symbol(so, tracer_base, "allocview_attach_start")?;
        let code = thread.call(start, &[Arg::Str(&prefix_in_target)])? as u32 as i32;
        thread.release()?;
        match code {
            0 => {}
            -1 => bail!(
                "process {pid} is being recorded already (by `allocview record`, a Python \
                 Tracker, or another attach)"
            ),
            -3 => bail!(
                "process {pid} could not create its recording in {} (see its standard error)",
                dir.path().display()
            ),
            other => bail!("the tracer in process {pid} refused to start (code {other})"),
        }
        Ok(Self {
            pid,
            started,
            tracer_base,
            _dir: dir,
            dir_access,
            _dir_handle: dir_handle,
            prefix_in_target,
            _owner: owner,
        })
    }

    /// Whether the process still runs (not exited, its id not reused).
    pub fn running(&self) -> bool {
        target::still_running(self.pid, self.started)
    }

    /// Stops the recording in the process (every redirected call put back, the spool written
    /// out), and lets the process go on. Nothing to do when it has exited.
    ///
    /// # Errors
    /// When the process cannot be stopped or the call fails.
    pub fn stop(&self, so: &[u8]) -> Result<()> {
        if !self.running() {
            return Ok(());
        }
        let stop = tracer_symbol(so, self.tracer_base, "allocview_tracker_stop")?;
        let mut code = -2;
        // -2: the thread stopped holds a lock of the tracer's (it was writing the spool):
        // another one, or the same once it let go, is asked again.
        for _ in 0..STOP_TRIES {
            let mut thread = Hijack::new(self.pid)?;
            code = thread.call(stop, &[])? as u32 as i32;
            thread.release()?;
            if code != -2 || !self.running() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        if code != 0 {
            bail!(
                "the tracer in process {} was not recording at the end (code {code})",
                self.pid
            );
        }
        Ok(())
    }

    /// The spools the process wrote (`<prefix>.<pid>[.<n>].spool`), as this process reaches
    /// them.
    pub fn spools(&self) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = std::fs::read_dir(&self.dir_access)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("attach.") && n.ends_with(".spool"))
            })
            .collect();
        out.sort();
        out
    }

    /// The spool prefix as the target sees it (for messages).
    pub fn prefix_in_target(&self) -> &str {
        &self.prefix_in_target
    }
}

/// Whether `pid` sees the same file system as this process (its mount namespace is ours).
fn same_mount_namespace(pid: i32) -> bool {
    let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/mnt")).ok();
    let own = ns("self");
    own.is_some() && own == ns(&pid.to_string())
}

/// A private directory in the target's `/tmp` (its own file system's), readable and writable
/// by the target's user only.
fn private_dir(pid: i32) -> Result<tempfile::TempDir> {
    let tmp = if same_mount_namespace(pid) {
        PathBuf::from("/tmp")
    } else {
        target::in_root(pid, "/tmp")
    };
    let dir = tempfile::Builder::new()
        .prefix("allocview-attach-")
        .tempdir_in(&tmp)
        .with_context(|| format!("creating a private directory in {}", tmp.display()))?;
    give_to_target(pid, dir.path())?;
    Ok(dir)
}

/// Gives `path` to the target's user when it is not ours (allocview runs as root): the target
/// reads the library and writes its spool there.
fn give_to_target(pid: i32, path: &Path) -> Result<()> {
    let Some((uid, gid)) = target::process_ids(pid) else {
        return Ok(());
    };
    if uid != rustix::process::geteuid().as_raw() {
        std::os::unix::fs::chown(path, Some(uid), Some(gid))
            .with_context(|| format!("giving {} to user {uid} of process {pid}", path.display()))?;
    }
    Ok(())
}

/// Writes `bytes` to a new file at `path` in the target's user's directory and gives it to
/// that user. Created, never opened if it exists (`O_EXCL` follows no link), and given through
/// its open handle: the directory is the target user's, who could otherwise plant a link there
/// and have allocview, run as root, write and give away the file it points to.
fn write_new_for_target(pid: i32, path: &Path, bytes: &[u8]) -> Result<std::fs::File> {
    use std::io::Write as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_data())
        .with_context(|| format!("writing {}", path.display()))?;
    if let Some((uid, gid)) = target::process_ids(pid)
        && uid != rustix::process::geteuid().as_raw()
    {
        std::os::unix::fs::fchown(&f, Some(uid), Some(gid))
            .with_context(|| format!("giving {} to user {uid} of process {pid}", path.display()))?;
    }
    Ok(f)
}

/// Creates the owner file at `path` for the target and holds a shared lock on it, released
/// when this process ends however it ends (see the tracer's `inprocess.rs`).
fn owner_lock(pid: i32, path: &Path) -> Result<std::fs::File> {
    let f = write_new_for_target(pid, path, b"")?;
    rustix::fs::flock(&f, rustix::fs::FlockOperation::LockShared)
        .with_context(|| format!("locking {}", path.display()))?;
    Ok(f)
}

/// The base of the tracer `name` if an earlier attach loaded it; an error when another
/// allocview tracer is loaded (of another build, or preloaded by `allocview record`).
fn loaded_tracer(maps: &[target::Mapping], name: &str) -> Result<Option<u64>> {
    for m in maps {
        let file = m.path.rsplit('/').next().unwrap_or(&m.path);
        if file == name && m.file_offset == 0 {
            return Ok(Some(m.start));
        }
        if file.starts_with("liballocview_tracer") {
            bail!(
                "the process has another allocview tracer loaded ({}): it is recorded by \
                 `allocview record`, or was attached by another version of allocview",
                m.path
            );
        }
    }
    Ok(None)
}

/// The address of the tracer's function `name` in the target, from the library's own bytes.
fn tracer_symbol(so: &[u8], base: u64, name: &str) -> Result<u64> {
    target::symbol_address(so, base, name, Path::new("the tracer library"))?
        .with_context(|| format!("the tracer library has no {name}"))
}

/// Makes the stopped thread load `so_in_target` with the target's `dlopen`.
fn dlopen(
    thread: &mut Hijack,
    pid: i32,
    maps: &[target::Mapping],
    so_in_target: &str,
) -> Result<()> {
    let libc = target::libc_path(maps).with_context(|| {
        format!(
            "no C library (libc.so.6) is mapped in process {pid}: attach needs a dynamically \
             linked glibc program (a static or musl program cannot be attached)"
        )
    })?;
    let base = target::base_of(maps, libc)
        .with_context(|| format!("{libc} has no mapping at file offset 0 in /proc/{pid}/maps"))?;
    let file = target::in_root(pid, libc);
    let elf = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
    // glibc 2.34 and later export dlopen from libc.so.6; before, only its private
    // __libc_dlopen_mode, which wants the private flag too.
    let (func, flags, dlerror) = match target::symbol_address(&elf, base, "dlopen", &file)? {
        Some(f) => (
            f,
            RTLD_NOW,
            target::symbol_address(&elf, base, "dlerror", &file)?,
        ),
        None => match target::symbol_address(&elf, base, "__libc_dlopen_mode", &file)? {
            Some(f) => (f, RTLD_NOW | RTLD_DLOPEN_PRIVATE, None),
            None => bail!(
                "{libc} of process {pid} exports neither dlopen nor __libc_dlopen_mode: not a \
                 glibc this attach knows"
            ),
        },
    };
    let handle = thread.call(func, &[Arg::Str(so_in_target), Arg::Int(flags)])?;
    if handle == 0 {
        let why = match dlerror {
            Some(f) => {
                let msg = thread.call(f, &[])?;
                if msg == 0 {
                    String::new()
                } else {
                    thread.read_c_string(msg, 1024)?
                }
            }
            None => String::new(),
        };
        bail!("dlopen of the tracer failed in process {pid}: {why}");
    }
    Ok(())
}
