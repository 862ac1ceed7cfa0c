//! The explorer's model and view-model, shared by the terminal and desktop frontends. No
//! frontend types (ratatui, egui) in here: CI greps for them.

pub mod export;
pub mod heapmap;
pub mod state;
pub mod view;
