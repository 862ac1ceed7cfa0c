//! The session: what every frontend (the commands, the explorers' view-model, the Python
//! package) stands on to open an input and replay it. Nothing here prints a command's output
//! or draws.
//!
//! - [`options`]: the option groups, [`InputArgs`] (`--lenient` and a window),
//!   [`WindowArgs`] (`--from`, `--to`, `--events`), [`StreamArgs`] (`--stream`,
//!   `--no-stream`) and [`PolicyArgs`] (`--policy`, `--limit`, `--align`, `--jobs`);
//! - [`input`]: opening a file, with progress and the loader's warnings; what an explorer
//!   opens of it (whole, a window, or the first part of a trace too big to load); and the
//!   events or sites of what was loaded;
//! - [`window`]: a part of a trace, cut from a loaded one;
//! - [`mode`]: loaded or streamed, and what fits in memory;
//! - [`source`]: a binary trace read block by block, whole or a window of it;
//! - [`policies`]: the policies to replay and their configuration for an input, and what the
//!   `predictive` policy knows of each allocation;
//! - [`runs`]: replaying one input through several policies on threads, loaded or streamed;
//! - [`oracle`]: the offline oracle's plan of a streamed trace, made piecewise and spilled to
//!   a temporary file.
//!

pub mod input;
pub mod mode;
pub mod options;
pub mod oracle;
pub mod policies;
pub mod runs;
pub mod source;
pub mod window;

pub use options::{InputArgs, PolicyArgs, StreamArgs, WindowArgs};
