//! `glibc` against a naive reference written from the model's documented rules (the module
//! header of `policy/glibc/mod.rs`): the heap is a vector of chunks in address order, the top is
//! whatever the sbrk'd bytes hold past the last chunk, the bins are vectors of addresses, and
//! every search is a scan. Nothing is shared with the model's linked chunk handles, size-keyed
//! free set or bin masks.

use allocview_sim::policy::config::PolicyConfig;
use allocview_sim::testing::{Op, ops_to_trace};
use proptest::prelude::*;

use super::{NaiveHeap, lockstep};

const MIN_CHUNK: u64 = 32;
const PAGE: u64 = 4096;
const TOP_PAD: u64 = 128 << 10;
const DEFAULT_TRIM_THRESHOLD: u64 = 128 << 10;
const MMAP_THRESHOLD_MAX: u64 = 32 << 20;
const MMAP_BASE: u64 = 1 << 44;
const MAX_REQUEST: u64 = 1 << 48;
const TCACHE_COUNT: usize = 7;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Used,
    Tcache,
    Fast,
    Free,
    Meta,
}

#[derive(Clone, Copy, Debug)]
struct Chunk {
    addr: u64,
    size: u64,
    kind: Kind,
}

#[derive(Clone, Debug)]
pub struct GlibcReference {
    limit: Option<u64>,
    mmap_threshold: u64,
    trim_threshold: u64,
    /// Chunks tiling `[0, top start)`, lowest first.
    heap: Vec<Chunk>,
    heap_bytes: u64,
    /// 64 tcache bins and 7 fastbins of chunk addresses, most recent last.
    tcache: Vec<Vec<u64>>,
    fast: Vec<Vec<u64>>,
    /// Mappings (address, bytes), lowest first.
    mapped: Vec<(u64, u64)>,
    set_up: bool,
}

fn chunk_of(req: u64) -> u64 {
    ((req + 8).div_ceil(16) * 16).max(MIN_CHUNK)
}

fn round_to_page(n: u64) -> u64 {
    n.div_ceil(PAGE) * PAGE
}

fn tcache_bin(size: u64) -> Option<usize> {
    let i = ((size - MIN_CHUNK) / 16) as usize;
    (i < 64).then_some(i)
}

fn fast_bin(size: u64) -> Option<usize> {
    (size <= 128).then_some(((size - MIN_CHUNK) / 16) as usize)
}

impl GlibcReference {
    pub fn new(limit: Option<u64>, mmap_threshold: u64) -> Self {
        Self {
            limit,
            mmap_threshold,
            trim_threshold: DEFAULT_TRIM_THRESHOLD,
            heap: Vec::new(),
            heap_bytes: 0,
            tcache: vec![Vec::new(); 64],
            fast: vec![Vec::new(); 7],
            mapped: Vec::new(),
            set_up: false,
        }
    }

    fn top_start(&self) -> u64 {
        self.heap.last().map_or(0, |c| c.addr + c.size)
    }

    fn top(&self) -> u64 {
        self.heap_bytes - self.top_start()
    }

    fn total(&self) -> u64 {
        self.heap_bytes + self.mapped.iter().map(|m| m.1).sum::<u64>()
    }

    fn fits_limit(&self, extra: u64) -> bool {
        self.limit.is_none_or(|l| self.total() + extra <= l)
    }

    fn index_of(&self, addr: u64) -> usize {
        self.heap.iter().position(|c| c.addr == addr).unwrap()
    }

    fn set_kind(&mut self, addr: u64, kind: Kind) {
        let i = self.index_of(addr);
        self.heap[i].kind = kind;
    }

    fn malloc(&mut self, req: u64) -> Option<u64> {
        if self.set_up {
            return self.malloc_set_up(req);
        }
        // The tcache struct comes with the first malloc that succeeds.
        let before = self.clone();
        let got = self.malloc_set_up(req);
        if got.is_none() {
            *self = before;
        }
        got
    }

