//! The libtracemalloc article's token stream.
//!
//! Each heap call of the trace becomes one token of 64 classes, in trace order, tagged with its
//! thread (the models read each thread's tokens as a sequence of its own):
//!
//! | event | token |
//! |---|---|
//! | allocation of `s` bytes (also one that returned NULL) | `min(bit_length(s), 31)` |
//! | free of a live block of `s` bytes | `32 + min(bit_length(s), 31)` |
//! | free of an unknown pointer, `free(NULL)` | `32` |
//!
//! PyTorch's `free_requested` is not a call (the block's `Free` follows) and gives no token.
//!
//! The article trained on a collapsed label, `bit_length(token)` (its target array was filled at
//! `allocs[i].bit_length()`), which folds the 64 classes into 7: 0, 1, 2..3, 4..7, 8..15, 16..31
//! (the allocation classes) and 32..63 (every free is label 6). [`seed_label`] computes it.

use crate::trace::{EventKind, TraceView, size_class};

/// Number of token classes.
pub const NUM_TOKENS: usize = 64;
/// Highest allocation class; larger requests share it.
pub const MAX_ALLOC_CLASS: u8 = 31;
/// First free class: a free of an unknown pointer or of a zero-byte block.
pub const FREE_BASE: u8 = 32;
/// Number of collapsed labels (`bit_length` of a token below 64).
pub const NUM_SEED_LABELS: usize = 7;

/// The token of an allocation of `size_bytes`.
#[must_use]
pub fn alloc_token(size_bytes: u64) -> u8 {
    size_class(size_bytes).min(MAX_ALLOC_CLASS)
}

/// The token of a free of a block of `size_bytes` (`None` for an unknown pointer).
#[must_use]
pub fn free_token(size_bytes: Option<u64>) -> u8 {
    FREE_BASE + size_bytes.map_or(0, alloc_token)
}

/// True for the tokens of allocations.
#[must_use]
pub fn is_alloc_token(token: u8) -> bool {
    token < FREE_BASE
}

/// The article's collapsed label of a token: its bit length (0..=6).
#[must_use]
pub fn seed_label(token: u8) -> u8 {
    size_class(u64::from(token))
}

/// The token of event `kind` over a block of `size_bytes`, or `None` for an event that is no
/// heap call.
#[must_use]
pub fn token_of(kind: EventKind, size_bytes: u64) -> Option<u8> {
    match kind {
        EventKind::Alloc | EventKind::AllocFailed => Some(alloc_token(size_bytes)),
        EventKind::Free => Some(free_token(Some(size_bytes))),
        EventKind::FreeNull | EventKind::FreeUnknown => Some(free_token(None)),
        EventKind::FreeRequested => None,
    }
}

/// A trace as tokens: one entry per heap call, in trace order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenStream {
    pub token: Vec<u8>,
    /// Thread index of each token (dense, as in the trace's thread table).
    pub thread: Vec<u16>,
    /// Bytes the call is about (requested, or the freed block's size; 0 for an unknown free).
    pub size_bytes: Vec<u64>,
    /// Index of each token's event in the trace.
    pub event: Vec<u32>,
    /// One more than the highest thread index (0 for an empty stream).
    pub threads: usize,
}

impl TokenStream {
    /// Tokenizes `trace`; `thread` is its per-event thread column (`None`: one thread).
    /// Events beyond `u32::MAX` are not indexed (the stream stops there).
    #[must_use]
    pub fn from_trace(trace: &TraceView<'_>, thread: Option<&[u16]>) -> Self {
        let n = trace.len();
        let mut s = Self {
            token: Vec::with_capacity(n),
            thread: Vec::with_capacity(n),
            size_bytes: Vec::with_capacity(n),
            event: Vec::with_capacity(n),
            threads: 0,
        };
        for (i, (&code, &size)) in trace.kind.iter().zip(trace.size_bytes).enumerate() {
            let Ok(event) = u32::try_from(i) else { break };
            let Some(kind) = EventKind::from_code(code) else {
                continue;
            };
            let t = thread.and_then(|th| th.get(i).copied()).unwrap_or(0);
            s.push_event(kind, size, t, event);
        }
        s
    }

    /// Appends the token of an event (`event`: its index), if it is a heap call; returns the
    /// token.
    pub fn push_event(
        &mut self,
        kind: EventKind,
        size_bytes: u64,
        thread: u16,
        event: u32,
    ) -> Option<u8> {
        let token = token_of(kind, size_bytes)?;
        self.threads = self.threads.max(usize::from(thread) + 1);
        self.token.push(token);
        self.thread.push(thread);
        self.size_bytes.push(
            if kind == EventKind::FreeUnknown || kind == EventKind::FreeNull {
                0
            } else {
                size_bytes
            },
        );
        self.event.push(event);
        Some(token)
    }

