//! Knobs for every policy ([`PolicyConfig`]), and why a name and a configuration made no policy
//! ([`RegistryError`]).
//!
//! One config drives a whole `compare` run: each policy reads the fields it understands and
//! ignores the rest. It stands beside the [`Policy`](super::Policy) trait, apart from the
//! [`registry`](super::registry) that builds policies from it, so that every policy can take its
//! config without importing the factory that imports them all.

use std::sync::Arc;

use crate::policy::pytorch::settings::{PytorchScript, PytorchSettings};
use crate::predict::lifetime::{AllocFeatures, DEFAULT_SHORT_ALLOCS};

/// Knobs for every policy. Each policy reads the fields it understands and ignores the rest, so
/// one config can drive a whole `compare` run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyConfig {
    /// Alignment (a power of two) of every placement and rounding unit of the fit policies'
    /// reserved sizes. Default 16, as malloc on x86-64.
    pub align_bytes: u64,
    /// Upper bound on the footprint; an allocation that would push the footprint past it fails
    /// with out-of-memory. `None` means unlimited.
    pub limit_bytes: Option<u64>,
    /// Buddy: size of an order-0 block (a power of two). Default 256 B.
    pub buddy_min_block_bytes: u64,
    /// Buddy: highest order; a top-level block is `buddy_min_block_bytes << buddy_max_order`.
    /// Default 18, so the default top-level block is 256 B << 18 = 64 MiB.
    pub buddy_max_order: u32,
    /// Pool: size of each bump block. Default 64 MiB, as in alphaFM's memory pool.
    pub pool_block_bytes: u64,
    /// BFC: grow regions on demand (2 MiB, then doubling) instead of reserving the whole limit
    /// at once. Default true (TensorFlow's `allow_growth`).
    pub bfc_allow_growth: bool,
    /// BFC: release wholly free regions and retry when an allocation would otherwise fail.
    /// Default false.
    pub bfc_garbage_collection: bool,
    /// glibc: initial mmap threshold; requests at or above it are served by mmap until the
    /// dynamic threshold moves. Default 128 KiB (glibc's `DEFAULT_MMAP_THRESHOLD_MIN`).
    pub glibc_mmap_threshold_bytes: u64,
    /// PyTorch: the caching allocator's options. Default: PyTorch's defaults.
    pub pytorch: PytorchSettings,
    /// PyTorch: a snapshot's recorded start state and segment events, to replay it
    /// faithfully and score the replay. Default `None` (an empty allocator).
    pub pytorch_script: Option<Arc<PytorchScript>>,
    /// Predictive: a block freed before this many more allocations is short-lived. Default 64.
    pub predictive_short_allocs: u64,
    /// Predictive: class blocks by their true lifetimes (read from the trace's future) instead
    /// of predicting them: the upper bound of prediction. Default false.
    pub predictive_true_lifetimes: bool,
    /// Predictive: what is known at each allocation (threads' recent calls, sites), built by the
    /// frontend from the trace's thread and site columns. Default `None`: one thread, no sites.
    pub alloc_features: Option<Arc<AllocFeatures>>,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            align_bytes: 16,
            limit_bytes: None,
            buddy_min_block_bytes: 256,
            buddy_max_order: 18,
            pool_block_bytes: 64 << 20,
            bfc_allow_growth: true,
            bfc_garbage_collection: false,
            glibc_mmap_threshold_bytes: 128 << 10,
            pytorch: PytorchSettings::default(),
            pytorch_script: None,
            predictive_short_allocs: DEFAULT_SHORT_ALLOCS,
            predictive_true_lifetimes: false,
            alloc_features: None,
        }
    }
}

/// Why [`build`](super::registry::build) could not make a policy.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("unknown policy {name:?}; known policies: {}", known.join(", "))]
    UnknownPolicy {
        name: String,
        known: Vec<&'static str>,
    },
    #[error("policy {name:?}: invalid configuration: {reason}")]
    InvalidConfig { name: String, reason: String },
}

/// Maps a constructor's reason into [`RegistryError::InvalidConfig`] for policy `name`.
pub(crate) fn invalid(name: &str) -> impl Fn(String) -> RegistryError + '_ {
    move |reason| RegistryError::InvalidConfig {
        name: name.to_owned(),
        reason,
    }
}
