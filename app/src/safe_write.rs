//! Writing a user's files without ever destroying one: every command that writes a file goes
//! through here.
//!
//! - [`refuse_if_same_file`] compares *files* (device and inode), not paths: an output that is
//!   a hard link to the input, a symbolic link to it, or the same path spelled differently is
//!   refused before anything is written.
//! - [`write_atomically`] (and [`write_bytes`], and [`PendingFile`] for writers that outlive
//!   one closure or write by path) writes into a temporary file in the output's directory,
//!   flushes it to disk, and renames it over the output only when everything succeeded. A
//!   failing command therefore leaves an existing output as it was, and the temporary file is
//!   removed. SIGINT and SIGTERM remove every temporary file in progress too (see
//!   [`cleanup_on_interrupt`]); only a kill that cannot be caught (SIGKILL, a crash) leaves a
//!   hidden `.allocview-tmp-*` file behind, and the output is untouched even then.
//!
//! An output the user named that is a symbolic link is written through: the link stays and its
//! target is replaced (atomically, in the target's directory). An output whose name the
//! command chose itself inside a directory ([`PendingFile::create_own_name`]) is replaced
//! whatever it is, a link included, so that a link planted there writes nothing elsewhere. A replaced file keeps its permission bits.
//! An output that is not a regular file (a terminal, a pipe, `/dev/stdout`, `/dev/null`) is
//! written in place: there is nothing to keep, and renaming over it would replace the device.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write as _};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, Once, PoisonError};

/// The temporary files being written, which an interrupt removes. Held while a temporary file
/// is created, renamed or removed, and by the interrupt's cleanup until the process ends, so a
/// file is never created after the cleanup or left out of it.
static IN_PROGRESS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
/// While above zero, SIGINT and SIGTERM are ignored rather than cleaned up after (see
/// [`DeferInterrupts`]).
static DEFERRED: AtomicUsize = AtomicUsize::new(0);
static CLEANUP: Once = Once::new();

fn in_progress() -> MutexGuard<'static, Vec<PathBuf>> {
    IN_PROGRESS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Makes SIGINT and SIGTERM remove every temporary file in progress and then end the process
/// as the signal would have (a parent sees it killed by the signal; a shell shows 130 or
/// 143). Installed once, by the first temporary file: a process that writes none keeps the
/// signals' default actions. SIGHUP is left alone, so `nohup` keeps working.
pub fn cleanup_on_interrupt() {
    use signal_hook::consts::{SIGINT, SIGTERM};
    CLEANUP.call_once(|| {
        // The handler runs on a thread of its own (signal-hook's iterator), where taking the
        // lock and removing files is safe, unlike in a signal handler proper.
        let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) else {
            return;
        };
        let spawned = std::thread::Builder::new()
            .name("allocview-interrupt".to_owned())
            .spawn(move || {
                for sig in signals.forever() {
                    if DEFERRED.load(Ordering::SeqCst) > 0 {
                        continue;
                    }
                    let files = in_progress();
                    for tmp in files.iter() {
                        fs::remove_file(tmp).ok();
                    }
                    // Dies of the signal; exits 128 + it should the default action not end
                    // the process. The lock stays held: no new temporary file meanwhile.
                    signal_hook::low_level::emulate_default_handler(sig).ok();
                    std::process::exit(128 + sig);
                }
            });
        drop(spawned);
    });
}

/// While alive, SIGINT and SIGTERM are ignored by this process (they still reach a child,
/// which `record` waits for): `record` keeps them from ending it while the traced command
/// runs, so that the traces still get written.
#[derive(Debug)]
pub struct DeferInterrupts(());

impl DeferInterrupts {
    /// Starts ignoring SIGINT and SIGTERM (for this process only) until dropped.
    #[must_use]
    pub fn new() -> Self {
        DEFERRED.fetch_add(1, Ordering::SeqCst);
        Self(())
    }
}

