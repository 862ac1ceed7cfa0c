//! Builds the LD_PRELOAD tracer (`../tracer`, crate `allocview_tracer`) into `OUT_DIR` so the
//! binary can embed it (`allocview record` writes it to a private temporary file at run time):
//! users never build or install it separately.
//!
//! The tracer has no dependencies, so a single `rustc` call compiles it: no nested cargo (which
//! would wait on the lock of the build that runs this script), always optimised and with
//! `panic=abort`, whatever the profile of the surrounding build.
//!
//! Where no tracer can be had, an empty file is embedded and `allocview record` says that it is
//! unsupported there (the rest of allocview works everywhere): on targets other than 64-bit
//! Linux, and on 64-bit Linux other than x86-64 when the tracer fails to compile (a cargo
//! warning says why). On x86-64 Linux, the platform `record` is made for and CI builds on, a
//! tracer that fails to compile fails the build.
//!
//! The replay process of the real-allocator rows (`../replayer`, `allocview_replayer`) is
//! compiled and embedded the same way (`compare --policy real-jemalloc` writes it to a private
//! temporary directory and runs it there).

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=../tracer/src");
    println!("cargo:rerun-if-changed=../replayer/src");
    println!("cargo:rerun-if-changed=build.rs");
    let Some(out_dir) = env::var_os("OUT_DIR").map(PathBuf::from) else {
        panic!("cargo did not set OUT_DIR");
    };
    let out = out_dir.join("liballocview_tracer.so");
    let replayer = out_dir.join("allocview_replayer");
    let target_os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let pointer_width = env::var("CARGO_CFG_TARGET_POINTER_WIDTH").unwrap_or_default();
    if target_os != "linux" || pointer_width != "64" {
        no_tracer(&out, "not a 64-bit Linux target");
        no_replayer(&replayer, "not a 64-bit Linux target");
        return;
    }
    let manifest = env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_default();
    let on_x86_64 = env::var("CARGO_CFG_TARGET_ARCH").is_ok_and(|a| a == "x86_64");
    if let Some(failure) = compile(&manifest.join("../tracer/src/lib.rs"), "cdylib", &out) {
        if on_x86_64 {
            panic!("{failure}");
        }
        println!("cargo:warning={failure}; `allocview record` will say it is unsupported here");
        no_tracer(&out, "the tracer did not compile for this target");
    }
    // The replay process of the real-allocator rows (`real-glibc`, `real-jemalloc`, ...).
    let replayer_src = manifest.join("../replayer/src/main.rs");
    if let Some(failure) = compile(&replayer_src, "bin", &replayer) {
        if on_x86_64 {
            panic!("{failure}");
        }
        println!("cargo:warning={failure}; the real-allocator rows will say they are unsupported");
        no_replayer(&replayer, "the replayer did not compile for this target");
    }
}

/// Compiles the dependency-free crate at `src` (a `cdylib` or a `bin`) into `out`, optimised
/// and with `panic=abort`; returns why it failed, if it did.
fn compile(src: &std::path::Path, crate_type: &str, out: &std::path::Path) -> Option<String> {
    let name = match crate_type {
        "bin" => "allocview_replayer",
        _ => "allocview_tracer",
    };
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let mut cmd = Command::new(rustc);
    cmd.args([
        "--edition",
        "2024",
        "--crate-name",
        name,
        "--crate-type",
        crate_type,
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
        // A cross build links with the linker cargo was given for the target (CI's aarch64
        // check sets it): the host's `cc` cannot link for another architecture.
        let var = format!(
            "CARGO_TARGET_{}_LINKER",
            target.to_uppercase().replace(['-', '.'], "_")
        );
        println!("cargo:rerun-if-env-changed={var}");
        if let Ok(linker) = env::var(&var) {
            cmd.arg("-C").arg(format!("linker={linker}"));
        }
    }
    cmd.arg(src).arg("-o").arg(out);
    cmd.env(
        "CARGO_PKG_VERSION",
        env::var("CARGO_PKG_VERSION").unwrap_or_default(),
    );
    match cmd.status() {
        Ok(status) if status.success() => None,
        Ok(status) => Some(format!("compiling {} failed: {status}", src.display())),
        Err(e) => Some(format!(
            "cannot run rustc to compile {}: {e}",
            src.display()
        )),
    }
}

/// Embeds an empty replayer: the real-allocator rows then say they are unsupported, naming
/// `why` (set as `ALLOCVIEW_NO_REPLAYER` for the binary).
fn no_replayer(out: &std::path::Path, why: &str) {
    if let Err(e) = std::fs::write(out, b"") {
        panic!("cannot write {}: {e}", out.display());
    }
    println!("cargo:rustc-env=ALLOCVIEW_NO_REPLAYER={why}");
}

/// Embeds an empty tracer: `allocview record` then reports that it is unsupported, naming
/// `why` (set as `ALLOCVIEW_NO_TRACER` for the binary).
fn no_tracer(out: &std::path::Path, why: &str) {
    if let Err(e) = std::fs::write(out, b"") {
        panic!("cannot write {}: {e}", out.display());
    }
    println!("cargo:rustc-env=ALLOCVIEW_NO_TRACER={why}");
}
