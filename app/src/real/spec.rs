//! A real-allocator row as the user writes it: `real-jemalloc:dirty_decay_ms=0,narenas=2`, the
//! allocator, its settings (passed in the environment variable that allocator reads, so each
//! row says the exact line a user would set), and the replay's own keys (`touch`, `threads`,
//! `lib`).

use std::path::{Path, PathBuf};

use allocview_sim::policy::spec::variant_params;
use anyhow::{Result, bail};

/// The allocators a real row can replay through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allocator {
    Glibc,
    Jemalloc,
    Mimalloc,
    Tcmalloc,
}

/// Every real row's name, in the order they are listed.
pub const REAL_NAMES: &[&str] = &[
    "real-glibc",
    "real-jemalloc",
    "real-mimalloc",
    "real-tcmalloc",
];

/// What each allocator is: its shared object's names, the package that installs it, and the
/// settings it reads (the key a variant takes; how it goes into the environment).
struct Known {
    allocator: Allocator,
    name: &'static str,
    /// File names of the shared object, most likely first (none for glibc: the C library).
    sonames: &'static [&'static str],
    install: &'static str,
    keys: &'static [&'static str],
}

const KNOWN: &[Known] = &[
    Known {
        allocator: Allocator::Glibc,
        name: "real-glibc",
        sonames: &[],
        install: "",
        // GLIBC_TUNABLES's glibc.malloc.* (glibc 2.26 on).
        keys: &[
            "arena_max",
            "arena_test",
            "mmap_threshold",
            "mmap_max",
            "trim_threshold",
            "top_pad",
            "tcache_count",
            "tcache_max",
            "tcache_unsorted_limit",
            "mxfast",
            "hugetlb",
        ],
    },
    Known {
        allocator: Allocator::Jemalloc,
        name: "real-jemalloc",
        sonames: &["libjemalloc.so.2", "libjemalloc.so"],
        install: "Debian/Ubuntu: apt-get install libjemalloc2; Fedora: dnf install jemalloc",
        // MALLOC_CONF's options (jemalloc 5).
        keys: &[
            "dirty_decay_ms",
            "muzzy_decay_ms",
            "narenas",
            "background_thread",
            "tcache",
            "tcache_max",
            "lg_tcache_max",
            "retain",
            "percpu_arena",
            "metadata_thp",
            "thp",
            "oversize_threshold",
            "lg_extent_max_active_fit",
        ],
    },
    Known {
        allocator: Allocator::Mimalloc,
        name: "real-mimalloc",
        sonames: &["libmimalloc.so.2", "libmimalloc.so"],
        install: "Debian/Ubuntu: apt-get install libmimalloc2.0; Fedora: dnf install mimalloc",
        // MIMALLOC_<KEY> (mimalloc 2.0).
        keys: &[
            "eager_commit",
            "eager_commit_delay",
            "large_os_pages",
            "reserve_huge_os_pages",
            "reserve_os_memory",
            "reset_delay",
            "allow_decommit",
            "segment_decommit_delay",
            "abandoned_page_decommit",
            "abandoned_page_reset",
            "use_numa_nodes",
            "limit_os_alloc",
            "max_segment_reclaim",
        ],
    },
    Known {
        allocator: Allocator::Tcmalloc,
        name: "real-tcmalloc",
        sonames: &["libtcmalloc_minimal.so.4", "libtcmalloc.so.4"],
        install: "Debian/Ubuntu: apt-get install libtcmalloc-minimal4; Fedora: dnf install \
                  gperftools-libs",
        // TCMALLOC_<KEY> (gperftools).
        keys: &[
            "release_rate",
            "max_total_thread_cache_bytes",
            "aggressive_decommit",
            "transfer_num_obj",
            "heap_limit_mb",
            "disable_memory_release",
            "skip_sbrk",
            "skip_mmap",
        ],
    },
];

/// Where shared objects are looked for, in order: the target's multiarch folder first.
const LIB_DIRS: &[&str] = &[
    #[cfg(target_arch = "x86_64")]
    "/usr/lib/x86_64-linux-gnu",
    #[cfg(target_arch = "aarch64")]
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
    #[cfg(target_arch = "x86_64")]
    "/lib/x86_64-linux-gnu",
    #[cfg(target_arch = "aarch64")]
    "/lib/aarch64-linux-gnu",
    "/lib64",
];

/// Which pages of each allocation the replay writes when it is allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Touch {
    None,
    First,
    All,
}

impl Touch {
    /// The replayer's code for it.
    #[must_use]
    pub fn code(self) -> u8 {
        match self {
            Self::None => 0,
            Self::First => 1,
            Self::All => 2,
        }
    }

    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::First => "first",
            Self::All => "all",
        }
    }
}

