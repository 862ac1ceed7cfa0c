//! `allocview bench`: figures for the speed targets, measured in one process and one run.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use ratatui::Terminal;
use ratatui::backend::TestBackend;

use crate::model::state::{AppState, Msg, update};
use crate::tui;

/// Arguments of `allocview bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// What to measure: `explorer` (seek + redraw of the terminal explorer).
    pub what: String,
    /// The trace.
    pub file: PathBuf,
    #[command(flatten)]
    pub policies: super::compare::PolicyArgs,
    /// Number of random seeks.
    #[arg(long, default_value_t = 200)]
    pub seeks: usize,
    /// Screen size for the redraw, columns x rows.
    #[arg(long, default_value = "200x60")]
    pub size: String,
}

/// Runs `allocview bench`.
pub fn run(args: &BenchArgs) -> Result<()> {
    match args.what.as_str() {
        "explorer" => explorer(args),
        other => bail!("unknown benchmark {other:?}; known: explorer"),
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or(0.0)
}

fn explorer(args: &BenchArgs) -> Result<()> {
    let (w, h) = args
        .size
        .split_once('x')
        .and_then(|(w, h)| Some((w.parse::<u16>().ok()?, h.parse::<u16>().ok()?)))
        .context("--size must look like 200x60")?;
    let names = args.policies.names()?;
    let names = if args.policies.policy.is_empty() {
        vec!["bfc"]
    } else {
        names
    };
    let config = args.policies.config()?;
    let mut state = AppState::new(&args.file, &names, config);
    let started = Instant::now();
    crate::model::state::load_blocking(&mut state, false, 1).map_err(anyhow::Error::msg)?;
    let ready = started.elapsed().as_secs_f64();
    let loaded_at = state.data.as_ref().map(|d| d.trace.load_seconds);
    let n = state.events();
    let vm_rss = rss_bytes();
    let mut terminal = Terminal::new(TestBackend::new(w, h))?;
    // Idle frames: nothing changes, the view-model is recomputed and drawn.
    tui::render(&mut terminal, &mut state)?;
    let mut idle = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        tui::render(&mut terminal, &mut state)?;
        idle.push(t.elapsed().as_secs_f64() * 1e3);
    }
    // Seeks to events spread over the whole trace (a fixed pseudo-random sequence).
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut seeks = Vec::new();
    for _ in 0..args.seeks {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let target = (x % n.max(1) as u64) as usize;
        let t = Instant::now();
        update(&mut state, Msg::Home);
        update(&mut state, Msg::Step(target as i64));
        tui::render(&mut terminal, &mut state)?;
        seeks.push(t.elapsed().as_secs_f64() * 1e3);
    }
    idle.sort_by(f64::total_cmp);
    seeks.sort_by(f64::total_cmp);
    println!(
        "{}: {} events, policies {}",
        args.file.display(),
        crate::format::count(n as u64),
        names.join(",")
    );
    println!(
        "  load {:.2} s, load + replays + class series {:.2} s",
        loaded_at.unwrap_or(0.0),
        ready
    );
    println!(
        "  idle frame ({}x{}): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        w,
        h,
        percentile(&idle, 0.5),
        percentile(&idle, 0.99),
        idle.last().copied().unwrap_or(0.0)
    );
    println!(
        "  seek + redraw ({} seeks): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        seeks.len(),
        percentile(&seeks, 0.5),
        percentile(&seeks, 0.99),
        seeks.last().copied().unwrap_or(0.0)
    );
    if let Some(rss) = vm_rss {
        println!(
            "  resident memory after load and replay: {} = {:.1} bytes/event",
            crate::format::bytes(rss),
            rss as f64 / n.max(1) as f64
        );
    }
    Ok(())
}

/// Current resident set size, from /proc (Linux).
fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
