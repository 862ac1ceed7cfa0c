//! Reading `.eh_frame_hdr` and `.eh_frame` in memory, and interpreting a CFA program up to
//! one address: the row of the call-frame table that [`crate::unwind`] packs into a rule.
//! Every read is checked against the module's mapped segments ([`Module::holds`]); anything
//! malformed or outside the common x86-64 rules gives `None` or a row the walk stops at.

use crate::modules::Module;

/// How a register is recovered in the caller.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Reg {
    /// Unchanged (callee-saved and not yet saved, or `same_value`).
    Same,
    /// Saved at CFA + offset.
    Offset(i64),
    /// No value: for the return address, the outermost frame.
    Undefined,
    /// A rule the walk does not follow (in another register, an expression).
    Other,
}

/// One row of the call-frame table: what [`compute`] returns.
#[derive(Clone, Copy, Debug)]
pub struct Row {
    /// DWARF register number the CFA is based on (7 rsp, 6 rbp).
    pub cfa_reg: u64,
    pub cfa_off: i64,
    /// The CFA is a DWARF expression.
    pub cfa_expression: bool,
    /// rbp (DWARF 6).
    pub bp: Reg,
    /// The return address (DWARF 16).
    pub ra: Reg,
    /// The CIE says `S`: a signal frame.
    pub signal_frame: bool,
}

const DW_EH_PE_OMIT: u8 = 0xff;
const REG_BP: u64 = 6;
const REG_RA: u64 = 16;
/// Depth of `remember_state`.
const STATE_STACK: usize = 8;

/// A checked cursor over a module's memory.
struct Reader<'a> {
    m: &'a Module,
    p: u64,
    end: u64,
}

impl<'a> Reader<'a> {
    /// A reader over `[p, end)`, which must lie in one segment of `m`.
    fn new(m: &'a Module, p: u64, end: u64) -> Option<Self> {
        (end >= p && m.holds(p, end - p)).then_some(Self { m, p, end })
    }

    /// A reader from `p` to the end of its segment.
    fn at(m: &'a Module, p: u64) -> Option<Self> {
        Some(Self {
            m,
            p,
            end: m.segment_end(p)?,
        })
    }

    fn bytes<const N: usize>(&mut self) -> Option<[u8; N]> {
        let next = self.p.checked_add(N as u64)?;
        if next > self.end {
            return None;
        }
        // SAFETY: [p, p + N) lies inside a mapped segment of the module (checked at creation).
        let v = unsafe { (self.p as *const [u8; N]).read_unaligned() };
        self.p = next;
        Some(v)
    }

    fn u8(&mut self) -> Option<u8> {
        self.bytes::<1>().map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.bytes().map(u16::from_le_bytes)
    }
    fn u32(&mut self) -> Option<u32> {
        self.bytes().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.bytes().map(u64::from_le_bytes)
    }

