//! Evaluating a next-token model on a token stream: never a random split.
//!
//! - **split**: each thread's tokens in time order, the first `fraction` learnt, the rest
//!   predicted by the frozen model (the thread's context runs on across the cut, as it would);
//! - **online** (prequential): every token of the trace predicted, then learnt: what an
//!   allocator could do at run time;
//! - **cross-run**: learnt on every token of another run of the program, then the whole of this
//!   trace predicted by the frozen model.
//!
//! Figures per mode ([`Figures`]): top-1 and top-3 accuracy, mean log-loss in bits per token,
//! the article's collapsed-label accuracy, accuracy on allocations and on frees, and top-1
//! weighted by the bytes of each call (a 64 MiB request counts 2^21 times a 32 B one; a call
//! about 0 bytes counts as 1 byte).

use super::baselines::{Last, Majority, Period};
use super::context::{ContextModel, MAX_ORDER};
use super::tokens::{TokenStream, is_alloc_token};
use super::{Model, Prediction};

/// The baselines' names, in table order.
pub const BASELINES: [&str; 3] = ["majority", "last", "period"];

/// The models `predict` runs by default for `--order K`: the baselines, then `order-1` to
/// `order-K`.
#[must_use]
pub fn default_models(order: usize) -> Vec<String> {
    let mut names: Vec<String> = BASELINES.iter().map(|&s| s.to_owned()).collect();
    names.extend((1..=order.clamp(1, MAX_ORDER)).map(|k| format!("order-{k}")));
    names
}

/// A fresh model called `name`, or `None` for an unknown name.
#[must_use]
pub fn make_model(name: &str) -> Option<Box<dyn Model>> {
    match name {
        "majority" => Some(Box::new(Majority::default())),
        "last" => Some(Box::new(Last::default())),
        "period" => Some(Box::new(Period::default())),
        _ => {
            let k: usize = name.strip_prefix("order-")?.parse().ok()?;
            (1..=MAX_ORDER)
                .contains(&k)
                .then(|| Box::new(ContextModel::new(k)) as Box<dyn Model>)
        }
    }
}

/// Running sums of one evaluation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tally {
    pub events: u64,
    pub top1: u64,
    pub top3: u64,
    pub log_loss_bits: f64,
    pub seed_label: u64,
    pub allocs: u64,
    pub alloc_top1: u64,
    pub frees: u64,
    pub free_top1: u64,
    pub weight: f64,
    pub weight_top1: f64,
}

impl Tally {
    /// Scores `p` against `actual`, a call about `size_bytes`.
    pub fn add(&mut self, p: &Prediction, actual: u8, size_bytes: u64) {
        let hit = p.top1_hit;
        self.events += 1;
        self.top1 += u64::from(hit);
        self.top3 += u64::from(p.top3_hit);
        self.log_loss_bits -= p.p_actual.max(f64::MIN_POSITIVE).log2();
        self.seed_label += u64::from(p.seed_label_hit);
        if is_alloc_token(actual) {
            self.allocs += 1;
            self.alloc_top1 += u64::from(hit);
        } else {
            self.frees += 1;
            self.free_top1 += u64::from(hit);
        }
        let w = size_bytes.max(1) as f64;
        self.weight += w;
        if hit {
            self.weight_top1 += w;
        }
    }

    /// The figures (`None` where nothing was scored).
    #[must_use]
    pub fn figures(&self) -> Figures {
        let frac = |hits: u64, n: u64| (n > 0).then(|| hits as f64 / n as f64);
        Figures {
            events: self.events,
            top1: frac(self.top1, self.events),
            top3: frac(self.top3, self.events),
            log_loss_bits: (self.events > 0).then(|| self.log_loss_bits / self.events as f64),
            seed_label_top1: frac(self.seed_label, self.events),
            alloc_top1: frac(self.alloc_top1, self.allocs),
            free_top1: frac(self.free_top1, self.frees),
            byte_weighted_top1: (self.weight > 0.0).then(|| self.weight_top1 / self.weight),
        }
    }
}

