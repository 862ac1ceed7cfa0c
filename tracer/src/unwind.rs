//! A DWARF call-frame-information unwinder for x86-64 (other architectures record no stacks).
//!
//! Code built without frame pointers (the C library, `python3`, distribution C++ libraries)
//! can only be unwound with the call-frame information every x86-64 ELF object carries for
//! exception handling: `.eh_frame`, indexed by `.eh_frame_hdr`'s sorted table. For each return
//! address the walk needs one *rule*: where the caller's frame (the CFA) is, relative to the
//! stack pointer or the frame pointer, and where the return address and the caller's frame
//! pointer were saved. A rule is computed once per address by interpreting the FDE's CFA
//! program (`def_cfa*`, `offset*`, `advance_loc*`, `remember`/`restore_state`, `restore*`,
//! `same_value`, `undefined`, `GNU_args_size`) and kept in a fixed-size lock-free table
//! ([`CACHE_SLOTS`] entries, each a key word and a rule word whose XOR checks that a reader
//! did not see halves of two writes). Each thread also keeps the rules it met in a small table
//! of its own ([`Memo`]), so a program's repeated stacks cost a read of that table and a
//! stack read per frame.
//!
//! What stops a walk (and is recorded with the stack as its end): an undefined return
//! address (`_start`, a thread's start: the normal end), the depth cap [`MAX_DEPTH`], a rule
//! the walk does not follow (a CFA or saved register given by a DWARF expression, as in PLT
//! entries and signal frames, or a CFA in another register), an address outside every module
//! or without an FDE (JIT code), and any read that would leave the thread's stack or the
//! module's mapped segments: every read is checked, so a bad rule ends a stack, never the
//! program.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::modules::{self, Emit};

/// Most frames of a stack.
pub const MAX_DEPTH: usize = 128;

/// Why a walk ended.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum End {
    /// The outermost frame (return address undefined).
    Complete = 0,
    /// [`MAX_DEPTH`] frames.
    DepthCap = 1,
    /// A rule the walk does not follow (expression, signal frame, other CFA register).
    Unsupported = 2,
    /// An address in no module, or with no unwind information.
    NoInfo = 3,
    /// A read outside the stack or the module, or a frame that does not move outward.
    BadFrame = 4,
}

/// Register state of one frame.
#[derive(Clone, Copy)]
pub struct Regs {
    pub pc: u64,
    pub sp: u64,
    pub bp: u64,
}

// ---- rules and their cache ----

/// A computed rule, packed in a word: bits 0-31 the CFA offset (i32), 32-33 the CFA register
/// (1 = rsp, 2 = rbp), 34 rbp saved at CFA + the offset in bits 40-55 (i16), bits 56-63 the
/// return address's offset from the CFA in words (i8); or, with the CFA register 0, a stop
/// ([`End`] in bits 8-15). Never zero.
#[derive(Clone, Copy)]
struct Rule(u64);

const CFA_RSP: u64 = 1;
const CFA_RBP: u64 = 2;
/// The generation of a [`Rule::no_module`] whose module table was not looked at again (its
/// lock was busy): stale at once.
const NO_GENERATION: u64 = (1 << 20) - 1;

impl Rule {
    fn stop(end: End) -> Self {
        Self(u64::from(end as u8) << 8 | 1 << 63)
    }

    fn cfa_reg(self) -> u64 {
        (self.0 >> 32) & 3
    }

    /// Code in no known module, as of module [`generation`](modules::generation) `known`
    /// (bit 35 marks it, bits 36-55 hold the generation modulo [`NO_GENERATION`], or that
    /// value when the module table was not looked at again): such a module may be mapped
    /// later.
    fn no_module(known: u64) -> Self {
        let known = if known == NO_GENERATION {
            known
        } else {
            known % NO_GENERATION
        };
        Self(Self::stop(End::NoInfo).0 | 1 << 35 | (known << 36))
    }

    /// A [`Self::no_module`] rule from before the module table last changed.
    fn is_stale(self) -> bool {
        self.cfa_reg() == 0
            && (self.0 >> 35) & 1 == 1
            && (self.0 >> 36) & NO_GENERATION != modules::generation() % NO_GENERATION
    }

