//! What the commands answer, as values and JSON objects, for every frontend: the command line
//! prints them (`--json` prints these objects as they are), the Python package returns them.
//! Each answer takes a loaded input and plain options, never a command's arguments.
//!
//! - [`stats`]: `stats --json` (a trace's summary, a TensorFlow log's or dump's, a PyTorch
//!   snapshot's, a plan's);
//! - [`compare`]: `compare`'s rows (one per policy), its minimum limits and its series;
//! - [`recorded_memory`]: the recorded program's own resident memory, beside its live bytes;
//! - [`series`]: every replayed policy's series as one table (`report`'s `timeline.csv`);
//! - [`sites`]: `sites --json`, memory attributed to the code that asked for it;
//! - [`predict`]: `predict --json`, how predictable the allocation stream is;
//! - [`tables`]: the tables `convert OUT.parquet` writes;
//! - [`tune`]: `tune`, the settings of an allocator family that fit a limit, found by a search.

pub mod compare;
pub mod marks;
pub mod predict;
pub mod recorded_memory;
pub mod report;
pub mod series;
pub mod sites;
pub mod stats;
pub mod tables;
pub mod tune;