    fn uleb(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..70).step_by(7) {
            let b = self.u8()?;
            if shift < 64 {
                v |= u64::from(b & 0x7f) << shift;
            }
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    fn sleb(&mut self) -> Option<i64> {
        let mut v = 0i64;
        let mut shift = 0;
        loop {
            let b = self.u8()?;
            if shift < 64 {
                v |= i64::from(b & 0x7f) << shift;
            }
            shift += 7;
            if b & 0x80 == 0 {
                if shift < 64 && b & 0x40 != 0 {
                    v |= -1 << shift;
                }
                return Some(v);
            }
            if shift > 70 {
                return None;
            }
        }
    }

    fn skip(&mut self, n: u64) -> Option<()> {
        let next = self.p.checked_add(n)?;
        (next <= self.end).then(|| self.p = next)
    }

    /// A pointer in `enc` (`DW_EH_PE_*`): absolute or pc-relative, or data-relative to `data`.
    fn encoded(&mut self, enc: u8, data: u64) -> Option<u64> {
        let at = self.p;
        let v = match enc & 0x0f {
            0x00 => self.u64()?,
            0x01 => self.uleb()?,
            0x02 => u64::from(self.u16()?),
            0x03 => u64::from(self.u32()?),
            0x04 => self.u64()?,
            0x09 => self.sleb()? as u64,
            0x0a => self.u16()? as i16 as u64,
            0x0b => self.u32()? as i32 as u64,
            0x0c => self.u64()?,
            _ => return None,
        };
        let v = match enc & 0x70 {
            0x00 => v,
            0x10 => at.wrapping_add(v),
            0x30 => data.wrapping_add(v),
            _ => return None,
        };
        if enc & 0x80 != 0 {
            // Indirect: the value is the address of the pointer.
            return Reader::new(self.m, v, v.checked_add(8)?)?.u64();
        }
        Some(v)
    }
}

/// The row for `pc` in module `m`, or `None` when it has no FDE or the data is malformed.
pub fn compute(m: &Module, pc: u64) -> Option<Row> {
    let fde = find_fde(m, pc)?;
    let (cie, begin, fde_body) = parse_fde(m, fde, pc)?;
    interpret(m, &cie, begin, fde_body, pc)
}

/// Binary search of `.eh_frame_hdr`'s table (datarel sdata4 pairs, sorted by address).
fn find_fde(m: &Module, pc: u64) -> Option<u64> {
    let hdr = m.eh_frame_hdr;
    if hdr == 0 {
        return None;
    }
    let mut r = Reader::at(m, hdr)?;
    let version = r.u8()?;
    let ptr_enc = r.u8()?;
    let count_enc = r.u8()?;
    let table_enc = r.u8()?;
    if version != 1 || table_enc != 0x3b || count_enc == DW_EH_PE_OMIT {
        return None;
    }
    r.encoded(ptr_enc, hdr)?;
    let count = r.encoded(count_enc, hdr)?;
    let table = r.p;
    let table_bytes = count.checked_mul(8)?;
    Reader::new(m, table, table.checked_add(table_bytes)?)?;
    let entry = |i: u64| -> Option<(u64, u64)> {
        let mut e = Reader::new(m, table + i * 8, table + i * 8 + 8)?;
        let loc = hdr.wrapping_add_signed(i64::from(e.u32()? as i32));
        let fde = hdr.wrapping_add_signed(i64::from(e.u32()? as i32));
        Some((loc, fde))
    };
    let (mut lo, mut hi) = (0u64, count);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if entry(mid)?.0 <= pc {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    let (_, fde) = entry(lo.checked_sub(1)?)?;
    Some(fde)
}

/// What a CIE says.
struct Cie {
    code_align: u64,
    data_align: i64,
    ra_reg: u64,
    fde_enc: u8,
    has_aug_data: bool,
    signal_frame: bool,
    /// Its initial instructions.
    program: (u64, u64),
}

/// Reads the length of an `.eh_frame` entry at `r` and returns its end.
fn entry_end(r: &mut Reader<'_>) -> Option<u64> {
    let len = r.u32()?;
    if len == 0 || len == u32::MAX {
        // A terminator, or a 64-bit entry (never emitted in .eh_frame on x86-64).
        return None;
    }
    r.p.checked_add(u64::from(len))
}

fn parse_cie(m: &Module, at: u64) -> Option<Cie> {
    let mut r = Reader::at(m, at)?;
    let end = entry_end(&mut r)?;
    r.end = r.end.min(end);
    if r.u32()? != 0 {
        return None;
    }
    let version = r.u8()?;
    let mut aug = [0u8; 8];
    let mut aug_len = 0;
    loop {
        let c = r.u8()?;
        if c == 0 {
            break;
        }
        *aug.get_mut(aug_len)? = c;
        aug_len += 1;
    }
    let aug = &aug[..aug_len];
    let code_align = r.uleb()?;
    let data_align = r.sleb()?;
    let ra_reg = if version == 1 {
        u64::from(r.u8()?)
    } else {
        r.uleb()?
    };
    let mut cie = Cie {
        code_align,
        data_align,
        ra_reg,
        fde_enc: 0,
        has_aug_data: aug.first() == Some(&b'z'),
        signal_frame: false,
        program: (0, 0),
    };
    if cie.has_aug_data {
        let len = r.uleb()?;
        let data_end = r.p.checked_add(len)?;
        for &c in aug.get(1..)? {
            match c {
                b'R' => cie.fde_enc = r.u8()?,
                b'L' => {
                    r.u8()?;
                }
                b'P' => {
                    let enc = r.u8()?;
                    r.encoded(enc & 0x7f, 0)?;
                }
                b'S' => cie.signal_frame = true,
                _ => break,
            }
        }
        r.p = data_end;
    } else if !aug.is_empty() {
        return None;
    }
    cie.program = (r.p, end);
    Some(cie)
}

/// The FDE at `at` when it covers `pc`: its CIE, its first address and its instructions.
fn parse_fde(m: &Module, at: u64, pc: u64) -> Option<(Cie, u64, (u64, u64))> {
    let mut r = Reader::at(m, at)?;
    let end = entry_end(&mut r)?;
    r.end = r.end.min(end);
    let cie_field = r.p;
    let cie_off = r.u32()?;
    if cie_off == 0 {
        return None;
    }
    let cie = parse_cie(m, cie_field.checked_sub(u64::from(cie_off))?)?;
    let begin = r.encoded(cie.fde_enc, 0)?;
    let range = r.encoded(cie.fde_enc & 0x0f, 0)?;
    if pc < begin || pc - begin >= range {
        return None;
    }
    if cie.has_aug_data {
        let len = r.uleb()?;
        r.skip(len)?;
    }
    Some((cie, begin, (r.p, end)))
}

/// The registers' rules while interpreting.
#[derive(Clone, Copy)]
struct State {
    cfa_reg: u64,
    cfa_off: i64,
    cfa_expression: bool,
    bp: Reg,
    ra: Reg,
}

/// Runs the CIE's initial instructions, then the FDE's (from `begin`) up to `pc`.
fn interpret(m: &Module, cie: &Cie, begin: u64, fde: (u64, u64), pc: u64) -> Option<Row> {
    if cie.ra_reg != REG_RA {
        return None;
    }
    let start = State {
        cfa_reg: 7,
        cfa_off: 8,
        cfa_expression: false,
        bp: Reg::Same,
        ra: Reg::Same,
    };
    let mut it = Interp {
        cie,
        state: start,
        initial: start,
        saved: [start; STATE_STACK],
        depth: 0,
        loc: 0,
    };
    it.run(Reader::new(m, cie.program.0, cie.program.1)?, u64::MAX)?;
    it.initial = it.state;
    it.loc = begin;
    it.run(Reader::new(m, fde.0, fde.1)?, pc)?;
    let s = it.state;
    Some(Row {
        cfa_reg: s.cfa_reg,
        cfa_off: s.cfa_off,
        cfa_expression: s.cfa_expression,
        bp: s.bp,
        ra: s.ra,
        signal_frame: cie.signal_frame,
    })
}

struct Interp<'c> {
    cie: &'c Cie,
    state: State,
    initial: State,
    saved: [State; STATE_STACK],
    depth: usize,
    loc: u64,
}

impl Interp<'_> {
    fn set(&mut self, reg: u64, rule: Reg) {
        match reg {
            REG_BP => self.state.bp = rule,
            REG_RA => self.state.ra = rule,
            _ => {}
        }
    }