/// The figures of one model in one evaluation mode.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Figures {
    /// Tokens predicted.
    pub events: u64,
    pub top1: Option<f64>,
    pub top3: Option<f64>,
    /// Mean of `-log2 P(actual)`.
    pub log_loss_bits: Option<f64>,
    /// Accuracy on the article's collapsed 7-class label.
    pub seed_label_top1: Option<f64>,
    pub alloc_top1: Option<f64>,
    pub free_top1: Option<f64>,
    pub byte_weighted_top1: Option<f64>,
}

/// One thread's online figure.
#[derive(Clone, Debug, PartialEq)]
pub struct ThreadFigure {
    /// Thread index in the trace's thread table.
    pub thread: u16,
    pub events: u64,
    pub online_top1: Option<f64>,
}

/// Everything measured for one model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelReport {
    pub name: String,
    pub split: Figures,
    pub online: Figures,
    pub cross_run: Option<Figures>,
    pub per_thread: Vec<ThreadFigure>,
    /// Tokens learnt per second in the split's training pass.
    pub train_events_per_s: Option<f64>,
    /// Tokens predicted (and scored) per second by the frozen model of the split.
    pub predict_events_per_s: Option<f64>,
    /// Tokens predicted and then learnt per second in the online pass.
    pub online_events_per_s: Option<f64>,
}

/// A clock in seconds: the frontend passes the evaluating thread's CPU time, so the speeds are
/// per core even on a busy machine (or wall time where that is not available).
pub type Clock<'a> = &'a dyn Fn() -> f64;

/// Calls announced to the model ([`Model::lookahead`]) before they are predicted or learnt:
/// enough for the context tables' cache misses to arrive in time.
const LOOKAHEAD: usize = 8;

/// Where an evaluation reads a trace's calls: all at once (a [`TokenStream`] in memory,
/// [`InMemory`]) or chunk by chunk (a trace too big for memory, decoded from its file on
/// every pass). The evaluations make up to four passes; memory is the models' and a chunk's.
pub trait Calls {
    /// One pass: `f` with each chunk of the calls, in trace order, from the first.
    ///
    /// # Errors
    /// When the calls cannot be read.
    fn for_each_chunk(&mut self, f: &mut dyn FnMut(&TokenStream)) -> Result<(), String>;
}

/// A token stream in memory: one chunk.
pub struct InMemory<'a>(pub &'a TokenStream);

impl Calls for InMemory<'_> {
    fn for_each_chunk(&mut self, f: &mut dyn FnMut(&TokenStream)) -> Result<(), String> {
        f(self.0);
        Ok(())
    }
}

impl Calls for TokenStream {
    fn for_each_chunk(&mut self, f: &mut dyn FnMut(&TokenStream)) -> Result<(), String> {
        f(self);
        Ok(())
    }
}

/// One call: token, thread, bytes.
type Call = (u8, u16, u64);

/// The calls announced to a model and not yet handled: each call is announced [`LOOKAHEAD`]
/// calls before it is handled, across chunks.
#[derive(Default)]
struct Pipe {
    ring: [Call; LOOKAHEAD],
    /// Calls announced, and calls handed out, so far (the ring's slots are these modulo its
    /// length, a power of two).
    announced: usize,
    handed: usize,
}

const RING_MASK: usize = LOOKAHEAD - 1;
const _: () = assert!(LOOKAHEAD.is_power_of_two());

impl Pipe {
    /// Announces `call`; returns the call now due, if any.
    #[inline]
    fn push(&mut self, model: &mut dyn Model, call: Call) -> Option<Call> {
        model.lookahead(call.1, call.0);
        let due = if self.announced - self.handed == LOOKAHEAD {
            self.handed += 1;
            self.ring
                .get(self.handed.wrapping_sub(1) & RING_MASK)
                .copied()
        } else {
            None
        };
        if let Some(slot) = self.ring.get_mut(self.announced & RING_MASK) {
            *slot = call;
        }
        self.announced += 1;
        due
    }

