//! allocview's allocator simulator.
//!
//! - [`trace`]: the event vocabulary ([`trace::TraceView`]) that loaders hand over;
//! - [`heap`]: the words of a simulated heap (addresses, requests, placements, blocks, counters)
//!   that the policies, the replay, the [`layout`] index, [`metrics`] and [`series`] share;
//! - [`policy`]: the [`policy::Policy`] trait, the policies, the knobs they read
//!   ([`policy::config`]) and the [`policy::registry`] that builds one by name;
//! - [`replay`]: the replay engine ([`replay::replay`]), with [`metrics`], downsampled [`series`]
//!   and per-size-class [`classes`];
//! - [`stream`]: the same replay over events read in batches, for traces larger than memory;
//! - [`plan`]: static memory planners over buffer lifetimes (TFLite, MegEngine, minimalloc-style search);
//! - [`predict`]: how predictable the allocation stream is (the article's tokens, context models,
//!   their evaluation) and the lifetime predictor of the `predictive` policy;
//!
//! This crate knows nothing of files, polars or user interfaces.

pub mod classes;
mod hash;
pub mod heap;
pub mod layout;
pub mod metrics;
pub mod min_limit;
pub mod plan;
pub mod policy;
pub mod predict;
pub mod replay;
pub mod series;
pub mod spill;
pub mod stream;
pub mod testing;
pub mod trace;
pub mod units;
