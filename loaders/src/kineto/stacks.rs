//! The site of each `[memory]` event: the spans on its thread that contain its time, outer to
//! inner, ending at the innermost operator (the one the allocation happened in).

use std::collections::HashMap;

use super::collect::{MemEvent, Span, SpanKind};
use super::parse::Names;
use crate::sites::{Frame, NO_STACK, OPERATOR_FRAMES_MODULE, StackTable};

/// Each event's stack id in the returned table ([`NO_STACK`] when no span contains it).
/// `events` are in time order.
pub(crate) fn event_stacks(
    events: &[MemEvent],
    spans: &[Span],
    names: &Names,
) -> (StackTable, Vec<u32>) {
    let mut table = StackTable::new();
    let mut out = vec![NO_STACK; events.len()];
    let mut by_thread: HashMap<u32, Vec<Span>> = HashMap::new();
    for s in spans {
        by_thread.entry(s.thread).or_default().push(*s);
    }
    for list in by_thread.values_mut() {
        // Outer first: earlier start, and of two starting together the longer.
        list.sort_by(|a, b| a.start_ns.cmp(&b.start_ns).then(b.end_ns.cmp(&a.end_ns)));
    }
    let mut frames: HashMap<u32, u32> = HashMap::new();
    let mut sweeps: HashMap<u32, Sweep> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        let Some(list) = by_thread.get(&e.thread) else {
            continue;
        };
        let sweep = sweeps.entry(e.thread).or_default();
        let chain = sweep.enclosing(list, e.t_ns);
        // The innermost operator is the site: Python frames inside it are left out.
        let last_op = chain
            .iter()
            .rposition(|s| s.kind == SpanKind::Operator)
            .map_or(chain.len(), |p| p + 1);
        let mut ids: Vec<u32> = chain[..last_op]
            .iter()
            .map(|s| {
                *frames.entry(s.name).or_insert_with(|| {
                    table.intern_frame(frame_of(s.kind, names.names.get(s.name as usize)))
                })
            })
            .collect();
        if ids.is_empty() {
            continue;
        }
        ids.reverse();
        if let Some(slot) = out.get_mut(i) {
            *slot = table.intern_stack(ids);
        }
    }
    (table, out)
}

/// The spans of one thread open at the time of the last event asked for (events come in time
/// order, so each span is pushed once and dropped once it has ended).
#[derive(Default)]
struct Sweep {
    next: usize,
    open: Vec<Span>,
}

impl Sweep {
    fn enclosing(&mut self, list: &[Span], t_ns: i64) -> Vec<Span> {
        while let Some(s) = list.get(self.next).filter(|s| s.start_ns <= t_ns) {
            self.open.push(*s);
            self.next += 1;
        }
        self.open.retain(|s| s.end_ns >= t_ns);
        self.open.clone()
    }
}

/// A span's frame: an operator is its name (marked as an operator, the site); a Python
/// function's name `file(line): function` is split into its parts.
fn frame_of(kind: SpanKind, name: Option<&String>) -> Frame {
    let name = name.map_or("", String::as_str);
    match kind {
        SpanKind::Operator => Frame {
            function: name.to_owned(),
            file: "??".to_owned(),
            line: 0,
            module: OPERATOR_FRAMES_MODULE.to_owned(),
        },
        SpanKind::Annotation => Frame {
            function: name.to_owned(),
            file: "??".to_owned(),
            line: 0,
            module: String::new(),
        },
        SpanKind::Python => python_frame(name),
    }
}

/// `path/to/file.py(105): function` (as `torch.profiler` names a Python function's span).
fn python_frame(name: &str) -> Frame {
    let parsed = name.split_once("): ").and_then(|(head, function)| {
        let (file, line) = head.rsplit_once('(')?;
        Some((file, line.parse::<i64>().ok()?, function))
    });
    match parsed {
        Some((file, line, function)) => Frame {
            function: function.to_owned(),
            file: file.to_owned(),
            line,
            module: String::new(),
        },
        None => Frame {
            function: name.to_owned(),
            file: "??".to_owned(),
            line: 0,
            module: String::new(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kineto::Device;

    fn span(start_ns: i64, end_ns: i64, name: u32, kind: SpanKind) -> Span {
        Span {
            thread: 0,
            start_ns,
            end_ns,
            name,
            kind,
        }
    }

    fn mem(t_ns: i64) -> MemEvent {
        MemEvent {
            t_ns,
            thread: 0,
            device: Device {
                device_type: 1,
                index: 0,
            },
            bytes: 1,
            addr: None,
            total_allocated_bytes: None,
            total_reserved_bytes: None,
        }
    }

    #[test]
    fn the_innermost_operator_is_the_site_and_the_stack_runs_outward_from_it() {
        let mut names = Names::default();
        let module = names.intern("train.py(12): step".into());
        let conv = names.intern("aten::conv2d".into());
        let empty = names.intern("aten::empty".into());
        let inner_py = names.intern("torch/x.py(3): hook".into());
        let spans = [
            span(0, 100, module, SpanKind::Python),
            span(10, 50, conv, SpanKind::Operator),
            span(20, 30, empty, SpanKind::Operator),
            span(21, 29, inner_py, SpanKind::Python),
            span(60, 70, empty, SpanKind::Operator),
        ];
        let (table, ids) = event_stacks(&[mem(25), mem(40), mem(55), mem(200)], &spans, &names);
        let stack = |i: usize| -> Vec<String> {
            table
                .frames_of(ids[i])
                .map(|f| f.function.clone())
                .collect()
        };
        assert_eq!(stack(0), ["aten::empty", "aten::conv2d", "step"]);
        assert_eq!(table.site_frame(ids[0]).unwrap().function, "aten::empty");
        assert_eq!(stack(1), ["aten::conv2d", "step"]);
        assert_eq!(stack(2), ["step"]);
        assert_eq!(ids[3], NO_STACK);
        let py = table.frames_of(ids[2]).next().unwrap();
        assert_eq!((py.file.as_str(), py.line), ("train.py", 12));
    }
}
