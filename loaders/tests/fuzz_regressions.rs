//! Every input the fuzzer found a crash, a hang or a blow-up with (`fuzz/regressions/TARGET/`)
//! and the committed seeds (`fuzz/seeds/TARGET/`) loaded as their fuzz target loads them: each
//! load ends in a count or in an error that names the file, never in a panic.

// Test helpers may unwrap: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use allocview_loaders::fuzzing::{Outcome, Target, exercise, file_bytes};

fn fuzz_dir(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz")
        .join(rel)
}

/// (target, input file) for every file under `fuzz/<dir>/<target>/`.
fn inputs(dir: &str) -> Vec<(Target, PathBuf)> {
    let mut out = Vec::new();
    let Ok(targets) = std::fs::read_dir(fuzz_dir(dir)) else {
        return out;
    };
    for t in targets {
        let t = t.unwrap().path();
        let name = t.file_name().unwrap().to_string_lossy().into_owned();
        let target = Target::from_name(&name)
            .unwrap_or_else(|| panic!("fuzz/{dir}/{name}: no fuzz target of that name"));
        for f in std::fs::read_dir(&t).unwrap() {
            out.push((target, f.unwrap().path()));
        }
    }
    out.sort_by(|a, b| a.1.cmp(&b.1));
    out
}

fn check_all(dir: &str) -> usize {
    let scratch = std::env::temp_dir().join(format!(
        "allocview-fuzz-regressions-{dir}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&scratch).unwrap();
    let all = inputs(dir);
    for (target, input) in &all {
        let path = scratch.join(target.file_name());
        std::fs::write(&path, file_bytes(*target, &std::fs::read(input).unwrap())).unwrap();
        for outcome in exercise(*target, &path) {
            if let Outcome::Refused(e) = outcome {
                let message = e.to_string();
                assert!(
                    message.contains(target.file_name()),
                    "{}: the error does not name the file: {message}",
                    input.display()
                );
            }
        }
    }
    std::fs::remove_dir_all(&scratch).ok();
    all.len()
}

#[test]
fn every_regression_input_loads_or_is_refused_clearly() {
    let n = check_all("regressions");
    eprintln!("{n} regression inputs");
}

#[test]
fn every_committed_seed_loads_or_is_refused_clearly() {
    assert!(check_all("seeds") > 0, "fuzz/seeds/ is empty");
}
