//! `allocview bench`'s arguments, which every benchmark reads.

use std::path::PathBuf;

use allocview_sim::policy::spec::PolicySpec;
use anyhow::Result;

use crate::session::PolicyArgs;

/// Arguments of `allocview bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// What to measure: `explorer` (seek + redraw of the terminal explorer), `hops` (the
    /// terminal explorer on a trace too big to load, going to events all over it once its
    /// background read is done), `replay` (each policy's replay rate against the C library's
    /// malloc/free on the same trace), `load` (load time, rate and peak resident memory against
    /// the file size) or `stream` (a binary trace replayed from its blocks against loaded then
    /// replayed, per policy).
    pub what: String,
    /// The trace.
    pub file: PathBuf,
    #[command(flatten)]
    pub policies: PolicyArgs,
    /// Number of random seeks (`explorer`) or events to go to (`hops`).
    #[arg(long, default_value_t = 200)]
    pub seeks: usize,
    /// Screen size for the redraw, columns x rows.
    #[arg(long, default_value = "200x60")]
    pub size: String,
    /// Repetitions of each replay; the best is reported.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
}

/// The explorer benchmarks' policies: those asked for, or bfc alone.
pub(super) fn explorer_policies(args: &BenchArgs) -> Result<Vec<PolicySpec>> {
    if args.policies.policy.is_empty() {
        Ok(vec![PolicySpec::plain("bfc")])
    } else {
        args.policies.specs()
    }
}