    fn end(self) -> End {
        match (self.0 >> 8) as u8 {
            0 => End::Complete,
            2 => End::Unsupported,
            3 => End::NoInfo,
            _ => End::BadFrame,
        }
    }
}

/// Rule cache entries (16 bytes each: 1 MiB).
const CACHE_SLOTS: usize = 1 << 16;

struct Slot {
    key: AtomicU64,
    rule: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY_SLOT: Slot = Slot {
    key: AtomicU64::new(0),
    rule: AtomicU64::new(0),
};

static CACHE: [Slot; CACHE_SLOTS] = [EMPTY_SLOT; CACHE_SLOTS];

#[inline(always)]
fn slot_of(pc: u64) -> &'static Slot {
    let h = pc.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 48;
    // The mask keeps the index in range.
    &CACHE[(h as usize) & (CACHE_SLOTS - 1)]
}

/// What the cache files a rule for `pc` under while module [`unloads`](modules::unloads) is
/// `unloads`: a rule of a module since unloaded is not found for code mapped at its addresses
/// later (distinct for distinct counts: the factor is odd).
#[inline(always)]
fn cache_key(pc: u64, unloads: u64) -> u64 {
    pc ^ unloads.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

#[inline(always)]
fn cached(pc: u64, unloads: u64) -> Option<Rule> {
    let s = slot_of(pc);
    let rule = s.rule.load(Ordering::Relaxed);
    let key = s.key.load(Ordering::Relaxed);
    (rule != 0 && key ^ rule == cache_key(pc, unloads)).then_some(Rule(rule))
}

fn remember(pc: u64, unloads: u64, rule: Rule) {
    let s = slot_of(pc);
    s.rule.store(rule.0, Ordering::Relaxed);
    s.key
        .store(cache_key(pc, unloads) ^ rule.0, Ordering::Relaxed);
}

/// The rule for code address `pc` (a return address less one, or the exact first pc), in a
/// walk that started while modules had been removed `unloads` times.
#[inline(always)]
fn rule_for(pc: u64, unloads: u64, emit: Emit) -> Rule {
    match cached(pc, unloads) {
        Some(r) => r,
        None => compute_rule(pc, unloads, emit),
    }
}

/// A rule not in the cache: computed from the module's CFI and cached (under the walk's
/// `unloads`: if a module was removed since, the rule is not found by later walks).
#[cold]
#[inline(never)]
fn compute_rule(pc: u64, unloads: u64, emit: Emit) -> Rule {
    let m = match modules::find_current(pc) {
        Some(m) => m,
        None => {
            let looked = modules::refresh(emit);
            match modules::find(pc) {
                Some(m) => m,
                // Not in the shared cache: the module may be mapped later. The threads keep it
                // until the module table grows (see `Memo::forget_stale`).
                None if looked => return Rule::no_module(modules::generation()),
                None => return Rule::no_module(NO_GENERATION),
            }
        }
    };
    let rule = crate::cfi::compute(&m, pc).map_or(Rule::stop(End::NoInfo), |s| pack(&s));
    remember(pc, unloads, rule);
    rule
}

/// Packs an interpreted row into a [`Rule`].
fn pack(s: &crate::cfi::Row) -> Rule {
    use crate::cfi::Reg;
    if s.signal_frame || s.cfa_expression {
        return Rule::stop(End::Unsupported);
    }
    let cfa_reg = match s.cfa_reg {
        7 => CFA_RSP,
        6 => CFA_RBP,
        _ => return Rule::stop(End::Unsupported),
    };
    let ra = match s.ra {
        Reg::Offset(o) if o % 8 == 0 && (-1024..1024).contains(&o) => (o / 8) as i8,
        Reg::Undefined => return Rule::stop(End::Complete),
        _ => return Rule::stop(End::Unsupported),
    };
    let (bp_saved, bp_off) = match s.bp {
        Reg::Same => (0, 0),
        // Whole words, so that one alignment check of the CFA covers both reads.
        Reg::Offset(o) if i64::from(o as i16) == o && o % 8 == 0 => (1, o as i16),
        _ => return Rule::stop(End::Unsupported),
    };
    let Ok(cfa_off) = i32::try_from(s.cfa_off) else {
        return Rule::stop(End::Unsupported);
    };
    Rule(
        u64::from(cfa_off as u32)
            | cfa_reg << 32
            | bp_saved << 34
            | u64::from(bp_off as u16) << 40
            | u64::from(ra as u8) << 56,
    )
}

// ---- the walk ----

/// Frames of a thread's previous walk that [`Memo`] remembers.
const MEMO_DEPTH: usize = MAX_DEPTH + 8;
/// Rules a thread keeps for itself by return address (16 bytes each: 8 KiB).
const MEMO_SLOTS: usize = 1 << 9;

/// A thread's own rules, in two levels before the shared [`CACHE`] (1 MiB, written by every
/// thread, and on a Python program the walk's most expensive read):
/// - the rules of its previous walk, by depth: consecutive stacks of a thread share most of
///   their frames, and the read does not wait for the frame's return address (the processor
///   runs ahead on the predicted match), so a frame costs little more than its stack read;
/// - a direct-mapped table of the return addresses it met, for stacks that differ from the
///   previous one in more than their innermost frames.
///
/// Zeroed memory is an empty memo (no frame is at address 0).
#[repr(C)]
pub struct Memo {
    /// The module [`unloads`](modules::unloads) count its rules hold for: when modules were
    /// removed since, the memo is emptied (their addresses may hold other code now).
    unloads: u64,
    pcs: [u64; MEMO_DEPTH],
    rules: [u64; MEMO_DEPTH],
    /// `[pc, rule]`.
    slots: [[u64; 2]; MEMO_SLOTS],
}

/// A return address's place in [`Memo`]'s table by address.
#[inline(always)]
fn memo_slot(pc: u64) -> usize {
    (pc.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 55) as usize
}

impl Memo {
    /// Empties the memo when modules were removed since its rules were found; returns the
    /// removal count to walk with.
    #[inline(always)]
    fn sync(&mut self) -> u64 {
        let unloads = modules::unloads();
        if self.unloads != unloads {
            self.forget_all(unloads);
        }
        unloads
    }

    #[cold]
    fn forget_all(&mut self, unloads: u64) {
        self.pcs.fill(0);
        self.rules.fill(0);
        self.slots.fill([0; 2]);
        self.unloads = unloads;
    }

    /// The rule for `pc`, met at `depth` of a walk.
    #[inline(always)]
    fn rule(&mut self, depth: usize, pc: u64, emit: Emit) -> Rule {
        let unloads = self.unloads;
        let (Some(p), Some(r)) = (self.pcs.get_mut(depth), self.rules.get_mut(depth)) else {
            return rule_for(pc, unloads, emit);
        };
        if *p == pc && *r != 0 {
            return Rule(*r);
        }
        let rule = match self.slots.get_mut(memo_slot(pc)) {
            Some(slot) if slot[0] == pc && slot[1] != 0 => Rule(slot[1]),
            Some(slot) => {
                let rule = rule_for(pc, unloads, emit);
                *slot = [pc, rule.0];
                rule
            }
            None => rule_for(pc, unloads, emit),
        };
        *p = pc;
        *r = rule.0;
        rule
    }

    /// After a walk that ended at code in no module (`pc`, met at `depth`): forgets that rule
    /// if the module table grew since it was found, and says whether it did, so the walk is
    /// tried again. Done once per walk that ends so, not per frame: the hits stay as cheap.
    #[cold]
    fn forget_stale(&mut self, depth: usize, pc: u64) -> bool {
        let mut forgot = false;
        if let (Some(p), Some(r)) = (self.pcs.get_mut(depth), self.rules.get_mut(depth))
            && *p == pc
            && Rule(*r).is_stale()
        {
            *p = 0;
            *r = 0;
            forgot = true;
        }
        if let Some(slot) = self.slots.get_mut(memo_slot(pc))
            && slot[0] == pc
            && Rule(slot[1]).is_stale()
        {
            *slot = [0, 0];
            forgot = true;
        }
        forgot
    }
}

/// Mixes one frame into a stack's hash. Done during the walk, where its multiply overlaps the
/// walk's own memory reads instead of following them.
#[inline(always)]
fn mix(h: u64, word: u64) -> u64 {
    (h.rotate_left(23) ^ word).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// A walk's result: frames stored, why it ended, and the hash of both (never 0).
pub struct Walked {
    pub frames: usize,
    pub end: End,
    pub hash: u64,
    /// Where the walk ended: the depth and the address looked up.
    last: (usize, u64),
}

fn walked(frames: usize, end: End, h: u64, last: (usize, u64)) -> Walked {
    let h = mix(h, end as u64);
    Walked {
        frames,
        end,
        hash: (h ^ (h >> 31)).max(1),
        last,
    }
}

/// Walks from `regs` (the first pc exact, as read by the caller) and stores the return
/// addresses in `out` (the first [`Walked::frames`] entries are written), starting with the
/// first frame outside `[skip_lo, skip_hi)` (the tracer's own frames, at most 8 of them).
/// `[stack_lo, stack_hi)` bounds every stack read.
pub fn walk(
    regs: Regs,
    stack_lo: u64,
    stack_hi: u64,
    skip: (u64, u64),
    out: &mut [std::mem::MaybeUninit<u64>; MAX_DEPTH],
    memo: &mut Memo,
    emit: Emit,
) -> Walked {
    let w = walk_once(regs, stack_lo, stack_hi, skip, out, memo, emit);
    // Ended at code in no module: if the module table grew since that was found, the
    // module may be known now.
    if w.end == End::NoInfo && memo.forget_stale(w.last.0, w.last.1) {
        return walk_once(regs, stack_lo, stack_hi, skip, out, memo, emit);
    }
    w
}

#[inline(always)]
fn walk_once(
    mut regs: Regs,
    stack_lo: u64,
    stack_hi: u64,
    skip: (u64, u64),
    out: &mut [std::mem::MaybeUninit<u64>; MAX_DEPTH],
    memo: &mut Memo,
    emit: Emit,
) -> Walked {
    // The removal count is part of the stack: the same addresses after a `dlclose` may be
    // another library's code, whose stack must not take the id (and so the symbols) of the
    // one before.
    let mut h = mix(0x243F_6A88_85A3_08D3u64, memo.sync());
    let mut lookup = regs.pc;
    let mut depth = 0;
    while depth < 8 && regs.pc >= skip.0 && regs.pc < skip.1 {
        let rule = memo.rule(depth, lookup, emit);
        if let Err(end) = step(&mut regs, rule, stack_lo, stack_hi) {
            return walked(0, end, h, (depth, lookup));
        }
        depth += 1;
        lookup = regs.pc - 1;
    }
    for (n, slot) in out.iter_mut().enumerate() {
        slot.write(regs.pc);
        h = mix(h, regs.pc);
        let rule = memo.rule(depth + n, lookup, emit);
        if let Err(end) = step(&mut regs, rule, stack_lo, stack_hi) {
            return walked(n + 1, end, h, (depth + n, lookup));
        }
        lookup = regs.pc - 1;
    }
    walked(MAX_DEPTH, End::DepthCap, h, (0, 0))
}

/// One frame outward by `rule`, every read checked; `Err` says why the walk ends there (the
/// outermost frame is a caller at address 0).
#[inline(always)]
fn step(regs: &mut Regs, rule: Rule, lo: u64, hi: u64) -> Result<(), End> {
    let base = match rule.cfa_reg() {
        CFA_RSP => regs.sp,
        CFA_RBP => regs.bp,
        _ => return Err(rule.end()),
    };
    let cfa = base.wrapping_add_signed(i64::from(rule.0 as u32 as i32));
    // The caller's frame lies above this one (stacks grow down); the saved words are whole
    // words at whole-word offsets from it.
    if cfa <= regs.sp || cfa > hi || !cfa.is_multiple_of(8) {
        return Err(End::BadFrame);
    }
    // Never below this frame's stack pointer: the thread's stack is mapped from there up
    // (below it, the main thread's stack may not be mapped yet). A word at `a` may be read
    // when `lo <= a` and `a + 8 <= hi`: one unsigned comparison.
    let lo = lo.max(regs.sp);
    let room = hi.saturating_sub(lo).saturating_sub(7);
    let read = |a: u64| -> Result<u64, End> {
        if a.wrapping_sub(lo) >= room {
            return Err(End::BadFrame);
        }
        // SAFETY: a whole, aligned word inside the thread's stack, checked above.
        Ok(unsafe { (a as *const u64).read() })
    };
    let ra_off = i64::from((rule.0 >> 56) as u8 as i8) * 8;
    let pc = read(cfa.wrapping_add_signed(ra_off))?;
    if (rule.0 >> 34) & 1 == 1 {
        regs.bp = read(cfa.wrapping_add_signed(i64::from((rule.0 >> 40) as u16 as i16)))?;
    }
    if pc == 0 {
        return Err(End::Complete);
    }
    regs.pc = pc;
    regs.sp = cfa;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::MaybeUninit;

    /// A rule: the CFA `cfa_off` bytes above the stack pointer, the return address in the word
    /// below it.
    fn rsp_rule(cfa_off: u32) -> Rule {
        Rule(u64::from(cfa_off) | CFA_RSP << 32 | u64::from((-1i8) as u8) << 56)
    }

    fn no_module(_: &modules::Module, _: &modules::Names) {}

    fn empty_memo() -> Box<Memo> {
        // SAFETY: a memo is integers only; zeroed is empty.
        Box::new(unsafe { std::mem::zeroed() })
    }

    fn cache_slot(pc: u64) -> u64 {
        (pc.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 48) & (CACHE_SLOTS as u64 - 1)
    }

    /// A stack whose frames have the given CFA offsets: the first frame's pc is `first`
    /// (looked up exactly), each later one the return address left below its caller's CFA;
    /// the outermost returns to 0.
    fn build(first: u64, frames: &[(u64, u32)]) -> (Vec<u64>, Regs) {
        let words: usize = frames
            .iter()
            .map(|&(_, off)| off as usize / 8)
            .sum::<usize>()
            + 2;
        let mut stack = vec![0u64; words];
        let base = stack.as_ptr() as u64;
        let mut at = 0usize;
        for (i, &(_, off)) in frames.iter().enumerate() {
            at += off as usize / 8;
            // The caller's return address, or 0 for the outermost frame.
            stack[at - 1] = frames.get(i + 1).map_or(0, |&(pc, _)| pc);
        }
        let regs = Regs {
            pc: first,
            sp: base,
            bp: 0,
        };
        (stack, regs)
    }

    fn walk_all(stack: &[u64], regs: Regs, memo: &mut Memo) -> (Vec<u64>, End) {
        let lo = stack.as_ptr() as u64;
        let hi = lo + 8 * stack.len() as u64;
        let mut out = [MaybeUninit::<u64>::uninit(); MAX_DEPTH];
        let w = walk(regs, lo, hi, (0, 0), &mut out, memo, no_module);
        let pcs = out[..w.frames]
            .iter()
            .map(|p| unsafe { p.assume_init() })
            .collect();
        (pcs, w.end)
    }

    #[test]
    fn frames_met_again_at_other_depths_keep_their_own_rules() {
        // Two return addresses that share a slot of the thread's table but not of the shared
        // cache, with different frame sizes, met at the same depth in turn.
        let a = 0x7000_0000_1000u64;
        let mut b = a + 16;
        while memo_slot(b - 1) != memo_slot(a - 1) || cache_slot(b - 1) == cache_slot(a - 1) {
            b += 16;
        }
        let (first, outer) = (0x7000_0000_0100u64, 0x7000_0000_9000u64);
        for (pc, off) in [(first, 16), (a - 1, 32), (b - 1, 48), (outer - 1, 16)] {
            remember(pc, 0, rsp_rule(off));
        }
        let mut memo = empty_memo();
        let (sa, ra) = build(first, &[(first, 16), (a, 32), (outer, 16)]);
        let (sb, rb) = build(first, &[(first, 16), (b, 48), (outer, 16)]);
        for _ in 0..3 {
            assert_eq!(
                walk_all(&sa, ra, &mut memo),
                (vec![first, a, outer], End::Complete)
            );
            assert_eq!(
                walk_all(&sb, rb, &mut memo),
                (vec![first, b, outer], End::Complete)
            );
        }
        // Once the shared cache forgets them, the thread's own table still knows.
        for pc in [a - 1, b - 1] {
            let s = slot_of(pc);
            s.rule.store(0, Ordering::Relaxed);
            s.key.store(0, Ordering::Relaxed);
        }
        memo.pcs = [0; MEMO_DEPTH];
        assert_eq!(
            walk_all(&sb, rb, &mut memo),
            (vec![first, b, outer], End::Complete)
        );
    }

    #[test]
    fn code_in_no_module_is_looked_up_again_once_the_module_table_grows() {
        let (first, next) = (0x7200_0000_0100u64, 0x7200_0000_2000u64);
        remember(first, 0, rsp_rule(16));
        let (stack, regs) = build(first, &[(first, 16), (next, 16)]);
        let stopped = (vec![first, next], End::NoInfo);
        let whole = (vec![first, next], End::Complete);
        // Found in no module as things stand: the thread keeps that, and does not look the
        // address up again on each walk (the module's rule appearing in the shared cache is
        // not seen).
        let mut memo = empty_memo();
        remember(next - 1, 0, Rule::no_module(modules::generation()));
        assert_eq!(walk_all(&stack, regs, &mut memo), stopped);
        remember(next - 1, 0, rsp_rule(16));
        assert_eq!(walk_all(&stack, regs, &mut memo), stopped);
        // Found so before the module table last grew: looked up again, and the module's rule
        // is found.
        let mut memo = empty_memo();
        remember(next - 1, 0, Rule::no_module(modules::generation() + 1));
        assert_eq!(walk_all(&stack, regs, &mut memo), stopped);
        remember(next - 1, 0, rsp_rule(16));
        assert_eq!(walk_all(&stack, regs, &mut memo), whole);
        // So is one found while the module table was busy, whatever its generation.
        let mut memo = empty_memo();
        remember(next - 1, 0, Rule::no_module(NO_GENERATION));
        assert_eq!(walk_all(&stack, regs, &mut memo), stopped);
        remember(next - 1, 0, rsp_rule(16));
        assert_eq!(walk_all(&stack, regs, &mut memo), whole);
    }

    #[test]
    fn rules_found_before_modules_were_removed_are_not_found_after() {
        let (first, next) = (0x7400_0000_0100u64, 0x7400_0000_2000u64);
        remember(first, 0, rsp_rule(16));
        remember(next - 1, 0, rsp_rule(16));
        assert!(cached(next - 1, 0).is_some());
        assert!(cached(next - 1, 1).is_none());
        // A thread's own rules go too: its memo of an older removal count is emptied.
        let (stack, regs) = build(first, &[(first, 16), (next, 16)]);
        let mut memo = empty_memo();
        assert_eq!(
            walk_all(&stack, regs, &mut memo),
            (vec![first, next], End::Complete)
        );
        memo.unloads = u64::MAX;
        memo.sync();
        assert!(memo.pcs.iter().chain(&memo.rules).all(|&w| w == 0));
        assert_eq!(memo.unloads, modules::unloads());
    }

    #[test]
    fn the_last_word_of_the_stack_is_read_and_the_word_past_it_is_not() {
        let (first, outer) = (0x7300_0000_0100u64, 0x7300_0000_2000u64);
        // The outermost frame's CFA is the stack's end: its return address is the last word.
        remember(first, 0, rsp_rule(16));
        remember(outer - 1, 0, rsp_rule(16));
        let mut memo = empty_memo();
        let mut stack = vec![0u64; 4];
        stack[1] = outer;
        let regs = Regs {
            pc: first,
            sp: stack.as_ptr() as u64,
            bp: 0,
        };
        assert_eq!(
            walk_all(&stack, regs, &mut memo),
            (vec![first, outer], End::Complete)
        );
        // A return address at the CFA itself, which is the stack's end: one word past it.
        let past = 0x7300_0000_3000u64;
        stack[1] = past;
        remember(past - 1, 0, Rule(16 | CFA_RSP << 32));
        assert_eq!(
            walk_all(&stack, regs, &mut memo),
            (vec![first, past], End::BadFrame)
        );
    }

    #[test]
    fn reads_outside_the_stack_end_the_walk() {
        let (first, next) = (0x7100_0000_0100u64, 0x7100_0000_2000u64);
        remember(first, 0, rsp_rule(16));
        remember(next - 1, 0, rsp_rule(4096));
        let mut memo = empty_memo();
        let (stack, regs) = build(first, &[(first, 16), (next, 16)]);
        // The second frame's CFA is far above the stack's end.
        assert_eq!(
            walk_all(&stack, regs, &mut memo),
            (vec![first, next], End::BadFrame)
        );
    }
}