/// A real-allocator row: the allocator, its settings, and how the replay runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RealSpec {
    pub allocator: Allocator,
    /// The text the user wrote, normalised (`real-jemalloc:dirty_decay_ms=0:narenas=2`).
    pub label: String,
    /// The allocator's own settings, in the order given.
    pub settings: Vec<(String, String)>,
    pub touch: Touch,
    /// `threads=one`: every call on one OS thread.
    pub one_thread: bool,
    /// `lib=PATH`: the shared object to load instead of the installed one.
    pub lib: Option<PathBuf>,
}

/// Whether `text` names a real-allocator row (`real-...`).
#[must_use]
pub fn is_real(text: &str) -> bool {
    text.trim().starts_with("real-")
}

impl RealSpec {
    /// Parses `real-NAME[:key=value...]`.
    ///
    /// # Errors
    /// An unknown allocator, an unknown key, a key given twice or a bad value.
    pub fn parse(text: &str) -> Result<Self> {
        let text = text.trim();
        let (base, rest) = text.split_once(':').unwrap_or((text, ""));
        let Some(known) = KNOWN.iter().find(|k| k.name == base.trim()) else {
            bail!(
                "unknown real allocator {:?}; known: {}",
                base.trim(),
                REAL_NAMES.join(", ")
            );
        };
        let mut spec = Self {
            allocator: known.allocator,
            label: known.name.to_owned(),
            settings: Vec::new(),
            touch: Touch::All,
            one_thread: false,
            lib: None,
        };
        let mut seen: Vec<String> = Vec::new();
        for p in variant_params(rest) {
            let Some((k, v)) = p.split_once('=') else {
                bail!("{text}: parameter {p:?} is not key=value");
            };
            let (k, v) = (k.trim(), v.trim());
            if seen.iter().any(|s| s == k) {
                bail!("{text}: parameter {k:?} given twice");
            }
            seen.push(k.to_owned());
            spec.label.push_str(&format!(":{k}={v}"));
            match k {
                "touch" => {
                    spec.touch = match v {
                        "none" => Touch::None,
                        "first" => Touch::First,
                        "all" => Touch::All,
                        _ => bail!("{text}: touch is none, first or all, not {v:?}"),
                    }
                }
                "threads" => {
                    spec.one_thread = match v {
                        "one" => true,
                        "each" => false,
                        _ => bail!("{text}: threads is one or each, not {v:?}"),
                    }
                }
                "lib" => spec.lib = Some(PathBuf::from(v)),
                _ if known.keys.contains(&k) => {
                    // Numbers (`-1` turns jemalloc's decay off, `0.5` is a tcmalloc rate) and
                    // words; nothing that would end the variable's list of settings.
                    let allowed = |c: u8| c.is_ascii_alphanumeric() || b"_.-".contains(&c);
                    if v.is_empty() || !v.bytes().all(allowed) {
                        bail!("{text}: {k} takes a number or a word, not {v:?}");
                    }
                    spec.settings.push((k.to_owned(), v.to_owned()));
                }
                _ => bail!(
                    "{} has no parameter {k:?}; it takes: touch, threads, lib, {}",
                    known.name,
                    known.keys.join(", ")
                ),
            }
        }
        Ok(spec)
    }