impl Default for DeferInterrupts {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for DeferInterrupts {
    fn drop(&mut self) {
        DEFERRED.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Fails when `output` exists and is the same file as `input` (same device and inode, so hard
/// links, symbolic links and other spellings of one path are all caught). A missing input or
/// output is not an error here.
///
/// # Errors
/// The refusal, as an [`io::ErrorKind::InvalidInput`] error that names both paths.
pub fn refuse_if_same_file(input: &Path, output: &Path) -> io::Result<()> {
    let (Ok(a), Ok(b)) = (fs::metadata(input), fs::metadata(output)) else {
        return Ok(());
    };
    if a.dev() == b.dev() && a.ino() == b.ino() {
        let how = if input == output {
            "the same path"
        } else if fs::symlink_metadata(output).is_ok_and(|m| m.file_type().is_symlink())
            || fs::symlink_metadata(input).is_ok_and(|m| m.file_type().is_symlink())
        {
            "through a symbolic link"
        } else if a.nlink() > 1 {
            "a hard link to it, or another spelling of its path"
        } else {
            "another spelling of its path"
        };
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "refusing to write {}: it is the input {} ({how}), and writing it would destroy \
                 the input; choose another output",
                output.display(),
                input.display()
            ),
        ));
    }
    Ok(())
}

/// [`refuse_if_same_file`] for each of `inputs`.
///
/// # Errors
/// The first refusal.
pub fn refuse_if_any_input(inputs: &[&Path], output: &Path) -> io::Result<()> {
    inputs
        .iter()
        .try_for_each(|input| refuse_if_same_file(input, output))
}

/// Writes `path` atomically: `write` fills a buffered temporary file next to it, which then
/// replaces `path` only if `write` and the flush succeeded. `inputs` are refused as outputs
/// (see [`refuse_if_same_file`]).
///
/// # Errors
/// The refusal, `write`'s error, or an I/O error creating, flushing or renaming the file (the
/// message names the output). On any error `path` is as it was.
pub fn write_atomically<T>(
    path: &Path,
    inputs: &[&Path],
    write: impl FnOnce(&mut BufWriter<File>) -> io::Result<T>,
) -> io::Result<T> {
    let (pending, file) = PendingFile::create(path, inputs)?;
    let mut w = BufWriter::with_capacity(1 << 16, file);
    let value = write(&mut w)?;
    let file = w.into_inner().map_err(io::IntoInnerError::into_error)?;
    pending.commit(Some(file))?;
    Ok(value)
}

/// Writes `bytes` to `path` atomically (see [`write_atomically`]).
///
/// # Errors
/// As [`write_atomically`].
pub fn write_bytes(path: &Path, bytes: &[u8], inputs: &[&Path]) -> io::Result<()> {
    write_atomically(path, inputs, |w| w.write_all(bytes))
}

/// What [`PendingFile`] does with a symbolic link at the output's path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Links {
    /// The user named the output: writing replaces the link's target and keeps the link.
    Follow,
    /// The command named the output: the link itself is replaced.
    Replace,
}

/// A temporary file that becomes `target` on [`PendingFile::commit`] and is removed when
/// dropped before that.
#[derive(Debug)]
pub struct PendingFile {
    tmp: PathBuf,
    target: PathBuf,
    committed: bool,
    /// The output is not a regular file (a terminal, a pipe, `/dev/null`): it is written in
    /// place, since renaming over it would replace the device or pipe itself.
    direct: bool,
}

impl PendingFile {
    /// Refuses `inputs` as the output, then creates the temporary file (in `path`'s directory,
    /// or its link target's, with a name ending in `path`'s file name, so that writers which
    /// choose a format by extension choose the same one).
    ///
    /// # Errors
    /// The refusal, or when the temporary file cannot be created (the message names `path`).
    pub fn create(path: &Path, inputs: &[&Path]) -> io::Result<(Self, File)> {
        Self::create_with(path, inputs, Links::Follow)
    }

    /// As [`Self::create`], for a file whose name the command chose itself inside a directory
    /// it was given (`report --out DIR` writes `DIR/summary.csv`): whatever is at `path` is
    /// replaced, never written through. A symbolic link planted there under that name is
    /// replaced by the file (the rename replaces the link, not its target), so nothing outside
    /// the directory is written or created; a device or pipe planted there is replaced too.
    ///
    /// # Errors
    /// As [`Self::create`].
    pub fn create_own_name(path: &Path, inputs: &[&Path]) -> io::Result<(Self, File)> {
        Self::create_with(path, inputs, Links::Replace)
    }