    fn pop(&mut self) -> Option<Call> {
        if self.handed == self.announced {
            return None;
        }
        self.handed += 1;
        self.ring
            .get(self.handed.wrapping_sub(1) & RING_MASK)
            .copied()
    }
}

/// What a pass does with each call it takes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Learn it.
    Learn,
    /// Predict and score it, then move the thread's context on without learning.
    Frozen,
    /// Predict and score it, then learn it.
    Online,
}

/// One model through the passes of one evaluation.
struct Runner {
    model: Box<dyn Model>,
    pipe: Pipe,
    tally: Tally,
    per_thread: Vec<Tally>,
    /// Calls learnt without being scored.
    learnt: u64,
    seconds: f64,
}

impl Runner {
    fn new(name: &str) -> Option<Self> {
        Some(Self {
            model: make_model(name)?,
            pipe: Pipe::default(),
            tally: Tally::default(),
            per_thread: Vec::new(),
            learnt: 0,
            seconds: 0.0,
        })
    }

    #[inline]
    fn handle(&mut self, mode: Mode, (tok, th, size): Call) {
        let model = self.model.as_mut();
        if mode == Mode::Learn {
            model.observe(th, tok, true);
            self.learnt += 1;
            return;
        }
        let p = model.predict(th, tok);
        self.tally.add(&p, tok, size);
        if mode == Mode::Online {
            let t = usize::from(th);
            if t >= self.per_thread.len() {
                self.per_thread.resize(t + 1, Tally::default());
            }
            if let Some(tally) = self.per_thread.get_mut(t) {
                tally.add(&p, tok, size);
            }
        }
        model.observe(th, tok, mode == Mode::Learn || mode == Mode::Online);
    }

    /// The calls of `chunk` that `take` keeps (all when `None`).
    fn feed(&mut self, mode: Mode, chunk: &TokenStream, take: Option<&[bool]>) {
        let calls = chunk.token.iter().zip(&chunk.thread).zip(&chunk.size_bytes);
        let calls = calls.map(|((&tok, &th), &size)| (tok, th, size));
        match take {
            None => {
                for call in calls {
                    if let Some(due) = self.pipe.push(self.model.as_mut(), call) {
                        self.handle(mode, due);
                    }
                }
            }
            Some(take) => {
                for (call, _) in calls.zip(take).filter(|(_, keep)| **keep) {
                    if let Some(due) = self.pipe.push(self.model.as_mut(), call) {
                        self.handle(mode, due);
                    }
                }
            }
        }
    }

    fn drain(&mut self, mode: Mode) {
        while let Some(call) = self.pipe.pop() {
            self.handle(mode, call);
        }
    }

    fn rate(&self, calls: u64) -> Option<f64> {
        (calls > 0 && self.seconds > 0.0).then(|| calls as f64 / self.seconds)
    }
}

/// Which calls of a split pass are taken: those in each thread's first part (learning) or in
/// the rest (predicting).
struct SplitCut {
    /// Calls per thread in the learnt part.
    cut: Vec<u64>,
    learnt_part: bool,
}

/// One pass of `calls` through `runners` in `mode`, each runner timed on its own with `clock`
/// (a chunk at a time, so decoding a chunk is not counted).
fn pass(
    calls: &mut dyn Calls,
    runners: &mut [Runner],
    mode: Mode,
    split: Option<&SplitCut>,
    clock: Clock<'_>,
) -> Result<(), String> {
    let mut seen: Vec<u64> = Vec::new();
    let mut take: Vec<bool> = Vec::new();
    calls.for_each_chunk(&mut |chunk| {
        let take = split.map(|s| {
            take.clear();
            take.extend(chunk.thread.iter().map(|&th| {
                let t = usize::from(th);
                if t >= seen.len() {
                    seen.resize(t + 1, 0);
                }
                let Some(n) = seen.get_mut(t) else {
                    return false;
                };
                *n += 1;
                let learnt = *n <= s.cut.get(t).copied().unwrap_or(0);
                learnt == s.learnt_part
            }));
            &take[..]
        });
        for r in runners.iter_mut() {
            let started = clock();
            r.feed(mode, chunk, take);
            r.seconds += clock() - started;
        }
    })?;
    for r in runners.iter_mut() {
        let started = clock();
        r.drain(mode);
        r.seconds += clock() - started;
    }
    Ok(())
}

