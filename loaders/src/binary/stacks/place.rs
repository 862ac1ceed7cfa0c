//! Placing a spool's stack definitions in its modules: each return address becomes a code
//! location (module + offset, deduplicated), each definition a stack of locations, and each
//! Python frame a location in the Python frames' module, named by its code object.
//!
//! [`Placer`] does it as the spool is read, so that a trace written while the program runs
//! can carry the stacks of its events so far (`record --live` shows their sites): the tables
//! only grow (modules and locations are appended, stacks added by id), which is what a
//! trace's stack frames can express. A definition is placed once where it lands is settled:
//! each of its addresses in a module ([`ModuleRanges::module_of`] gives one), each of its
//! Python frames' code objects named. Otherwise it waits for more modules or codes, and the
//! last round places it with what there is. The tables are thus those of placing every
//! definition at once at the end ([`from_spool`]), up to the order of their locations.

use std::collections::HashMap;

use super::{
    Location, NativeModule, NativeStack, NativeStacks, PY_FRAME_BIT, PY_LINE_BITS,
    PYTHON_FRAMES_MODULE, PyCode, SourceFrame, StackDef,
};

/// Which module held an address when a stack was recorded. A module unloaded and another
/// mapped at its addresses leave overlapping segments over time: an address belongs to the
/// latest module, among those whose frame came before the stack's definition, with a segment
/// that holds it (the tracer writes out the stacks recorded while a module was mapped before
/// the frame of the one mapped there next); failing that, to the first module read after the
/// definition (a stack recorded while another thread was adding its module to the tracer's
/// table).
#[derive(Default)]
struct ModuleRanges {
    /// Distinct segments, sorted, each with the modules (ascending) that map it.
    segments: Vec<((u64, u64), Vec<u32>)>,
    /// Per segment, the highest end among it and those before it: where a look back stops.
    reach: Vec<u64>,
}

/// Most segments holding one address that a look-up considers: a process has one, a
/// process that unloads libraries a few; more only in a crafted file, whose further modules
/// are then not looked at.
const MAX_OVERLAPS: usize = 64;

impl ModuleRanges {
    fn new(modules: &[NativeModule]) -> Self {
        let mut by_segment: HashMap<(u64, u64), Vec<u32>> = HashMap::new();
        for (m, i) in modules.iter().zip(0u32..) {
            for &segment in &m.segments {
                let holders = by_segment.entry(segment).or_default();
                if holders.last() != Some(&i) {
                    holders.push(i);
                }
            }
        }
        let mut segments: Vec<_> = by_segment.into_iter().collect();
        segments.sort_unstable_by_key(|&(segment, _)| segment);
        let reach = segments
            .iter()
            .scan(0u64, |reach, &((_, hi), _)| {
                *reach = (*reach).max(hi);
                Some(*reach)
            })
            .collect();
        Self { segments, reach }
    }

    /// The index of the module that held `pc` for a stack defined after the first
    /// `modules_before` module frames.
    fn module_of(&self, pc: u64, modules_before: u32) -> Option<u32> {
        let starts = self.segments.partition_point(|&((lo, _), _)| lo <= pc);
        let (mut before, mut after) = (None::<u32>, None::<u32>);
        for j in (0..starts).rev().take(MAX_OVERLAPS) {
            // No segment from here down reaches `pc`.
            if self.reach.get(j).is_none_or(|&reach| reach <= pc) {
                break;
            }
            let Some(((_, hi), holders)) = self.segments.get(j) else {
                break;
            };
            if pc >= *hi {
                continue;
            }
            let k = holders.partition_point(|&m| m < modules_before);
            if let Some(&m) = k.checked_sub(1).and_then(|k| holders.get(k)) {
                before = before.max(Some(m));
            }
            if let Some(&m) = holders.get(k) {
                after = Some(after.map_or(m, |a| a.min(m)));
            }
        }
        before.or(after)
    }
}

