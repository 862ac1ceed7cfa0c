//! The explorer's model and view-model, shared by the terminal and desktop frontends. No
//! terminal or desktop UI types in here: CI greps for their crate names.

pub mod compact;
pub mod export;
pub mod follow;
pub mod heap_at;
pub mod heapmap;
pub mod heaps;
pub mod live;
pub mod options;
pub mod overview;
pub mod parts;
pub mod plan_view;
pub mod scan;
pub mod sites;
pub mod state;
pub mod trace_data;
pub mod update;
pub mod view;
pub mod workers;
