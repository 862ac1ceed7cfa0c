//! allocview's allocator simulator.
//!
//! - [`trace`]: the event vocabulary ([`trace::TraceView`]) that loaders hand over;
//! - [`policy`]: the [`policy::Policy`] trait and the policies;
//! - [`replay`]: the replay engine ([`replay::replay`]), with [`metrics`], downsampled [`series`]
//!   and per-size-class [`classes`];
//!
//! This crate knows nothing of files, polars or user interfaces.

pub mod classes;
pub mod metrics;
pub mod policy;
pub mod replay;
pub mod series;
pub mod trace;