/// A spool's stack definitions placed as they come (see the module documentation).
#[derive(Default)]
pub(in crate::binary) struct Placer {
    out: NativeStacks,
    /// Per spool module taken in, its index among the distinct ones (`out.modules`): a
    /// library unloaded and loaded again at the same place has a frame each time.
    canonical: Vec<u32>,
    distinct: HashMap<NativeModule, u32>,
    ranges: ModuleRanges,
    /// The module Python frames are placed in, once a stack has one.
    python: Option<u32>,
    index: HashMap<Location, u32>,
    codes: HashMap<u32, PyCode>,
    /// Definitions not placed yet, by what they wait for ([`Wait`]), and how many modules
    /// and codes there were when each list was last tried: a list is tried again only once
    /// there are more of what it waits for (code in no module, a JIT's, may wait to the end:
    /// it is not looked at again for each new Python code).
    waiting: [Vec<StackDef>; 2],
    tried_with: [usize; 2],
    /// Per module of `out`, whether a location is in it; and those that became so since
    /// [`Self::take_newly_used`].
    used: Vec<bool>,
    newly_used: Vec<u32>,
}

impl Placer {
    /// Takes in the spool's modules read since the last call (`modules`: all read so far).
    pub(in crate::binary) fn take_modules(&mut self, modules: &[NativeModule]) {
        let Some(new) = modules
            .get(self.canonical.len()..)
            .filter(|m| !m.is_empty())
        else {
            return;
        };
        for m in new {
            let next = self.out.modules.len() as u32;
            let i = *self.distinct.entry(m.clone()).or_insert(next);
            if i == next {
                self.out.modules.push(m.clone());
            }
            self.canonical.push(i);
        }
        self.ranges = ModuleRanges::new(modules);
    }

    /// Takes in Python code objects.
    pub(in crate::binary) fn take_codes(&mut self, codes: impl IntoIterator<Item = PyCode>) {
        for c in codes {
            self.codes.insert(c.id, c);
        }
    }

    /// Places `defs`, and those waiting, that can be (all of them when `last`).
    pub(in crate::binary) fn place(
        &mut self,
        defs: impl IntoIterator<Item = StackDef>,
        last: bool,
    ) {
        let now = [self.canonical.len(), self.codes.len()];
        let mut tried: Vec<StackDef> = defs.into_iter().collect();
        for (w, &n) in now.iter().enumerate() {
            if (last || self.tried_with.get(w) != Some(&n))
                && let Some(list) = self.waiting.get_mut(w)
            {
                tried.append(list);
            }
        }
        for def in tried {
            match self.settled(&def).filter(|_| !last) {
                None => self.place_one(def),
                Some(w) => {
                    if let Some(list) = self.waiting.get_mut(w as usize) {
                        list.push(def);
                    }
                }
            }
        }
        self.tried_with = now;
        if self.python.is_some() {
            self.out
                .symbols
                .resize(self.out.locations.len(), Vec::new());
        }
    }

    /// The modules of `out` that a location is in since the last call and none was before
    /// (what `record` reads for the symbolization while the program runs: most modules a
    /// program loads are in no stack).
    pub(in crate::binary) fn take_newly_used(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.newly_used)
    }

    /// The tables so far.
    pub(in crate::binary) fn stacks(&self) -> &NativeStacks {
        &self.out
    }

    /// The tables, once every definition was placed.
    pub(in crate::binary) fn finish(self) -> NativeStacks {
        self.out
    }

    /// What `def` waits for before where it lands is settled (`None`: nothing): a module for
    /// one of its addresses, else a Python frame's code.
    fn settled(&self, def: &StackDef) -> Option<Wait> {
        let mut wait = None;
        for &pc in &def.pcs {
            if pc & PY_FRAME_BIT != 0 {
                if !u32::try_from(pc_code(pc)).is_ok_and(|id| self.codes.contains_key(&id)) {
                    wait = Some(Wait::Code);
                }
            } else if self.ranges.module_of(pc, def.modules_before).is_none() {
                return Some(Wait::Module);
            }
        }
        wait
    }

    fn place_one(&mut self, def: StackDef) {
        let mut locations = Vec::with_capacity(def.pcs.len());
        for &pc in &def.pcs {
            let (loc, name) = if pc & PY_FRAME_BIT != 0 {
                let m = self.python_module();
                let offset = pc & !PY_FRAME_BIT;
                (
                    Location {
                        module: Some(m),
                        offset,
                    },
                    Some(pc),
                )
            } else {
                (self.place_native(pc, def.modules_before), None)
            };
            let next = self.out.locations.len() as u32;
            let i = *self.index.entry(loc).or_insert(next);
            if i == next {
                self.out.locations.push(loc);
                self.note_used(loc.module);
                if self.python.is_some() {
                    let symbol = name.map(|pc| self.python_symbol(pc)).unwrap_or_default();
                    self.out.symbols.resize(next as usize, Vec::new());
                    self.out.symbols.push(symbol);
                }
            }
            locations.push(i);
        }
        self.out.stacks.insert(
            def.id,
            NativeStack {
                locations,
                end: def.end,
            },
        );
    }

    fn note_used(&mut self, module: Option<u32>) {
        let Some(m) = module.filter(|&m| Some(m) != self.python) else {
            return;
        };
        if self.used.len() <= m as usize {
            self.used.resize(m as usize + 1, false);
        }
        if let Some(used) = self.used.get_mut(m as usize)
            && !*used
        {
            *used = true;
            self.newly_used.push(m);
        }
    }

    fn place_native(&self, pc: u64, modules_before: u32) -> Location {
        let m = self
            .ranges
            .module_of(pc, modules_before)
            .and_then(|m| self.canonical.get(m as usize).copied());
        match m {
            Some(m) => Location {
                module: Some(m),
                offset: pc.wrapping_sub(self.out.modules.get(m as usize).map_or(0, |m| m.bias)),
            },
            None => Location {
                module: None,
                offset: pc,
            },
        }
    }

    fn python_module(&mut self) -> u32 {
        *self.python.get_or_insert_with(|| {
            self.out.modules.push(NativeModule {
                path: PYTHON_FRAMES_MODULE.to_owned(),
                ..NativeModule::default()
            });
            (self.out.modules.len() - 1) as u32
        })
    }

    /// The symbol of a Python frame: its code's name and file, and the line.
    fn python_symbol(&self, pc: u64) -> Vec<SourceFrame> {
        let (id, line) = (pc_code(pc), pc & ((1 << PY_LINE_BITS) - 1));
        let code = u32::try_from(id).ok().and_then(|id| self.codes.get(&id));
        vec![SourceFrame {
            function: code.map_or_else(|| format!("<python code {id}>"), |c| c.name.clone()),
            file: code.map_or_else(String::new, |c| c.file.clone()),
            line: u32::try_from(line).unwrap_or(0),
        }]
    }
}

