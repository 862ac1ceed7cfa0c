//! Which file the follower reads: the recording `record` is writing of the output, or the
//! output itself once finished.
//!
//! While the program runs, `record` writes each process image's trace into a hidden
//! temporary file beside the output, `.allocview-tmp-WRITER-N-NAME` ([`crate::safe_write`]),
//! under the image's per-process name (`run.PID.avt`, `run.PID-G.avt` after its G-th `exec`),
//! and renames each over its final name when the program has ended: the output itself when
//! the program ran one image, else the per-process names. Of the newest writer's files the
//! follower reads the first process's (the lowest pid: the program's own), in its newest image
//! (a program started through `env` or a shell `exec`s the one that works), and stays with that
//! file once chosen: at the end `record` renames the files one at a time, and the others are
//! other processes.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The file to read: a recording in progress, or a finished trace.
pub(super) struct Found {
    pub(super) path: PathBuf,
    /// The recording it belongs to, while it is written.
    pub(super) chosen: Option<Chosen>,
    /// Device and inode: the same file across its rename.
    pub(super) inode: (u64, u64),
    pub(super) bytes: u64,
    pub(super) ended: bool,
}

/// The file of one process image of one `record`, once chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Chosen {
    /// The pid of the `record` writing it.
    writer: u32,
    /// Its process's pid and exec generation.
    process: (u32, u32),
    /// Its name when finished (`run.PID.avt`; the output's when it is the only one).
    name: String,
}

/// Where to read `output`'s recording (see the module docs): `chosen` is the file read so far;
/// a finished trace older than `since` is not shown (it is an earlier run's).
pub(super) fn locate(
    output: &Path,
    chosen: Option<&Chosen>,
    since: Option<SystemTime>,
) -> Option<Found> {
    // `record` writes through a link to its target, in the target's folder.
    let output = std::fs::canonicalize(output).unwrap_or_else(|_| output.to_path_buf());
    let name = output.file_name()?.to_str()?.to_owned();
    let dir = match output.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let candidates = in_progress(&dir, &name);
    let newest_writer = candidates
        .iter()
        .max_by_key(|(modified, _)| *modified)
        .and_then(|(_, f)| f.chosen.as_ref())
        .map(|c| c.writer);
    if let Some(writer) = newest_writer {
        let ours = |f: &Found| f.chosen.as_ref().is_some_and(|c| c.writer == writer);
        let mine = chosen.filter(|c| c.writer == writer);
        let pid = match mine {
            Some(c) => Some(c.process.0),
            None => candidates
                .iter()
                .filter(|(_, f)| ours(f))
                .filter_map(|(_, f)| f.chosen.as_ref().map(|c| c.process.0))
                .min(),
        };
        // Never back to an earlier image than the one chosen.
        let since_generation = mine.map_or(0, |c| c.process.1);
        let newest_image = candidates
            .into_iter()
            .map(|(_, f)| f)
            .filter(|f| {
                ours(f)
                    && f.chosen.as_ref().is_some_and(|c| {
                        Some(c.process.0) == pid && c.process.1 >= since_generation
                    })
            })
            .max_by_key(|f| f.chosen.as_ref().map(|c| c.process.1));
        match (newest_image, mine) {
            (Some(found), _) => return Some(found),
            // The chosen file is finished (the others are other processes').
            (None, Some(c)) => return finished(&output, Some(&c.name), None),
            (None, None) => {}
        }
    }
    finished(&output, chosen.map(|c| c.name.as_str()), since)
}

/// The recordings in progress in `dir` of the output `name`, with their modification times.
fn in_progress(dir: &Path, name: &str) -> Vec<(SystemTime, Found)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let file = entry.file_name();
        let Some(file) = file.to_str() else { continue };
        let Some(rest) = file.strip_prefix(".allocview-tmp-") else {
            continue;
        };
        // `WRITER-ATTEMPT-NAME`.
        let mut parts = rest.splitn(3, '-');
        let (Some(writer), Some(_), Some(written)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let (Ok(writer), Some(process)) = (writer.parse::<u32>(), process_of(name, written)) else {
            continue;
        };
        if !Path::new(&format!("/proc/{writer}")).exists() {
            continue;
        }
        let Ok(m) = entry.metadata() else { continue };
        out.push((
            m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            Found {
                path: entry.path(),
                chosen: Some(Chosen {
                    writer,
                    process,
                    name: written.to_owned(),
                }),
                inode: (m.dev(), m.ino()),
                bytes: m.len(),
                ended: false,
            },
        ));
    }
    out
}