    fn known(&self) -> &'static Known {
        KNOWN
            .iter()
            .find(|k| k.allocator == self.allocator)
            .unwrap_or(&KNOWN[0])
    }

    /// The shared object to preload (`None` for glibc: the C library serves the calls).
    ///
    /// # Errors
    /// When it is not installed (or `lib=` names no file): which file, and how to install it.
    pub fn library(&self) -> Result<Option<PathBuf>> {
        let known = self.known();
        if let Some(lib) = &self.lib {
            if !lib.is_file() {
                bail!("{}: lib={} is not a file", self.label, lib.display());
            }
            return Ok(Some(lib.clone()));
        }
        if known.sonames.is_empty() {
            return Ok(None);
        }
        for dir in LIB_DIRS {
            for so in known.sonames {
                let path = Path::new(dir).join(so);
                if path.is_file() {
                    return Ok(Some(path));
                }
            }
        }
        bail!(
            "{} replays through {}, which is not installed here (looked in {}); install it ({}), \
             or name the file: {}:lib=/path/to/{}",
            self.label,
            known.sonames.first().copied().unwrap_or_default(),
            LIB_DIRS.join(", "),
            known.install,
            known.name,
            known.sonames.first().copied().unwrap_or_default()
        )
    }

    /// The environment the allocator reads its settings from, as `(variable, value)`.
    #[must_use]
    pub fn settings_env(&self) -> Vec<(String, String)> {
        if self.settings.is_empty() {
            return Vec::new();
        }
        let join = |sep: &str, f: &dyn Fn(&(String, String)) -> String| {
            self.settings.iter().map(f).collect::<Vec<_>>().join(sep)
        };
        match self.allocator {
            Allocator::Glibc => vec![(
                "GLIBC_TUNABLES".to_owned(),
                join(":", &|(k, v)| format!("glibc.malloc.{k}={v}")),
            )],
            Allocator::Jemalloc => vec![(
                "MALLOC_CONF".to_owned(),
                join(",", &|(k, v)| format!("{k}:{v}")),
            )],
            Allocator::Mimalloc => self
                .settings
                .iter()
                .map(|(k, v)| (format!("MIMALLOC_{}", k.to_uppercase()), v.clone()))
                .collect(),
            Allocator::Tcmalloc => self
                .settings
                .iter()
                .map(|(k, v)| (format!("TCMALLOC_{}", k.to_uppercase()), v.clone()))
                .collect(),
        }
    }

    /// The line a user sets to run their program so (`LD_PRELOAD=... MALLOC_CONF=...`), or
    /// what glibc needs: nothing, or its tunables.
    #[must_use]
    pub fn env_line(&self, library: Option<&Path>) -> String {
        let mut parts: Vec<String> = Vec::new();
        if let Some(lib) = library {
            parts.push(format!("LD_PRELOAD={}", lib.display()));
        }
        for (k, v) in self.settings_env() {
            parts.push(format!("{k}={v}"));
        }
        parts.join(" ")
    }
}

/// Environment variables that would change how the replay's allocator behaves, which the
/// replay process does not inherit: the rows measure the settings they name, nothing else.
#[must_use]
pub fn is_allocator_env(name: &str) -> bool {
    name == "LD_PRELOAD"
        || name == "GLIBC_TUNABLES"
        || ["MALLOC_", "MIMALLOC_", "TCMALLOC_", "JEMALLOC_", "_RJEM_"]
            .iter()
            .any(|p| name.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_become_the_environment_each_allocator_reads() {
        let s = RealSpec::parse("real-jemalloc:dirty_decay_ms=0,narenas=2").unwrap();
        assert_eq!(s.label, "real-jemalloc:dirty_decay_ms=0:narenas=2");
        assert_eq!(
            s.env_line(Some(Path::new("/l/libjemalloc.so.2"))),
            "LD_PRELOAD=/l/libjemalloc.so.2 MALLOC_CONF=dirty_decay_ms:0,narenas:2"
        );
        let g = RealSpec::parse("real-glibc:arena_max=2:mmap_threshold=131072").unwrap();
        assert_eq!(
            g.env_line(None),
            "GLIBC_TUNABLES=glibc.malloc.arena_max=2:glibc.malloc.mmap_threshold=131072"
        );
        let m = RealSpec::parse("real-mimalloc:eager_commit=0,touch=first").unwrap();
        assert_eq!(
            m.settings_env(),
            [("MIMALLOC_EAGER_COMMIT".into(), "0".into())]
        );
        assert_eq!(m.touch, Touch::First);
        let t = RealSpec::parse("real-tcmalloc:release_rate=10:threads=one").unwrap();
        assert_eq!(
            t.settings_env(),
            [("TCMALLOC_RELEASE_RATE".into(), "10".into())]
        );
        assert!(t.one_thread);
    }

    #[test]
    fn unknown_names_keys_and_values_are_refused() {
        assert!(RealSpec::parse("real-hoard").is_err());
        let e = RealSpec::parse("real-jemalloc:arena_max=2").unwrap_err();
        assert!(e.to_string().contains("dirty_decay_ms"), "{e}");
        assert!(RealSpec::parse("real-glibc:touch=some").is_err());
        assert!(RealSpec::parse("real-glibc:arena_max=2:arena_max=3").is_err());
        // A value is a number or a word: nothing that would end the variable's list.
        assert!(RealSpec::parse("real-jemalloc:narenas=2:x").is_err());
        assert!(RealSpec::parse("real-jemalloc:narenas=2;rm").is_err());
        // Negative and fractional numbers are settings too.
        assert!(RealSpec::parse("real-jemalloc:dirty_decay_ms=-1").is_ok());
        assert!(RealSpec::parse("real-tcmalloc:release_rate=0.5").is_ok());
    }

    #[test]
    fn a_missing_library_says_how_to_install_it() {
        let s = RealSpec::parse("real-jemalloc:lib=/nonexistent/libjemalloc.so.2").unwrap();
        assert!(s.library().is_err());
        let glibc = RealSpec::parse("real-glibc").unwrap();
        assert_eq!(glibc.library().unwrap(), None);
    }
}
