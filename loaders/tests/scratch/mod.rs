//! Scratch files for tests, each in a folder of its own that goes when the test drops its
//! guard, so that test runs leave nothing behind in the temporary directory (they had left
//! about sixty folders a run). Shared with `app/tests` through `#[path]`.

// Each test crate that includes this uses a part of it.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::ops::Deref;
use std::path::{Path, PathBuf};

/// A path in a new folder, removed with the folder when this is dropped.
#[derive(Debug)]
pub struct Scratch {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

/// A new folder of the temporary directory, named from `prefix`, removed when dropped.
pub fn scratch_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("a scratch folder in the temporary directory")
}

/// `name` in a new folder named from `prefix`; nothing is created at the path itself.
pub fn scratch(prefix: &str, name: &str) -> Scratch {
    let dir = scratch_dir(prefix);
    Scratch {
        path: dir.path().join(name),
        _dir: dir,
    }
}

impl Deref for Scratch {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<OsStr> for Scratch {
    fn as_ref(&self) -> &OsStr {
        self.path.as_os_str()
    }
}
