//! `predict` on a binary trace too big for memory (`--stream`, or on its own as for `stats`):
//! every pass of the evaluations decodes the trace block by block ([`StreamedCalls`]), so
//! memory is the models' tables, a block and the live allocations, whatever the trace's length.
//! The first pass also scores the lifetime predictor, causally, as the loaded path does, but
//! without allocation sites (a stream carries no stacks). Four passes over the file (five with
//! `--train`): the calls per thread, the split's learning and predicting, online.

use std::path::Path;

use allocview_sim::predict::eval::{Calls, ModelReport, evaluate_calls};
use allocview_sim::predict::lifetime::{
    AllocFeatures, DEFAULT_SHORT_ALLOCS, LifetimeScorer, NO_SITE, RecentCalls,
};
use allocview_sim::predict::tokens::{TokenStream, is_alloc_token};
use allocview_sim::stream::{EventBatch, EventSource as _, Prefetched};
use allocview_sim::trace::EventKind;
use anyhow::Result;

use super::{Input, PredictOptions, other_calls, thread_cpu_seconds};
use crate::session::source::StreamInput;

/// What the first pass learns besides the chunks.
struct FirstPass {
    scorer: LifetimeScorer,
    recent: RecentCalls,
    calls: u64,
    allocs: u64,
    calls_per_thread: Vec<u64>,
}

/// A binary trace's calls, decoded from the file on each pass.
pub(super) struct StreamedCalls {
    input: StreamInput,
    passes: u32,
    first: Option<FirstPass>,
    tids: Vec<u64>,
}

impl StreamedCalls {
    pub(super) fn new(input: StreamInput) -> Self {
        Self {
            input,
            passes: 0,
            first: Some(FirstPass {
                scorer: LifetimeScorer::new(DEFAULT_SHORT_ALLOCS),
                recent: RecentCalls::default(),
                calls: 0,
                allocs: 0,
                calls_per_thread: Vec::new(),
            }),
            tids: Vec::new(),
        }
    }

    /// What `predict` says of the trace, once a pass is done.
    fn input(&mut self) -> Input {
        let first = self.first.take();
        let threads = first
            .as_ref()
            .map_or(0, |f| f.calls_per_thread.iter().filter(|&&c| c > 0).count());
        Input {
            calls: first.as_ref().map_or(0, |f| f.calls),
            allocs: first.as_ref().map_or(0, |f| f.allocs),
            threads,
            tids: std::mem::take(&mut self.tids),
            lifetime: first.map(|f| f.scorer.finish()).unwrap_or_default(),
            streamed: true,
        }
    }
}

impl FirstPass {
    fn see(&mut self, kind: EventKind, id: u32, size_bytes: u64, thread: u16, token: Option<u8>) {
        match kind {
            EventKind::Alloc => {
                let recent = Some(self.recent.get(thread));
                let keys = AllocFeatures::keys_of(NO_SITE, recent, size_bytes);
                self.scorer.alloc(id, keys);
            }
            EventKind::Free => self.scorer.free(id),
            _ => {}
        }
        let Some(tok) = token else {
            return;
        };
        self.recent.push(thread, tok);
        self.calls += 1;
        self.allocs += u64::from(is_alloc_token(tok));
        let t = usize::from(thread);
        if t >= self.calls_per_thread.len() {
            self.calls_per_thread.resize(t + 1, 0);
        }
        if let Some(c) = self.calls_per_thread.get_mut(t) {
            *c += 1;
        }
    }
}

impl Calls for StreamedCalls {
    fn for_each_chunk(&mut self, f: &mut dyn FnMut(&TokenStream)) -> Result<(), String> {
        let stream = self.input.open().map_err(|e| format!("{e:#}"))?;
        let mut prefetched = Prefetched::start(stream);
        let mut batch = EventBatch::default();
        let mut chunk = TokenStream::default();
        let mut first = if self.passes == 0 {
            self.first.as_mut()
        } else {
            None
        };
        let mut event = 0u32;
        while prefetched.next_batch(&mut batch)? {
            chunk.clear();
            let events = batch
                .kind
                .iter()
                .zip(&batch.size_bytes)
                .zip(&batch.thread)
                .zip(&batch.alloc_id);
            for (((&code, &size), &thread), &id) in events {
                let Some(kind) = EventKind::from_code(code) else {
                    continue;
                };
                // An index within the pass (it wraps on traces past 4 billion events; the
                // evaluations do not read it).
                let token = chunk.push_event(kind, size, thread, event);
                event = event.wrapping_add(1);
                if let Some(first) = first.as_deref_mut() {
                    first.see(kind, id, size, thread, token);
                }
            }
            f(&chunk);
        }
        let stream = prefetched
            .finish()
            .ok_or_else(|| format!("the thread reading {} failed", self.input.file.display()))?;
        if self.passes == 0 {
            self.tids = stream.thread_ids().to_vec();
        }
        self.passes += 1;
        Ok(())
    }
}

/// `predict` on `path`, streamed.
pub(super) fn evaluate(
    path: &Path,
    args: &PredictOptions,
    names: &[String],
) -> Result<(Input, Vec<ModelReport>)> {
    let mut calls = StreamedCalls::new(StreamInput::new(
        path,
        &args.input.window,
        args.input.requests_or(allocview_loaders::Requests::Objects),
        args.input.heap_id(path)?,
    )?);
    let mut other = other_calls(args)?;
    let reports = evaluate_calls(
        names,
        &mut calls,
        args.split,
        other.as_mut().map(|o| o.as_calls()),
        &thread_cpu_seconds,
    )
    .map_err(anyhow::Error::msg)?;
    Ok((calls.input(), reports))
}