    fn malloc_set_up(&mut self, req: u64) -> Option<u64> {
        if req > MAX_REQUEST {
            return None;
        }
        let nb = chunk_of(req);
        if !self.set_up {
            self.set_up = true;
            let meta = self.int_malloc(chunk_of(640), false)?;
            self.set_kind(meta, Kind::Meta);
        }
        if let Some(i) = tcache_bin(nb)
            && let Some(addr) = self.tcache[i].pop()
        {
            self.set_kind(addr, Kind::Used);
            return Some(addr);
        }
        let addr = self.int_malloc(nb, true)?;
        if addr < MMAP_BASE {
            self.set_kind(addr, Kind::Used);
        }
        Some(addr)
    }

    fn int_malloc(&mut self, nb: u64, may_map: bool) -> Option<u64> {
        if let Some(f) = fast_bin(nb)
            && let Some(addr) = self.fast[f].pop()
        {
            // The bin's other chunks move to the tcache while it has room.
            let t = tcache_bin(nb).unwrap();
            while self.tcache[t].len() < TCACHE_COUNT {
                let Some(next) = self.fast[f].pop() else {
                    break;
                };
                self.tcache[t].push(next);
                self.set_kind(next, Kind::Tcache);
            }
            return Some(addr);
        }
        if nb >= 1024 {
            self.consolidate();
        }
        loop {
            let best = (0..self.heap.len())
                .filter(|&i| self.heap[i].kind == Kind::Free && self.heap[i].size >= nb)
                .min_by_key(|&i| (self.heap[i].size, self.heap[i].addr));
            if let Some(i) = best {
                let c = self.heap[i];
                if c.size - nb >= MIN_CHUNK {
                    self.heap[i].size = nb;
                    let rest = Chunk {
                        addr: c.addr + nb,
                        size: c.size - nb,
                        kind: Kind::Free,
                    };
                    self.heap.insert(i + 1, rest);
                }
                self.heap[i].kind = Kind::Used;
                return Some(c.addr);
            }
            if self.top() >= nb + MIN_CHUNK {
                return Some(self.take_top(nb));
            }
            if self.fast.iter().all(Vec::is_empty) {
                break;
            }
            self.consolidate();
        }
        if may_map && nb >= self.mmap_threshold && self.mapped.len() < 65536 {
            let size = round_to_page(nb + 8);
            if self.fits_limit(size) {
                let mut addr = MMAP_BASE;
                for &(a, s) in &self.mapped {
                    if a >= addr + size {
                        break;
                    }
                    addr = addr.max(a + s);
                }
                self.mapped.push((addr, size));
                self.mapped.sort_unstable();
                return Some(addr);
            }
        }
        let grow = round_to_page((nb + TOP_PAD + MIN_CHUNK).saturating_sub(self.top()));
        if !self.fits_limit(grow) {
            return None;
        }
        self.heap_bytes += grow;
        Some(self.take_top(nb))
    }

    fn take_top(&mut self, nb: u64) -> u64 {
        let addr = self.top_start();
        self.heap.push(Chunk {
            addr,
            size: nb,
            kind: Kind::Used,
        });
        addr
    }

    fn consolidate(&mut self) {
        for f in 0..self.fast.len() {
            while let Some(addr) = self.fast[f].pop() {
                self.release(addr);
            }
        }
    }

    /// Frees the chunk at `addr` into the heap, merged with free neighbours and the top:
    /// the size of what it became part of.
    fn release(&mut self, addr: u64) -> u64 {
        let mut i = self.index_of(addr);
        self.heap[i].kind = Kind::Free;
        if i > 0 && self.heap[i - 1].kind == Kind::Free {
            self.heap[i - 1].size += self.heap[i].size;
            self.heap.remove(i);
            i -= 1;
        }
        if i + 1 == self.heap.len() {
            self.heap.pop();
            return self.top();
        }
        if self.heap[i + 1].kind == Kind::Free {
            self.heap[i].size += self.heap[i + 1].size;
            self.heap.remove(i + 1);
        }
        self.heap[i].size
    }

