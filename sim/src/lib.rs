//! allocview's allocator simulator.
//!
//! - [`trace`]: the event vocabulary ([`trace::TraceView`]) that loaders hand over;
//! - [`policy`]: the [`policy::Policy`] trait and the policies;
//!
//! This crate knows nothing of files, polars or user interfaces.

pub mod policy;
pub mod trace;