/// Calls per thread, in one pass.
fn per_thread_counts(calls: &mut dyn Calls) -> Result<Vec<u64>, String> {
    let mut counts: Vec<u64> = Vec::new();
    calls.for_each_chunk(&mut |chunk| {
        for &th in &chunk.thread {
            let t = usize::from(th);
            if t >= counts.len() {
                counts.resize(t + 1, 0);
            }
            if let Some(c) = counts.get_mut(t) {
                *c += 1;
            }
        }
    })?;
    Ok(counts)
}

fn runners(names: &[String]) -> Result<Vec<Runner>, String> {
    names
        .iter()
        .map(|n| Runner::new(n).ok_or_else(|| format!("unknown model {n:?}")))
        .collect()
}

/// Runs every evaluation of the models `names` on `calls` (cross-run when `other` is given),
/// all models in each pass: four passes over `calls` (the calls per thread, the split's
/// learning and predicting, online), and one over `other`. Each model's passes are timed with
/// `clock`.
///
/// # Errors
/// An unknown model name, or calls that cannot be read.
pub fn evaluate_calls(
    names: &[String],
    calls: &mut dyn Calls,
    split_fraction: f64,
    other: Option<&mut dyn Calls>,
    clock: Clock<'_>,
) -> Result<Vec<ModelReport>, String> {
    let fraction = split_fraction.clamp(0.0, 1.0);
    let cut: Vec<u64> = per_thread_counts(calls)?
        .iter()
        .map(|&c| (c as f64 * fraction).floor() as u64)
        .collect();
    let mut split = runners(names)?;
    let learn = SplitCut {
        cut,
        learnt_part: true,
    };
    pass(calls, &mut split, Mode::Learn, Some(&learn), clock)?;
    let train: Vec<Option<f64>> = split.iter().map(|r| r.rate(r.learnt)).collect();
    for r in &mut split {
        r.seconds = 0.0;
    }
    let predict = SplitCut {
        learnt_part: false,
        ..learn
    };
    pass(calls, &mut split, Mode::Frozen, Some(&predict), clock)?;
    let split: Vec<(Figures, Option<f64>)> = split
        .into_iter()
        .map(|r| (r.tally.figures(), r.rate(r.tally.events)))
        .collect();
    let mut online = runners(names)?;
    pass(calls, &mut online, Mode::Online, None, clock)?;
    let cross: Vec<Option<Figures>> = match other {
        Some(o) => {
            let mut cross = runners(names)?;
            pass(o, &mut cross, Mode::Learn, None, clock)?;
            for r in &mut cross {
                r.model.reset_history();
                r.pipe = Pipe::default();
            }
            pass(calls, &mut cross, Mode::Frozen, None, clock)?;
            cross.iter().map(|r| Some(r.tally.figures())).collect()
        }
        None => vec![None; names.len()],
    };
    let reports = names
        .iter()
        .zip(split)
        .zip(train)
        .zip(online)
        .zip(cross)
        .map(|((((name, (split, predict)), train), online), cross)| {
            let per_thread = (0u16..)
                .zip(&online.per_thread)
                .filter(|(_, t)| t.events > 0)
                .map(|(thread, t)| ThreadFigure {
                    thread,
                    events: t.events,
                    online_top1: t.figures().top1,
                })
                .collect();
            ModelReport {
                name: name.clone(),
                split,
                online: online.tally.figures(),
                cross_run: cross,
                per_thread,
                train_events_per_s: train,
                predict_events_per_s: predict,
                online_events_per_s: online.rate(online.tally.events),
            }
        })
        .collect();
    Ok(reports)
}

