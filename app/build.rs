//! Builds the LD_PRELOAD tracer (`../tracer`, crate `allocview_tracer`) into `OUT_DIR` so the
//! binary can embed it (`allocview record` writes it to a private temporary file at run time):
//! users never build or install it separately.
//!
//! The tracer has no dependencies, so a single `rustc` call compiles it: no nested cargo (which
//! would wait on the lock of the build that runs this script), always optimised and with
//! `panic=abort`, whatever the profile of the surrounding build.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=../tracer/src");
    println!("cargo:rerun-if-changed=build.rs");
    let Some(out_dir) = env::var_os("OUT_DIR").map(PathBuf::from) else {
        panic!("cargo did not set OUT_DIR");
    };
    let out = out_dir.join("liballocview_tracer.so");
    let target_os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let pointer_width = env::var("CARGO_CFG_TARGET_POINTER_WIDTH").unwrap_or_default();
    if target_os != "linux" || pointer_width != "64" {
        // `allocview record` reports that it is unsupported here.
        if let Err(e) = std::fs::write(&out, b"") {
            panic!("cannot write {}: {e}", out.display());
        }
        return;
    }
    let manifest = env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_default();
    let src = manifest.join("../tracer/src/lib.rs");
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let mut cmd = Command::new(rustc);
    cmd.args([
        "--edition",
        "2024",
        "--crate-name",
        "allocview_tracer",
        "--crate-type",
        "cdylib",
        "-C",
        "opt-level=3",
        "-C",
        "panic=abort",
        "-C",
        "strip=symbols",
        "-C",
        "debuginfo=0",
        // One unit: the hot path's helpers sit in several modules and must inline across them.
        "-C",
        "codegen-units=1",
    ]);
    if let Ok(target) = env::var("TARGET") {
        cmd.args(["--target", &target]);
    }
    cmd.arg(&src).arg("-o").arg(&out);
    cmd.env(
        "CARGO_PKG_VERSION",
        env::var("CARGO_PKG_VERSION").unwrap_or_default(),
    );
    match cmd.status() {
        Ok(status) if status.success() => {}
        Ok(status) => panic!("compiling the tracer {} failed: {status}", src.display()),
        Err(e) => panic!("cannot run rustc to compile the tracer: {e}"),
    }
}
