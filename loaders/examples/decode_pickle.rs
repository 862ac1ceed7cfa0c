//! Decodes a pickle (a PyTorch memory snapshot) and prints how long it took and how much memory
//! the process needed at its peak:
//!
//! ```text
//! cargo build --profile bench -p allocview_loaders --example decode_pickle
//! target/bench/examples/decode_pickle SNAPSHOT.pickle
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use allocview_loaders::pytorch::pickle;

/// A `kB` field of `/proc/self/status` (`VmHWM` is the peak resident set), in bytes.
fn status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

fn main() -> ExitCode {
    let Some(path) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: decode_pickle FILE.pickle");
        return ExitCode::FAILURE;
    };
    let start = Instant::now();
    let decoded = match pickle::decode_file(&path, None) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let secs = start.elapsed().as_secs_f64();
    let size = decoded.bytes_read();
    let peak = status_bytes("VmHWM:").unwrap_or(0);
    let rss = status_bytes("VmRSS:").unwrap_or(0);
    println!(
        "{}: {size} bytes ({:.1} MiB), protocol {}",
        path.display(),
        mib(size),
        decoded.protocol()
    );
    println!(
        "decode: {secs:.2} s, {:.0} MB/s; peak RSS {:.1} MiB ({:.2} x the file), RSS after {:.1} MiB",
        size as f64 / secs / 1e6,
        mib(peak),
        peak as f64 / size as f64,
        mib(rss)
    );
    println!(
        "graph: {} containers, {} strings, {} dict shapes, {:.1} MiB of tables ({:.2} x the file)",
        decoded.containers(),
        decoded.strings(),
        decoded.shapes(),
        mib(decoded.heap_bytes() as u64),
        decoded.heap_bytes() as f64 / size as f64
    );

    // Walk the first device's trace as a loader would, counting entries by action.
    let start = Instant::now();
    let root = decoded.root();
    let trace = root
        .get("device_traces")
        .and_then(|t| t.seq()?.next())
        .and_then(|t| t.seq());
    if let (Some(trace), Some(action)) = (trace, decoded.key("action")) {
        let mut counts: Vec<(&str, u64)> = Vec::new();
        let mut frames = 0u64;
        for entry in trace {
            let name = entry
                .get_key(action)
                .and_then(|v| v.as_str())
                .unwrap_or("?");
            match counts.iter_mut().find(|(n, _)| *n == name) {
                Some((_, c)) => *c += 1,
                None => counts.push((name, 1)),
            }
            frames += entry
                .get("frames")
                .and_then(|f| f.item_count())
                .unwrap_or(0) as u64;
        }
        counts.sort_unstable();
        let total: u64 = counts.iter().map(|(_, c)| c).sum();
        println!(
            "trace: {total} entries ({}), {frames} frame references; walked in {:.2} s",
            counts
                .iter()
                .map(|(n, c)| format!("{n} {c}"))
                .collect::<Vec<_>>()
                .join(", "),
            start.elapsed().as_secs_f64()
        );
    }
    ExitCode::SUCCESS
}