/// Runs every evaluation of model `name` on `s` (cross-run when `other` is given), timing the
/// passes with `clock`. `None` for an unknown model name.
#[must_use]
pub fn evaluate(
    name: &str,
    s: &TokenStream,
    split_fraction: f64,
    other: Option<&TokenStream>,
    clock: Clock<'_>,
) -> Option<ModelReport> {
    let names = [name.to_owned()];
    let mut other = other.map(InMemory);
    let other = other.as_mut().map(|o| o as &mut dyn Calls);
    evaluate_calls(&names, &mut InMemory(s), split_fraction, other, clock)
        .ok()?
        .pop()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(tokens: &[u8], threads: &[u16]) -> TokenStream {
        TokenStream {
            token: tokens.to_vec(),
            thread: threads.to_vec(),
            size_bytes: tokens.iter().map(|&t| 1u64 << (t % 32)).collect(),
            event: (0..tokens.len() as u32).collect(),
            threads: threads
                .iter()
                .map(|&t| usize::from(t) + 1)
                .max()
                .unwrap_or(0),
        }
    }

    fn evaluate(
        name: &str,
        s: &TokenStream,
        split_fraction: f64,
        other: Option<&TokenStream>,
    ) -> Option<ModelReport> {
        let t0 = std::time::Instant::now();
        super::evaluate(name, s, split_fraction, other, &|| {
            t0.elapsed().as_secs_f64()
        })
    }

    #[test]
    fn a_repeating_pattern_is_learnt_and_the_baseline_is_not_fooled() {
        // Two threads, each cycling through its own pattern of allocs and frees.
        let a = [5u8, 9, 37, 41];
        let b = [20u8, 52];
        let mut tokens = Vec::new();
        let mut threads = Vec::new();
        for i in 0..400 {
            tokens.push(a[i % 4]);
            threads.push(0);
            tokens.push(b[i % 2]);
            threads.push(1);
        }
        let s = stream(&tokens, &threads);
        let r = evaluate("order-2", &s, 0.8, None).unwrap();
        assert_eq!(r.split.events, 160);
        assert_eq!(r.split.top1, Some(1.0));
        assert!(r.online.top1.unwrap() > 0.98);
        assert!(r.split.log_loss_bits.unwrap() < 0.2);
        assert_eq!(r.per_thread.len(), 2);
        let m = evaluate("majority", &s, 0.8, None).unwrap();
        // The most frequent tokens are b's two (a quarter each): majority is right a quarter
        // of the time at best.
        assert!(m.split.top1.unwrap() <= 0.26, "{:?}", m.split);
        let p = evaluate("period", &s, 0.8, None).unwrap();
        assert_eq!(p.split.top1, Some(1.0));
        // Cross-run on the same program: everything is known but the threads' first tokens,
        // which have no context (one of them is the most frequent token anyway).
        let c = evaluate("order-3", &s, 0.8, Some(&s)).unwrap();
        assert_eq!(c.cross_run.unwrap().top1, Some(799.0 / 800.0));
    }

    /// Calls in chunks of the given lengths, as a stream read from a file gives them.
    struct Chunked(Vec<TokenStream>);

    impl Calls for Chunked {
        fn for_each_chunk(&mut self, f: &mut dyn FnMut(&TokenStream)) -> Result<(), String> {
            self.0.iter().for_each(f);
            Ok(())
        }
    }

    fn chunks_of(s: &TokenStream, lens: &[usize]) -> Chunked {
        let mut out = Vec::new();
        let mut at = 0;
        for &len in lens.iter().cycle() {
            if at >= s.len() {
                break;
            }
            let end = (at + len).min(s.len());
            let mut c = TokenStream::default();
            for i in at..end {
                c.token.push(s.token[i]);
                c.thread.push(s.thread[i]);
                c.size_bytes.push(s.size_bytes[i]);
                c.event.push(s.event[i]);
                c.threads = c.threads.max(usize::from(s.thread[i]) + 1);
            }
            out.push(c);
            at = end;
        }
        Chunked(out)
    }

    /// Read in chunks (of 1, 3 or 7 calls, across which the lookahead runs on), every model
    /// scores exactly as on the stream read whole.
    #[test]
    fn chunks_give_the_figures_of_the_whole_stream() {
        let mut x = 11u64;
        let (mut tokens, mut threads) = (Vec::new(), Vec::new());
        for i in 0..3000u32 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            tokens.push(if i % 5 == 0 {
                (x >> 58) as u8
            } else {
                (i % 9) as u8 + 20
            });
            threads.push((x >> 40) as u16 % 3);
        }
        let s = stream(&tokens, &threads);
        let other = stream(&tokens[..1000], &threads[..1000]);
        let names: Vec<String> = default_models(8);
        let clock = || 0.0;
        let whole = evaluate_calls(
            &names,
            &mut InMemory(&s),
            0.7,
            Some(&mut InMemory(&other)),
            &clock,
        )
        .unwrap();
        for lens in [&[1usize][..], &[3, 7], &[7, 1, 2000]] {
            let chunked = evaluate_calls(
                &names,
                &mut chunks_of(&s, lens),
                0.7,
                Some(&mut chunks_of(&other, lens)),
                &clock,
            )
            .unwrap();
            assert_eq!(chunked, whole, "chunks of {lens:?}");
        }
        assert!(
            whole
                .iter()
                .all(|r| r.cross_run.is_some() && r.split.events > 800)
        );
        assert!(evaluate_calls(&["order-9".into()], &mut InMemory(&s), 0.7, None, &clock).is_err());
    }

    /// A model that records what it is told.
    #[derive(Default)]
    struct Recorder(Vec<(char, u8)>);

    impl Model for Recorder {
        fn name(&self) -> String {
            "recorder".into()
        }
        fn predict(&mut self, _: u16, actual: u8) -> Prediction {
            self.0.push(('p', actual));
            Prediction::from_guesses([0, 1, 2], 0, actual, 0.5)
        }
        fn observe(&mut self, _: u16, token: u8, _: bool) {
            self.0.push(('o', token));
        }
        fn lookahead(&mut self, _: u16, token: u8) {
            self.0.push(('a', token));
        }
        fn reset_history(&mut self) {}
    }

    /// Each call is announced LOOKAHEAD calls before it is learnt, in order, and the last
    /// ones are learnt at the end.
    #[test]
    fn the_pipe_announces_each_call_ahead_and_hands_them_out_in_order() {
        let mut model = Recorder::default();
        let mut pipe = Pipe::default();
        let mut handled = Vec::new();
        for tok in 0..20u8 {
            if let Some(due) = pipe.push(&mut model, (tok, 0, 0)) {
                handled.push((tok, due.0));
            }
        }
        while let Some(c) = pipe.pop() {
            handled.push((99, c.0));
        }
        let due: Vec<u8> = handled.iter().map(|h| h.1).collect();
        assert_eq!(due, (0..20).collect::<Vec<u8>>());
        // Call k is due when call k + LOOKAHEAD is announced.
        for &(announced, due) in &handled[..12] {
            assert_eq!(announced, due + LOOKAHEAD as u8);
        }
        assert_eq!(model.0, (0..20).map(|t| ('a', t)).collect::<Vec<_>>());
    }

    #[test]
    fn tally_weighs_bytes_and_separates_allocs_and_frees() {
        let mut t = Tally::default();
        let guesses = |actual| Prediction::from_guesses([3, 40, 1], 2, actual, 0.5);
        t.add(&guesses(3), 3, 1000); // hit, alloc, label 2 right
        t.add(&guesses(40), 40, 10); // top-3 only, free
        let f = t.figures();
        assert_eq!(f.top1, Some(0.5));
        assert_eq!(f.top3, Some(1.0));
        assert_eq!(f.alloc_top1, Some(1.0));
        assert_eq!(f.free_top1, Some(0.0));
        assert_eq!(f.seed_label_top1, Some(0.5));
        assert!((f.byte_weighted_top1.unwrap() - 1000.0 / 1010.0).abs() < 1e-12);
        assert!((f.log_loss_bits.unwrap() - 1.0).abs() < 1e-12);
        assert!(make_model("order-9").is_none());
        assert_eq!(
            default_models(2),
            ["majority", "last", "period", "order-1", "order-2"]
        );
    }
}
