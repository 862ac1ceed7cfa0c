//! `allocview` as a library: the binary's commands and models, so other frontends (the Python
//! package in `python/`) call the same code that prints each command's `--json`.
//!
//! The layers, each standing only on those below it (`ARCHITECTURE.md` draws them):
//!
//! - `cmd/`: the command line's subcommands, one file or folder each (only `main.rs` uses it);
//! - `tui/`, `gui/`: the terminal and desktop explorers, drawing `model/`'s view-model;
//! - `model/`: the explorers' state, messages and view-model, shared by both explorers;
//! - `answers/`: what the commands compute, as values and JSON, for the commands and Python;
//! - `html/`: the self-contained HTML page of `report --html` and `diff --html`;
//! - `session/`: opening an input, its window, loaded or streamed, the policies and their
//!   replays on threads: what every frontend stands on;
//! - `trace_file`, `parquet_out`, `symbolize`, `charts`: reading and writing traces, Parquet
//!   tables, naming recorded addresses, PNG charts;
//! - `inject`: loading the tracer into a running process through ptrace (`attach`; x86-64
//!   Linux);
//! - `real`: the real-allocator rows, a trace's calls replayed through the library itself in a
//!   process of their own;
//! - `format`, `theme`, `units`, `progress`: formatting, colours, byte sizes, progress bars;
//! - `safe_write`: every file a command writes goes through it (never over an input, atomically);
//! - `procfs`: what `/proc` says of a process (whether it still runs).
//!
//! Domain logic lives in `allocview_sim` and `allocview_loaders`.

pub mod answers;
pub(crate) mod charts;
pub mod cmd;
pub mod export;
pub mod format;
#[cfg(feature = "gui")]
pub mod gui;
pub mod html;
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
pub mod inject;
pub mod model;
pub mod parquet_out;
pub mod procfs;
pub mod progress;
pub mod real;
pub mod recording;
pub mod safe_write;
pub mod session;
pub mod symbolize;
pub mod theme;
pub mod trace_file;
pub mod tui;
pub mod units;
