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
//! did not see halves of two writes), so a program's repeated stacks cost a table read and a
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

use crate::modules::{self, Module};

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

impl Rule {
    fn stop(end: End) -> Self {
        Self(u64::from(end as u8) << 8 | 1 << 63)
    }

    fn cfa_reg(self) -> u64 {
        (self.0 >> 32) & 3
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

#[inline(always)]
fn cached(pc: u64) -> Option<Rule> {
    let s = slot_of(pc);
    let rule = s.rule.load(Ordering::Relaxed);
    let key = s.key.load(Ordering::Relaxed);
    (rule != 0 && key ^ rule == pc).then_some(Rule(rule))
}

fn remember(pc: u64, rule: Rule) {
    let s = slot_of(pc);
    s.rule.store(rule.0, Ordering::Relaxed);
    s.key.store(pc ^ rule.0, Ordering::Relaxed);
}

/// The rule for code address `pc` (a return address less one, or the exact first pc).
#[inline(always)]
fn rule_for(pc: u64, emit: fn(&Module)) -> Rule {
    match cached(pc) {
        Some(r) => r,
        None => compute_rule(pc, emit),
    }
}

/// A rule not in the cache: computed from the module's CFI and cached.
#[cold]
#[inline(never)]
fn compute_rule(pc: u64, emit: fn(&Module)) -> Rule {
    let Some(m) = modules::find_or_refresh(pc, emit) else {
        // Not cached: the module may be mapped later.
        return Rule::stop(End::NoInfo);
    };
    let rule = crate::cfi::compute(m, pc).map_or(Rule::stop(End::NoInfo), |s| pack(&s));
    remember(pc, rule);
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
        Reg::Offset(o) if i64::from(o as i16) == o => (1, o as i16),
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

/// Frames a [`Memo`] remembers.
const MEMO_DEPTH: usize = MAX_DEPTH + 8;

/// A thread's rules of its previous walk, by depth: consecutive stacks of a thread share most
/// of their frames, and this array stays in the L1 cache where the shared table may not.
/// Zeroed memory is an empty memo (no frame is at address 0).
#[repr(C)]
pub struct Memo {
    pcs: [u64; MEMO_DEPTH],
    rules: [u64; MEMO_DEPTH],
}

impl Memo {
    /// The rule for `pc`, met at `depth` of a walk.
    #[inline(always)]
    fn rule(&mut self, depth: usize, pc: u64, emit: fn(&Module)) -> Rule {
        let (Some(p), Some(r)) = (self.pcs.get_mut(depth), self.rules.get_mut(depth)) else {
            return rule_for(pc, emit);
        };
        if *p == pc && *r != 0 {
            return Rule(*r);
        }
        let rule = rule_for(pc, emit);
        *p = pc;
        *r = rule.0;
        rule
    }
}

/// Reads the stack word at `addr` when it lies in `[lo, hi)`.
#[inline(always)]
fn read_stack(addr: u64, lo: u64, hi: u64) -> Option<u64> {
    if addr < lo || addr.checked_add(8)? > hi || !addr.is_multiple_of(8) {
        return None;
    }
    // SAFETY: inside the thread's stack, checked above.
    Some(unsafe { (addr as *const u64).read() })
}

/// Walks from `regs` (the first pc exact, as read by the caller) and stores the return
/// addresses in `out` (the first of the returned count are written), starting with the first frame outside `[skip_lo, skip_hi)` (the
/// tracer's own frames). `[stack_lo, stack_hi)` bounds every stack read. Returns the frames
/// stored and why the walk ended.
pub fn walk(
    mut regs: Regs,
    stack_lo: u64,
    stack_hi: u64,
    skip: (u64, u64),
    out: &mut [std::mem::MaybeUninit<u64>; MAX_DEPTH],
    memo: &mut Memo,
    emit: fn(&Module),
) -> (usize, End) {
    let mut n = 0;
    let mut exact = true;
    let mut skipping = true;
    for depth in 0..MAX_DEPTH + 8 {
        if skipping && !(regs.pc >= skip.0 && regs.pc < skip.1) {
            skipping = false;
        }
        if !skipping {
            let Some(slot) = out.get_mut(n) else {
                return (n, End::DepthCap);
            };
            slot.write(regs.pc);
            n += 1;
        }
        let lookup = if exact { regs.pc } else { regs.pc - 1 };
        exact = false;
        let rule = memo.rule(depth, lookup, emit);
        let base = match rule.cfa_reg() {
            CFA_RSP => regs.sp,
            CFA_RBP => regs.bp,
            _ => return (n, rule.end()),
        };
        match step(regs, base, rule, stack_lo, stack_hi) {
            Some(next) if next.pc == 0 => return (n, End::Complete),
            Some(next) => regs = next,
            None => return (n, End::BadFrame),
        }
    }
    (n, End::DepthCap)
}

/// One frame outward, every read checked.
#[inline(always)]
fn step(regs: Regs, base: u64, rule: Rule, lo: u64, hi: u64) -> Option<Regs> {
    let cfa = base.wrapping_add_signed(i64::from(rule.0 as u32 as i32));
    // The caller's frame lies above this one (stacks grow down).
    if cfa <= regs.sp || cfa > hi {
        return None;
    }
    // Never below this frame's stack pointer: the thread's stack is mapped from there up
    // (below it, the main thread's stack may not be mapped yet).
    let lo = lo.max(regs.sp);
    let ra_off = i64::from((rule.0 >> 56) as u8 as i8) * 8;
    let pc = read_stack(cfa.wrapping_add_signed(ra_off), lo, hi)?;
    let bp = if (rule.0 >> 34) & 1 == 1 {
        let off = i64::from((rule.0 >> 40) as u16 as i16);
        read_stack(cfa.wrapping_add_signed(off), lo, hi)?
    } else {
        regs.bp
    };
    Some(Regs { pc, sp: cfa, bp })
}