    fn create_with(path: &Path, inputs: &[&Path], links: Links) -> io::Result<(Self, File)> {
        refuse_if_any_input(inputs, path)?;
        if links == Links::Follow
            && let Ok(m) = fs::metadata(path)
            && !m.is_file()
            && !m.is_dir()
        {
            let file = OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(|e| named(path, e))?;
            let pending = Self {
                tmp: path.to_path_buf(),
                target: path.to_path_buf(),
                committed: false,
                direct: true,
            };
            return Ok((pending, file));
        }
        let target = match links {
            Links::Follow => resolve_links(path),
            Links::Replace => path.to_path_buf(),
        };
        let name = target
            .file_name()
            .ok_or_else(|| named(path, io::Error::other("not a file name")))?
            .to_string_lossy()
            .into_owned();
        let dir = match target.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        cleanup_on_interrupt();
        for attempt in 0..1000u32 {
            let tmp = dir.join(format!(
                ".allocview-tmp-{}-{attempt}-{name}",
                std::process::id()
            ));
            // Created and listed under the lock, so an interrupt removes it.
            let mut files = in_progress();
            match OpenOptions::new().write(true).create_new(true).open(&tmp) {
                Ok(file) => {
                    files.push(tmp.clone());
                    drop(files);
                    let pending = Self {
                        tmp,
                        target,
                        committed: false,
                        direct: false,
                    };
                    // A replaced file keeps its permissions (a new one gets the umask's);
                    // only a regular file's, never those of what a link points to.
                    if let Ok(old) = fs::symlink_metadata(&pending.target)
                        && old.is_file()
                    {
                        file.set_permissions(old.permissions())
                            .map_err(|e| named(path, e))?;
                    }
                    return Ok((pending, file));
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(named(path, e)),
            }
        }
        Err(named(
            path,
            io::Error::other("no free temporary file name in its directory"),
        ))
    }

    /// Makes `path` the file the temporary one becomes (in the same directory: the temporary
    /// file stays where it is), refusing `inputs` as before.
    ///
    /// # Errors
    /// The refusal; an output that is not a regular file (written in place) cannot move.
    pub fn retarget(&mut self, path: &Path, inputs: &[&Path]) -> io::Result<()> {
        refuse_if_any_input(inputs, path)?;
        if self.direct {
            return Err(named(
                path,
                io::Error::other("the output is written in place and cannot be renamed"),
            ));
        }
        self.target = resolve_links(path);
        Ok(())
    }

    /// The temporary file's path, for libraries that write a file by path (it exists, empty;
    /// for an output that is not a regular file, the output itself).
    #[must_use]
    pub fn tmp_path(&self) -> &Path {
        &self.tmp
    }

    /// Flushes the temporary file to disk (`file`, or the file at [`Self::tmp_path`] when
    /// `None`) and renames it over the target.
    ///
    /// # Errors
    /// When the flush or the rename fails (the temporary file is then removed).
    pub fn commit(mut self, file: Option<File>) -> io::Result<()> {
        if self.direct {
            self.committed = true;
            return Ok(());
        }
        let file = match file {
            Some(f) => f,
            None => File::open(&self.tmp).map_err(|e| named(&self.target, e))?,
        };
        file.sync_all().map_err(|e| named(&self.target, e))?;
        drop(file);
        {
            let mut files = in_progress();
            fs::rename(&self.tmp, &self.target).map_err(|e| named(&self.target, e))?;
            files.retain(|p| p != &self.tmp);
        }
        self.committed = true;
        // The rename itself is durable once the directory is flushed; cheap, and not fatal.
        if let Some(dir) = self.target.parent().filter(|p| !p.as_os_str().is_empty())
            && let Ok(d) = File::open(dir)
        {
            d.sync_all().ok();
        }
        Ok(())
    }
}

impl Drop for PendingFile {
    fn drop(&mut self) {
        if !self.committed && !self.direct {
            let mut files = in_progress();
            fs::remove_file(&self.tmp).ok();
            files.retain(|p| p != &self.tmp);
        }
    }
}

/// An I/O error with the output's path in front.
fn named(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("cannot write {}: {e}", path.display()))
}

