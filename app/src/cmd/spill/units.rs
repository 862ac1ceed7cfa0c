//! `spill --unit executor`: the unit of every event, by input kind. A malloc trace's units are
//! its threads; a TensorFlow memory log's, its operations (the `kernel` that logged the event,
//! else its step); a PyTorch snapshot's, its annotation phases (the phase open at the event's
//! time, else "outside any phase").

use std::collections::HashMap;

use allocview_loaders::Loaded;
use anyhow::{Result, bail};
use polars::prelude::*;

/// Dense unit ids, one per event, and what a unit is.
pub struct EventUnits {
    pub unit_of_event: Vec<u32>,
    pub names: Vec<String>,
    pub what: &'static str,
}

/// Gives each distinct name a dense id, in order of first appearance.
#[derive(Default)]
struct Namer {
    ids: HashMap<String, u32>,
    names: Vec<String>,
}

impl Namer {
    fn id(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = self.names.len() as u32;
        self.ids.insert(name.to_owned(), id);
        self.names.push(name.to_owned());
        id
    }
}

/// The units of `loaded`'s events (`events` is its event table).
pub fn executor_units(loaded: &Loaded, events: &DataFrame) -> Result<EventUnits> {
    let mut namer = Namer::default();
    let (unit_of_event, what) = match loaded {
        Loaded::MallocTrace(_) => {
            let threads = events.column("thread")?.cast(&DataType::UInt32)?;
            let ids = threads
                .u32()?
                .iter()
                .map(|t| namer.id(&format!("thread {}", t.unwrap_or(0))))
                .collect();
            (ids, "threads")
        }
        Loaded::TfMemoryLog(_) => {
            let kernel = events.column("kernel")?.str()?;
            let step = events.column("step")?.i64()?;
            let ids = kernel
                .iter()
                .zip(step.iter())
                .map(|(k, s)| match (k, s) {
                    (Some(k), _) => namer.id(k),
                    (None, Some(s)) => namer.id(&format!("step {s}")),
                    (None, None) => namer.id("(no operation)"),
                })
                .collect();
            (ids, "operations")
        }
        Loaded::PytorchSnapshot(snap) => (phases(&snap.annotations, events, &mut namer)?, "phases"),
        Loaded::TfBfcDump(_) | Loaded::Plan(_) | Loaded::HeapProfile(_) => {
            bail!("this input has no events")
        }
    };
    Ok(EventUnits {
        unit_of_event,
        names: namer.names,
        what,
    })
}

/// The annotation phase open at each event's time.
fn phases(annotations: &DataFrame, events: &DataFrame, namer: &mut Namer) -> Result<Vec<u32>> {
    const OUTSIDE: &str = "(outside any phase)";
    let mut marks: Vec<(i64, bool, String)> = Vec::new();
    if annotations.height() > 0 {
        let stage = annotations.column("stage")?.str()?;
        let name = annotations.column("name")?.str()?;
        let t = annotations.column("t_ns")?.i64()?;
        for ((s, n), t) in stage.iter().zip(name.iter()).zip(t.iter()) {
            if let (Some(s), Some(n), Some(t)) = (s, n, t) {
                marks.push((t, s == "START", n.to_owned()));
            }
        }
    }
    marks.sort_by_key(|m| m.0);
    let t_ns = events.column("t_ns")?.i64()?;
    let mut open: Vec<String> = Vec::new();
    let mut next = marks.iter().peekable();
    let mut out = Vec::with_capacity(events.height());
    for t in t_ns.iter() {
        let t = t.unwrap_or(0);
        while let Some((_, start, name)) = next.next_if(|m| m.0 <= t) {
            if *start {
                open.push(name.clone());
            } else if let Some(at) = open.iter().rposition(|o| o == name) {
                open.remove(at);
            }
        }
        out.push(namer.id(open.last().map_or(OUTSIDE, String::as_str)));
    }
    Ok(out)
}