    fn free(&mut self, addr: u64) {
        if let Some(m) = self.mapped.iter().position(|&(a, _)| a == addr) {
            let (_, size) = self.mapped.remove(m);
            if size > self.mmap_threshold && size <= MMAP_THRESHOLD_MAX {
                self.mmap_threshold = size;
                self.trim_threshold = 2 * size;
            }
            return;
        }
        let size = self.heap[self.index_of(addr)].size;
        if let Some(t) = tcache_bin(size)
            && self.tcache[t].len() < TCACHE_COUNT
        {
            self.tcache[t].push(addr);
            self.set_kind(addr, Kind::Tcache);
            return;
        }
        if let Some(f) = fast_bin(size) {
            self.fast[f].push(addr);
            self.set_kind(addr, Kind::Fast);
            return;
        }
        if self.release(addr) >= 64 << 10 {
            self.consolidate();
            if self.top() >= self.trim_threshold {
                let area = self.top().saturating_sub(MIN_CHUNK + 1);
                if area > TOP_PAD {
                    self.heap_bytes -= (area - TOP_PAD) / PAGE * PAGE;
                }
            }
        }
    }
}

impl NaiveHeap for GlibcReference {
    fn alloc(&mut self, _id: u32, size_bytes: u64) -> Option<u64> {
        self.malloc(size_bytes)
    }
    fn free(&mut self, addr: u64) {
        GlibcReference::free(self, addr);
    }
    fn footprint(&self) -> u64 {
        self.total()
    }
}

fn compare_glibc(ops: &[Op], limit: Option<u64>, mmap_threshold: u64) -> Result<(), TestCaseError> {
    let trace = ops_to_trace(ops);
    let view = trace.view().unwrap();
    let config = PolicyConfig {
        limit_bytes: limit,
        glibc_mmap_threshold_bytes: mmap_threshold,
        ..PolicyConfig::default()
    };
    let mut reference = GlibcReference::new(limit, mmap_threshold);
    lockstep("glibc", &config, &view, &mut reference)
}

fn glibc_ops() -> impl Strategy<Value = Vec<Op>> {
    let size = prop_oneof![
        // A few size classes, so tcache bins fill, frees spill into the fastbins and a fastbin
        // hit stashes the rest of its bin in the tcache.
        4 => prop::sample::select(vec![0u64, 8, 24, 40, 56, 100, 120, 200]),
        3 => 0u64..=2048,
        // Chunks of exactly 32 and 64 KiB: merged frees at the consolidation threshold.
        1 => prop::sample::select(vec![32_744u64, 32_760, 65_512, 65_520]),
        2 => 2049u64..=(96 << 10),
        1 => (96u64 << 10)..=(1 << 20),
        // Mappings past the 32 MiB cap of the dynamic threshold.
        1 => (31u64 << 20)..=(40 << 20),
    ];
    // Runs of one size and runs of frees: what fills a bin past the tcache's seven.
    let run = prop_oneof![
        3 => (size, 1usize..=12).prop_map(|(size_bytes, n)| vec![Op::Alloc { size_bytes }; n]),
        3 => prop::collection::vec(any::<usize>(), 1..=12)
            .prop_map(|v| v.into_iter().map(|victim| Op::Free { victim }).collect()),
    ];
    prop::collection::vec(run, 1..60).prop_map(|runs| runs.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn glibc_matches_its_reference(
        ops in glibc_ops(),
        limit_kib in prop::option::of(4u64..=(64 << 10)),
        mmap_threshold in prop::sample::select(vec![4u64 << 10, 32 << 10, 128 << 10]),
    ) {
        compare_glibc(&ops, limit_kib.map(|k| k << 10), mmap_threshold)?;
    }
}