/// `path` with symbolic links to files followed (up to 40, as the kernel does), so that
/// writing replaces the link's target and keeps the link. A dangling link resolves to where
/// it points.
fn resolve_links(path: &Path) -> PathBuf {
    let mut p = path.to_path_buf();
    for _ in 0..40 {
        let is_link = fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_symlink());
        if !is_link {
            break;
        }
        let Ok(next) = fs::read_link(&p) else { break };
        p = if next.is_absolute() {
            next
        } else {
            p.parent().unwrap_or(Path::new(".")).join(next)
        };
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "allocview-safe-write-{name}-{}",
            std::process::id()
        ));
        fs::remove_dir_all(&dir).ok();
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn leftovers(dir: &Path) -> Vec<String> {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".allocview-tmp-"))
            .collect()
    }

    #[test]
    fn same_files_are_refused_however_they_are_named() {
        let dir = scratch("same");
        let a = dir.join("a.avt");
        fs::write(&a, b"input").unwrap();
        let hard = dir.join("hard.avt");
        fs::hard_link(&a, &hard).unwrap();
        let soft = dir.join("soft.avt");
        std::os::unix::fs::symlink("a.avt", &soft).unwrap();
        let spelled = dir.join(".").join("a.avt");
        for out in [&a, &hard, &soft, &spelled] {
            let e = refuse_if_same_file(&a, out).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
            let e = write_bytes(out, b"output", &[&a]).unwrap_err();
            assert!(e.to_string().contains("refusing"), "{e}");
        }
        assert_eq!(fs::read(&a).unwrap(), b"input");
        refuse_if_same_file(&a, &dir.join("other.avt")).unwrap();
        refuse_if_same_file(&dir.join("missing"), &a).unwrap();
        assert!(leftovers(&dir).is_empty());
        fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_failed_write_leaves_the_old_file_and_no_temporary() {
        let dir = scratch("fail");
        let out = dir.join("keep.csv");
        fs::write(&out, b"old contents").unwrap();
        let e = write_atomically(&out, &[], |w| {
            w.write_all(b"half of the new")?;
            Err::<(), _>(io::Error::other("the input is bad"))
        })
        .unwrap_err();
        assert!(e.to_string().contains("the input is bad"));
        assert_eq!(fs::read(&out).unwrap(), b"old contents");
        assert!(leftovers(&dir).is_empty());
        write_bytes(&out, b"new", &[]).unwrap();
        assert_eq!(fs::read(&out).unwrap(), b"new");
        assert!(leftovers(&dir).is_empty());
        fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn links_are_written_through_and_permissions_kept() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = scratch("link");
        let target = dir.join("real.csv");
        fs::write(&target, b"old").unwrap();
        fs::set_permissions(&target, fs::Permissions::from_mode(0o640)).unwrap();
        let link = dir.join("link.csv");
        std::os::unix::fs::symlink("real.csv", &link).unwrap();
        write_bytes(&link, b"new", &[]).unwrap();
        assert!(
            fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(fs::read(&target).unwrap(), b"new");
        let mode = fs::metadata(&target).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o640);
        fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn devices_and_pipes_are_written_in_place_never_replaced() {
        use std::os::unix::fs::FileTypeExt as _;
        write_bytes(Path::new("/dev/null"), b"gone", &[]).unwrap();
        assert!(
            fs::metadata("/dev/null")
                .unwrap()
                .file_type()
                .is_char_device()
        );
        assert!(leftovers(Path::new("/dev")).is_empty());
    }

    #[test]
    fn a_pending_file_keeps_the_extension_and_vanishes_when_dropped() {
        let dir = scratch("pending");
        let out = dir.join("chart.png");
        let (pending, _file) = PendingFile::create(&out, &[]).unwrap();
        assert!(pending.tmp_path().to_string_lossy().ends_with("chart.png"));
        assert!(pending.tmp_path().exists());
        let tmp = pending.tmp_path().to_path_buf();
        drop(pending);
        assert!(!tmp.exists());
        assert!(!out.exists());
        fs::remove_dir_all(&dir).ok();
    }
}
