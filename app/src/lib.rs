//! `allocview` as a library: the binary's commands and models, so other frontends (the Python
//! package in `python/`) call the same code that prints each command's `--json`.
//!
//! - `cmd/`: the headless subcommands (`stats`, `compare`, `bench`);
//! - `model/`: the explorer's state, messages and view-model, shared by the frontends;
//! - `tui/`: the terminal explorer (`allocview FILE`);
//! - `format`, `theme`, `units`: formatting, colours and byte-size parsing used everywhere;
//! - `safe_write`: every file a command writes goes through it (never over an input, atomically).
//!
//! Domain logic lives in `allocview_sim` and `allocview_loaders`.

pub mod cmd;
pub mod format;
#[cfg(feature = "gui")]
pub mod gui;
pub mod model;
pub mod parquet_out;
pub mod progress;
pub mod safe_write;
pub mod symbolize;
pub mod theme;
pub mod tui;
pub mod units;