    /// Empties the stream, keeping its buffers.
    pub fn clear(&mut self) {
        self.token.clear();
        self.thread.clear();
        self.size_bytes.clear();
        self.event.clear();
        self.threads = 0;
    }

    /// Number of tokens.
    #[must_use]
    pub fn len(&self) -> usize {
        self.token.len()
    }

    /// True when the trace has no heap calls.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.token.is_empty()
    }

    /// Tokens per thread.
    #[must_use]
    pub fn per_thread_counts(&self) -> Vec<u64> {
        let mut counts = vec![0u64; self.threads];
        for &t in &self.thread {
            if let Some(c) = counts.get_mut(usize::from(t)) {
                *c += 1;
            }
        }
        counts
    }

    /// For each token, whether it lies in its thread's first `fraction` of tokens (the
    /// time-ordered training part of a split).
    #[must_use]
    pub fn train_mask(&self, fraction: f64) -> Vec<bool> {
        let counts = self.per_thread_counts();
        let cut: Vec<u64> = counts
            .iter()
            .map(|&c| (c as f64 * fraction.clamp(0.0, 1.0)).floor() as u64)
            .collect();
        let mut seen = vec![0u64; self.threads];
        self.thread
            .iter()
            .map(|&t| {
                let t = usize::from(t);
                let (Some(s), Some(&c)) = (seen.get_mut(t), cut.get(t)) else {
                    return false;
                };
                *s += 1;
                *s <= c
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::NO_ALLOC_ID;

    /// A hand-made trace of two threads with every kind of call, and the article's tokens
    /// worked out by hand.
    #[test]
    fn hand_made_trace_gives_the_articles_tokens() {
        let kinds = [
            EventKind::Alloc,         // thread 0: malloc(1)        -> 1
            EventKind::Alloc,         // thread 1: malloc(100)      -> 7
            EventKind::Alloc,         // thread 0: malloc(0)        -> 0
            EventKind::Free,          // thread 1: free(100 B)      -> 32 + 7 = 39
            EventKind::FreeUnknown,   // thread 0: free(unknown)    -> 32
            EventKind::FreeNull,      // thread 0: free(NULL)       -> 32
            EventKind::AllocFailed,   // thread 1: malloc(1 TiB) = NULL -> 31 (capped)
            EventKind::Alloc,         // thread 1: malloc(3 GiB)    -> 31 (bit length 32, capped)
            EventKind::FreeRequested, // thread 1: no token
            EventKind::Free,          // thread 1: free(3 GiB)      -> 32 + 31 = 63
            EventKind::Free,          // thread 0: free(1 B)        -> 33
            EventKind::Alloc,         // thread 0: malloc(65536)    -> 17
        ];
        let sizes = [
            1,
            100,
            0,
            100,
            0,
            0,
            1 << 40,
            3 << 30,
            3 << 30,
            3 << 30,
            1,
            65_536,
        ];
        let ids = [
            0,
            1,
            2,
            1,
            NO_ALLOC_ID,
            NO_ALLOC_ID,
            NO_ALLOC_ID,
            3,
            NO_ALLOC_ID,
            3,
            0,
            4,
        ];
        let threads = [0u16, 1, 0, 1, 0, 0, 1, 1, 1, 1, 0, 0];
        let codes: Vec<u8> = kinds.iter().map(|k| k.code()).collect();
        let t_ns: Vec<i64> = (0..12).collect();
        let view = TraceView::new(&t_ns, &codes, &sizes, &ids).unwrap();
        let s = TokenStream::from_trace(&view, Some(&threads));
        assert_eq!(s.token, [1, 7, 0, 39, 32, 32, 31, 31, 63, 33, 17]);
        assert_eq!(s.thread, [0, 1, 0, 1, 0, 0, 1, 1, 1, 0, 0]);
        assert_eq!(s.event, [0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11]);
        assert_eq!(s.size_bytes[4], 0, "an unknown free weighs nothing");
        assert_eq!(s.threads, 2);
        let labels: Vec<u8> = s.token.iter().map(|&t| seed_label(t)).collect();
        assert_eq!(labels, [1, 3, 0, 6, 6, 6, 5, 5, 6, 6, 5]);
        // Thread 0 has 6 tokens, thread 1 has 5: the first half of each trains.
        let mask = s.train_mask(0.5);
        assert_eq!(
            mask,
            [
                true, true, true, true, true, false, false, false, false, false, false
            ]
        );
    }

    #[test]
    fn labels_fold_64_classes_into_7() {
        let mut seen = [0u32; NUM_SEED_LABELS];
        for t in 0..64u8 {
            seen[usize::from(seed_label(t))] += 1;
        }
        assert_eq!(seen, [1, 1, 2, 4, 8, 16, 32]);
    }
}