    fn restore(&mut self, reg: u64) {
        match reg {
            REG_BP => self.state.bp = self.initial.bp,
            REG_RA => self.state.ra = self.initial.ra,
            _ => {}
        }
    }

    /// Advances the location; `false` once it passes `pc` (the row is complete).
    fn advance(&mut self, delta: u64, pc: u64) -> bool {
        self.loc = self
            .loc
            .wrapping_add(delta.wrapping_mul(self.cie.code_align));
        self.loc <= pc
    }

    /// Interprets instructions until their end or until the location passes `pc`.
    fn run(&mut self, mut r: Reader<'_>, pc: u64) -> Option<()> {
        let data_align = self.cie.data_align;
        while r.p < r.end {
            let op = r.u8()?;
            let low = u64::from(op & 0x3f);
            match op >> 6 {
                1 => {
                    if !self.advance(low, pc) {
                        return Some(());
                    }
                    continue;
                }
                2 => {
                    let off = (r.uleb()? as i64).wrapping_mul(data_align);
                    self.set(low, Reg::Offset(off));
                    continue;
                }
                3 => {
                    self.restore(low);
                    continue;
                }
                _ => {}
            }
            if !self.extended(op, &mut r, pc)? {
                return Some(());
            }
        }
        Some(())
    }

    /// The instructions with a zero high part; `Some(false)` once the location passes `pc`.
    fn extended(&mut self, op: u8, r: &mut Reader<'_>, pc: u64) -> Option<bool> {
        let data_align = self.cie.data_align;
        match op {
            0x00 => {}
            0x01 => {
                let to = r.encoded(self.cie.fde_enc, 0)?;
                self.loc = to;
                return Some(to <= pc);
            }
            0x02 => return Some(self.advance(u64::from(r.u8()?), pc)),
            0x03 => return Some(self.advance(u64::from(r.u16()?), pc)),
            0x04 => return Some(self.advance(u64::from(r.u32()?), pc)),
            0x05 => {
                let reg = r.uleb()?;
                let off = (r.uleb()? as i64).wrapping_mul(data_align);
                self.set(reg, Reg::Offset(off));
            }
            0x06 => {
                let reg = r.uleb()?;
                self.restore(reg);
            }
            0x07 => {
                let reg = r.uleb()?;
                self.set(reg, Reg::Undefined);
            }
            0x08 => {
                let reg = r.uleb()?;
                self.set(reg, Reg::Same);
            }
            0x09 => {
                let reg = r.uleb()?;
                r.uleb()?;
                self.set(reg, Reg::Other);
            }
            0x0a => {
                *self.saved.get_mut(self.depth)? = self.state;
                self.depth += 1;
            }
            0x0b => {
                self.depth = self.depth.checked_sub(1)?;
                // The CFA is kept as the state had it (DWARF 5: restore_state restores the
                // register rules and the CFA rule alike).
                self.state = *self.saved.get(self.depth)?;
            }
            0x0c => {
                self.state.cfa_reg = r.uleb()?;
                self.state.cfa_off = r.uleb()? as i64;
                self.state.cfa_expression = false;
            }
            0x0d => {
                self.state.cfa_reg = r.uleb()?;
                self.state.cfa_expression = false;
            }
            0x0e => self.state.cfa_off = r.uleb()? as i64,
            0x0f => {
                let len = r.uleb()?;
                r.skip(len)?;
                self.state.cfa_expression = true;
            }
            0x10 | 0x16 => {
                let reg = r.uleb()?;
                let len = r.uleb()?;
                r.skip(len)?;
                self.set(reg, Reg::Other);
            }
            0x11 => {
                let reg = r.uleb()?;
                let off = r.sleb()?.wrapping_mul(data_align);
                self.set(reg, Reg::Offset(off));
            }
            0x12 => {
                self.state.cfa_reg = r.uleb()?;
                self.state.cfa_off = r.sleb()?.wrapping_mul(data_align);
                self.state.cfa_expression = false;
            }
            0x13 => self.state.cfa_off = r.sleb()?.wrapping_mul(data_align),
            0x14 | 0x15 => {
                let reg = r.uleb()?;
                if op == 0x14 {
                    r.uleb()?;
                } else {
                    r.sleb()?;
                }
                self.set(reg, Reg::Other);
            }
            0x2e => {
                r.uleb()?;
            }
            0x2f => {
                let reg = r.uleb()?;
                let off = (r.uleb()? as i64).wrapping_mul(data_align).wrapping_neg();
                self.set(reg, Reg::Offset(off));
            }
            _ => return None,
        }
        Some(true)
    }
}