/// What a stack definition waits for before it is placed (an index into `Placer::waiting`).
#[derive(Clone, Copy)]
enum Wait {
    Module = 0,
    Code = 1,
}

/// The code id of a Python frame's `pc`.
fn pc_code(pc: u64) -> u64 {
    (pc & !PY_FRAME_BIT) >> PY_LINE_BITS
}

/// Places all of a spool's stack definitions at once.
#[cfg(test)]
pub(in crate::binary) fn from_spool(
    modules: Vec<NativeModule>,
    defs: Vec<StackDef>,
    codes: &[PyCode],
) -> NativeStacks {
    let mut p = Placer::default();
    p.take_modules(&modules);
    p.take_codes(codes.iter().cloned());
    p.place(defs, true);
    p.finish()
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::{StackEnd, read_stack_def};
    use super::*;
    use crate::binary::codec::{Cursor, put_varint, zigzag};

    pub(in crate::binary::stacks) fn module(
        path: &str,
        bias: u64,
        seg: (u64, u64),
    ) -> NativeModule {
        NativeModule {
            path: path.to_owned(),
            build_id: vec![0xab, 0xcd],
            bias,
            segments: vec![seg],
        }
    }

    #[test]
    fn an_address_mapped_by_several_modules_over_time_is_placed_in_the_one_of_its_stack() {
        // liba, then libb at the same place (a dlclose between), then liba again, then libc
        // elsewhere; and libd, partly over libb's range, after them.
        let modules = vec![
            module("/liba.so", 0x7000_0000, (0x7000_0000, 0x7000_2000)),
            module("/libb.so", 0x7000_0000, (0x7000_0000, 0x7000_3000)),
            module("/liba.so", 0x7000_0000, (0x7000_0000, 0x7000_2000)),
            module("/libc.so", 0x7100_0000, (0x7100_0000, 0x7110_0000)),
            module("/libd.so", 0x7000_2800, (0x7000_2800, 0x7000_4000)),
        ];
        let def = |id: u32, pc: u64, modules_before: u32| StackDef {
            id,
            end: StackEnd::Complete,
            pcs: vec![pc],
            modules_before,
        };
        let s = from_spool(
            modules,
            vec![
                def(1, 0x7000_1000, 1),
                def(2, 0x7000_1000, 2),
                def(3, 0x7000_1000, 3),
                def(4, 0x7000_2900, 2),
                def(5, 0x7000_2900, 5),
                def(6, 0x7000_2100, 5),
                // Recorded before its module's frame was written: the next one to map it.
                def(7, 0x7100_0010, 0),
                def(8, 0x7000_1000, 0),
                def(9, 0x7200_0000, 5),
            ],
            &[],
        );
        // liba is one module, read twice.
        let paths: Vec<&str> = s.modules.iter().map(|m| m.path.as_str()).collect();
        assert_eq!(paths, ["/liba.so", "/libb.so", "/libc.so", "/libd.so"]);
        let placed = |id: u32| {
            let loc = s.locations[s.stacks[&id].locations[0] as usize];
            (
                loc.module.map(|m| s.modules[m as usize].path.as_str()),
                loc.offset,
            )
        };
        assert_eq!(placed(1), (Some("/liba.so"), 0x1000));
        assert_eq!(placed(2), (Some("/libb.so"), 0x1000));
        assert_eq!(placed(3), (Some("/liba.so"), 0x1000));
        assert_eq!(placed(4), (Some("/libb.so"), 0x2900));
        assert_eq!(placed(5), (Some("/libd.so"), 0x100));
        // libb's range past liba's, not mapped again since: still libb's.
        assert_eq!(placed(6), (Some("/libb.so"), 0x2100));
        assert_eq!(placed(7), (Some("/libc.so"), 0x10));
        assert_eq!(placed(8), (Some("/liba.so"), 0x1000));
        assert_eq!(placed(9), (None, 0x7200_0000));
        // The same address in liba's two loads is one location.
        assert_eq!(s.stacks[&1].locations, s.stacks[&3].locations);
    }

    #[test]
    fn spool_definitions_become_module_offsets_with_shared_locations() {
        // A definition as the tracer writes it: id, end, count, zigzag LEB128 deltas.
        let mut def = vec![0x03]; // prefix varint of 1
        def.extend([0u8, 3]);
        let pcs = [0x7000_1234u64, 0x40_0100, 0x9999];
        let mut prev = 0u64;
        for pc in pcs {
            put_varint(&mut def, zigzag(pc.wrapping_sub(prev) as i64));
            prev = pc;
        }
        let mut c = Cursor::new(&def);
        let d = read_stack_def(&mut c, 2).unwrap();
        assert!(c.at_end());
        assert_eq!(
            (d.id, d.end, d.pcs.clone()),
            (1, StackEnd::Complete, pcs.to_vec())
        );
        let second = StackDef {
            id: 2,
            end: StackEnd::DepthCap,
            pcs: vec![0x40_0100],
            modules_before: 2,
        };
        let modules = vec![
            module("/lib/libc.so.6", 0x7000_0000, (0x7000_0000, 0x7010_0000)),
            module("/usr/bin/prog", 0, (0x40_0000, 0x50_0000)),
        ];
        let s = from_spool(modules, vec![d, second], &[]);
        assert_eq!(
            s.locations,
            [
                Location {
                    module: Some(0),
                    offset: 0x1234
                },
                Location {
                    module: Some(1),
                    offset: 0x40_0100
                },
                Location {
                    module: None,
                    offset: 0x9999
                },
            ]
        );
        assert_eq!(s.stacks[&1].locations, [0, 1, 2]);
        assert_eq!(s.stacks[&2].locations, [1]);
    }

    fn python_pc(code: u64, line: u64) -> u64 {
        PY_FRAME_BIT | code << PY_LINE_BITS | line
    }

    /// A frame as what it names: module path, offset and symbols.
    type Named = (Option<String>, u64, Vec<SourceFrame>);

    /// Each stack as what its frames name (the location indices differ with the order of
    /// placement).
    fn resolved(s: &NativeStacks) -> std::collections::BTreeMap<u32, Vec<Named>> {
        s.stacks
            .iter()
            .map(|(&id, st)| {
                let frames = st
                    .locations
                    .iter()
                    .map(|&l| {
                        let loc = s.locations[l as usize];
                        let module = loc.module.map(|m| s.modules[m as usize].path.clone());
                        let symbols = s.symbols.get(l as usize).cloned().unwrap_or_default();
                        (module, loc.offset, symbols)
                    })
                    .collect();
                (id, frames)
            })
            .collect()
    }

    #[test]
    fn placing_in_rounds_gives_the_tables_of_placing_at_the_end() {
        let a = module("/liba.so", 0x7000_0000, (0x7000_0000, 0x7000_2000));
        let b = module("/libb.so", 0x7100_0000, (0x7100_0000, 0x7100_2000));
        let c = module("/libc.so", 0x7200_0000, (0x7200_0000, 0x7200_2000));
        let modules = vec![a.clone(), b, a, c];
        let code = |id: u32, name: &str| PyCode {
            id,
            name: name.to_owned(),
            file: format!("{name}.py"),
        };
        let codes = vec![code(1, "main"), code(2, "load")];
        let def = |id: u32, pcs: Vec<u64>, modules_before: u32| StackDef {
            id,
            end: StackEnd::Complete,
            pcs,
            modules_before,
        };
        let defs = || {
            vec![
                def(1, vec![0x7000_0100, 0x7000_0200], 1),
                // Recorded before libb's frame was read: libb's once it is.
                def(2, vec![0x7100_0010, 0x7000_0100], 1),
                // Its Python code is named in a later round.
                def(3, vec![python_pc(2, 7), 0x7000_0100, python_pc(1, 3)], 2),
                // JIT code, in no module: placed by the last round only.
                def(4, vec![0x9000_0000, 0x7000_0100], 2),
                def(5, vec![0x7200_0040], 4),
                def(6, vec![python_pc(9, 1)], 4),
            ]
        };
        let at_once = from_spool(modules.clone(), defs(), &codes);

        let mut p = Placer::default();
        let mut d = defs().into_iter();
        p.take_modules(&modules[..1]);
        p.take_codes([codes[0].clone()]);
        p.place(d.by_ref().take(3), false);
        // Stack 1 only: 2 waits for libb, 3 for code 2.
        assert_eq!(p.stacks().stacks.keys().collect::<Vec<_>>(), [&1]);
        let first = p.stacks().clone();
        p.take_modules(&modules[..3]);
        p.place(d.by_ref().take(1), false);
        let mut placed: Vec<u32> = p.stacks().stacks.keys().copied().collect();
        placed.sort_unstable();
        assert_eq!(placed, [1, 2]);
        p.take_codes([codes[1].clone()]);
        p.take_modules(&modules);
        p.place(d.by_ref(), false);
        let mut placed: Vec<u32> = p.stacks().stacks.keys().copied().collect();
        placed.sort_unstable();
        assert_eq!(placed, [1, 2, 3, 5], "4 and 6 wait for the end");
        // The tables only grew: what a trace was given stays true.
        let now = p.stacks();
        assert_eq!(now.modules[..first.modules.len()], first.modules[..]);
        assert_eq!(now.locations[..first.locations.len()], first.locations[..]);
        assert_eq!(now.stacks[&1], first.stacks[&1]);
        p.place([], true);
        let in_rounds = p.finish();
        assert_eq!(resolved(&in_rounds), resolved(&at_once));
        assert_eq!(in_rounds.modules, at_once.modules);
        let unnamed = &resolved(&in_rounds)[&6][0].2;
        assert_eq!(unnamed[0].function, "<python code 9>");
    }

    #[test]
    fn only_the_modules_stacks_use_are_named_once_each() {
        let plain = |path: &str, segments: Vec<(u64, u64)>| NativeModule {
            path: path.to_owned(),
            segments,
            ..NativeModule::default()
        };
        let def = |id: u32, pcs: Vec<u64>| StackDef {
            id,
            end: StackEnd::Complete,
            pcs,
            modules_before: u32::MAX,
        };
        let mut modules = vec![
            plain("/a", vec![(0x1000, 0x2000)]),
            plain("/unused", vec![(0x3000, 0x4000)]),
            plain("/c", vec![(0x5000, 0x5800), (0x6000, 0x7000)]),
        ];
        let mut p = Placer::default();
        p.take_modules(&modules);
        p.place([def(1, vec![0x1010, 0x6100]), def(2, vec![0x1020])], false);
        assert_eq!(p.take_newly_used(), [0, 2]);
        // Nothing new: an address between segments (just past the unused module's), one in no
        // module, one of a used module (placed by the last round: it is in no module).
        p.place([def(3, vec![0x4800, 0x9000, 0x1fff])], true);
        assert_eq!(p.take_newly_used(), Vec::<u32>::new());
        // A module read later, used by a later stack.
        modules.push(plain("/d", vec![(0x8000, 0x8800)]));
        p.take_modules(&modules);
        p.place([def(4, vec![0x8100, 0x1010])], false);
        assert_eq!(p.take_newly_used(), [3]);
        assert_eq!(p.take_newly_used(), Vec::<u32>::new());
    }
}
