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

/// Announces call `i` of `s` (if any) to `model`.
fn announce(model: &mut dyn Model, s: &TokenStream, i: Option<usize>) {
    if let Some((&tok, &th)) = i.and_then(|i| Some((s.token.get(i)?, s.thread.get(i)?))) {
        model.lookahead(th, tok);
    }
}

/// Announces the first calls of a pass over `calls` (indices into `s`).
fn announce_first(model: &mut dyn Model, s: &TokenStream, calls: &[usize]) {
    for &i in calls.iter().take(LOOKAHEAD) {
        announce(model, s, Some(i));
    }
}

fn rate(events: u64, clock: Clock<'_>, started: f64) -> Option<f64> {
    let secs = clock() - started;
    (events > 0 && secs > 0.0).then(|| events as f64 / secs)
}

/// The split evaluation: tally, train speed, predict speed.
fn split(
    model: &mut dyn Model,
    s: &TokenStream,
    train: &[bool],
    clock: Clock<'_>,
) -> (Tally, Option<f64>, Option<f64>) {
    let (learnt, tested): (Vec<usize>, Vec<usize>) =
        (0..s.token.len()).partition(|&i| train.get(i).copied().unwrap_or(false));
    let started = clock();
    announce_first(model, s, &learnt);
    for (j, &i) in learnt.iter().enumerate() {
        announce(model, s, learnt.get(j + LOOKAHEAD).copied());
        if let (Some(&tok), Some(&th)) = (s.token.get(i), s.thread.get(i)) {
            model.observe(th, tok, true);
        }
    }
    let train_rate = rate(learnt.len() as u64, clock, started);
    let started = clock();
    let mut tally = Tally::default();
    announce_first(model, s, &tested);
    for (j, &i) in tested.iter().enumerate() {
        announce(model, s, tested.get(j + LOOKAHEAD).copied());
        if let (Some(&tok), Some(&th), Some(&size)) =
            (s.token.get(i), s.thread.get(i), s.size_bytes.get(i))
        {
            let p = model.predict(th, tok);
            tally.add(&p, tok, size);
            model.observe(th, tok, false);
        }
    }
    let predict_rate = rate(tally.events, clock, started);
    (tally, train_rate, predict_rate)
}

/// The online evaluation: the whole tally, per-thread tallies and the speed.
fn online(
    model: &mut dyn Model,
    s: &TokenStream,
    clock: Clock<'_>,
) -> (Tally, Vec<Tally>, Option<f64>) {
    let started = clock();
    let mut tally = Tally::default();
    let mut per_thread = vec![Tally::default(); s.threads];
    for i in 0..LOOKAHEAD {
        announce(model, s, Some(i));
    }
    let calls = s.token.iter().zip(&s.thread).zip(&s.size_bytes);
    for (i, ((&tok, &th), &size)) in calls.enumerate() {
        announce(model, s, Some(i + LOOKAHEAD));
        let p = model.predict(th, tok);
        tally.add(&p, tok, size);
        if let Some(t) = per_thread.get_mut(usize::from(th)) {
            t.add(&p, tok, size);
        }
        model.observe(th, tok, true);
    }
    let speed = rate(tally.events, clock, started);
    (tally, per_thread, speed)
}

/// Learns all of `other`, then predicts all of `s` frozen.
fn cross_run(model: &mut dyn Model, s: &TokenStream, other: &TokenStream) -> Tally {
    for i in 0..LOOKAHEAD {
        announce(model, other, Some(i));
    }
    for (i, (&tok, &th)) in other.token.iter().zip(&other.thread).enumerate() {
        announce(model, other, Some(i + LOOKAHEAD));
        model.observe(th, tok, true);
    }
    model.reset_history();
    for i in 0..LOOKAHEAD {
        announce(model, s, Some(i));
    }
    let mut tally = Tally::default();
    let calls = s.token.iter().zip(&s.thread).zip(&s.size_bytes);
    for (i, ((&tok, &th), &size)) in calls.enumerate() {
        announce(model, s, Some(i + LOOKAHEAD));
        let p = model.predict(th, tok);
        tally.add(&p, tok, size);
        model.observe(th, tok, false);
    }
    tally
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
    let train = s.train_mask(split_fraction);
    let (split_tally, train_rate, predict_rate) =
        split(make_model(name)?.as_mut(), s, &train, clock);
    let (online_tally, threads, online_rate) = online(make_model(name)?.as_mut(), s, clock);
    let cross = match other {
        Some(o) => Some(cross_run(make_model(name)?.as_mut(), s, o).figures()),
        None => None,
    };
    let per_thread = (0u16..)
        .zip(&threads)
        .filter(|(_, t)| t.events > 0)
        .map(|(thread, t)| ThreadFigure {
            thread,
            events: t.events,
            online_top1: t.figures().top1,
        })
        .collect();
    Some(ModelReport {
        name: name.to_owned(),
        split: split_tally.figures(),
        online: online_tally.figures(),
        cross_run: cross,
        per_thread,
        train_events_per_s: train_rate,
        predict_events_per_s: predict_rate,
        online_events_per_s: online_rate,
    })
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
