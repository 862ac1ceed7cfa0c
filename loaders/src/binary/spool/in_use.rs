//! Which modules the stacks of a spool read so far use ([`ModulesInUse`]): what `record`
//! reads for the symbolization while the program still runs. The tracer writes every loaded
//! module it finds (a refresh of its module table lists them all), and most of those no stack
//! may ever use: a program that loads large libraries would otherwise have them all read.

use super::Stream;
use crate::binary::NativeModule;
use crate::binary::stacks::ModuleRanges;

#[derive(Default)]
pub(super) struct ModulesInUse {
    /// Rebuilt when modules come in.
    ranges: ModuleRanges,
    /// Modules `ranges` was built from.
    ranges_of: usize,
    used: Vec<bool>,
    /// Per stream, the stack definitions looked at.
    seen: Vec<usize>,
}

impl ModulesInUse {
    /// The modules (indices into `modules`) that a stack defined since the last call uses
    /// and no earlier one did.
    pub(super) fn take_new(
        &mut self,
        modules: &[NativeModule],
        streams: &[Stream<'_>],
    ) -> Vec<usize> {
        if modules.len() != self.ranges_of {
            self.ranges = ModuleRanges::new(modules);
            self.ranges_of = modules.len();
            self.used.resize(modules.len(), false);
        }
        if self.seen.len() < streams.len() {
            self.seen.resize(streams.len(), 0);
        }
        let mut new = Vec::new();
        for (s, seen) in streams.iter().zip(&mut self.seen) {
            for def in s.defs.get(*seen..).unwrap_or(&[]) {
                for &pc in &def.pcs {
                    let Some(m) = self
                        .ranges
                        .module_of(pc, def.modules_before)
                        .map(|m| m as usize)
                    else {
                        continue;
                    };
                    if let Some(used) = self.used.get_mut(m)
                        && !*used
                    {
                        *used = true;
                        new.push(m);
                    }
                }
            }
            *seen = s.defs.len();
        }
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binary::StackEnd;
    use crate::binary::stacks::StackDef;

    fn stream(defs: Vec<Vec<u64>>) -> Stream<'static> {
        let mut s = Stream::new(0, 1);
        s.defs = defs
            .into_iter()
            .zip(1..)
            .map(|(pcs, id)| StackDef {
                id,
                end: StackEnd::Complete,
                pcs,
                modules_before: u32::MAX,
            })
            .collect();
        s
    }

    fn module(path: &str, segments: Vec<(u64, u64)>) -> NativeModule {
        NativeModule {
            path: path.to_owned(),
            segments,
            ..NativeModule::default()
        }
    }

    #[test]
    fn only_the_modules_stacks_use_are_named_once_each() {
        let mut modules = vec![
            module("/a", vec![(0x1000, 0x2000)]),
            module("/unused", vec![(0x3000, 0x4000)]),
            module("/c", vec![(0x5000, 0x5800), (0x6000, 0x7000)]),
        ];
        let mut in_use = ModulesInUse::default();
        let mut streams = vec![stream(vec![vec![0x1010, 0x6100], vec![0x1020]])];
        assert_eq!(in_use.take_new(&modules, &streams), vec![0, 2]);
        // Nothing new: an address between segments (just past the unused module's), one in no
        // module, one of a used module.
        streams[0]
            .defs
            .extend(stream(vec![vec![0x4800, 0x9000, 0x1fff]]).defs);
        assert_eq!(in_use.take_new(&modules, &streams), Vec::<usize>::new());
        // A module read later, used by a stack of a new stream.
        modules.push(module("/d", vec![(0x8000, 0x8800)]));
        streams.push(stream(vec![vec![0x8100, 0x1010]]));
        assert_eq!(in_use.take_new(&modules, &streams), vec![3]);
        assert_eq!(in_use.take_new(&modules, &streams), Vec::<usize>::new());
    }
}