/// A finished trace: the chosen process's (`name`), else the output; not one older than
/// `since`.
fn finished(output: &Path, name: Option<&str>, since: Option<SystemTime>) -> Option<Found> {
    let path = name
        .map(|n| output.with_file_name(n))
        .filter(|p| p.exists())
        .unwrap_or_else(|| output.to_path_buf());
    let m = std::fs::metadata(&path).ok()?;
    if since.is_some_and(|s| m.modified().is_ok_and(|t| t < s)) {
        return None;
    }
    Some(Found {
        path,
        chosen: None,
        inode: (m.dev(), m.ino()),
        bytes: m.len(),
        ended: true,
    })
}

/// Whether `written` is the output `name` or one of its per-process names (`stem.PID.ext`,
/// `stem.PID-N.ext`): the process's pid and exec generation (`(0, 0)` for the name itself).
fn process_of(name: &str, written: &str) -> Option<(u32, u32)> {
    if written == name {
        return Some((0, 0));
    }
    let (stem, ext) = match name.find('.') {
        Some(dot) if dot > 0 => name.split_at(dot),
        _ => (name, ""),
    };
    let tag = written
        .strip_prefix(stem)?
        .strip_prefix('.')?
        .strip_suffix(ext)?;
    let (pid, generation) = tag.split_once('-').unwrap_or((tag, "0"));
    Some((pid.parse().ok()?, generation.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("allocview-follow-{name}-{}", std::process::id()));
        std::fs::remove_dir_all(&d).ok();
        std::fs::create_dir_all(&d).unwrap();
        d.canonicalize().unwrap()
    }

    #[test]
    fn a_recording_in_progress_is_found_before_the_finished_output() {
        let d = scratch("locate");
        let out = d.join("run.avt");
        assert!(locate(&out, None, None).is_none());
        std::fs::write(&out, b"old").unwrap();
        let f = locate(&out, None, None).unwrap();
        assert!(f.ended);
        assert_eq!(f.path, out);
        // An earlier run's trace is not shown to a follower started later.
        let later = SystemTime::now() + std::time::Duration::from_secs(5);
        assert!(locate(&out, None, Some(later)).is_none());
        // A writer that is alive (this process) writing two processes' traces (the first in
        // two images), and one that is gone.
        let me = std::process::id();
        let tmp = |n: &str| d.join(format!(".allocview-tmp-{me}-0-{n}"));
        std::fs::write(tmp("run.4242.avt"), b"env, then exec").unwrap();
        std::fs::write(tmp("run.4242-1.avt"), b"the program").unwrap();
        std::fs::write(tmp("run.4250.avt"), b"a child").unwrap();
        std::fs::write(d.join(".allocview-tmp-999999999-0-run.avt"), b"dead").unwrap();
        // Another output's recording in the same folder.
        std::fs::write(tmp("other.avt"), b"x").unwrap();
        std::fs::write(tmp("runner.1.avt"), b"x").unwrap();
        let f = locate(&out, None, None).unwrap();
        assert!(!f.ended);
        assert_eq!(f.path, tmp("run.4242-1.avt"));
        assert_eq!(f.bytes, 11);
        // Once its file is finished, the follower stays with it, not another process's.
        let chosen = f.chosen.unwrap();
        std::fs::rename(tmp("run.4242-1.avt"), d.join("run.4242-1.avt")).unwrap();
        let f = locate(&out, Some(&chosen), None).unwrap();
        assert!(f.ended);
        assert_eq!(f.path, d.join("run.4242-1.avt"));
        // One process's trace is renamed to the output itself.
        std::fs::remove_file(d.join("run.4242-1.avt")).unwrap();
        let f = locate(&out, Some(&chosen), None).unwrap();
        assert_eq!(f.path, out);
        assert_eq!(process_of("run.avt", "run.avt"), Some((0, 0)));
        assert_eq!(process_of("run.avt", "run.12-3.avt"), Some((12, 3)));
        assert_eq!(process_of("run.avt", "runner.12.avt"), None);
        assert_eq!(process_of("trace", "trace.7"), Some((7, 0)));
        std::fs::remove_dir_all(&d).ok();
    }
}
