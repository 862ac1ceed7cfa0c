//! One heaptrack line at a time: the mode letter, its hexadecimal fields, and what each line
//! adds to the recording (the tables of [`Symbols`], the allocations and frees, the time and
//! the resident memory).

use crate::binary::MemorySample;
use crate::events::Record;
use crate::foreign::ForeignEvents;
use crate::malloc_trace::shorten;

use super::symbols::Symbols;

/// What is wrong with a line: where (1-based byte column), in which field, what was expected.
#[derive(Debug)]
pub(super) struct Fault {
    pub column: usize,
    pub field: &'static str,
    pub expected: &'static str,
    pub found: String,
}

/// The space-separated fields of a line after its mode letter.
pub(super) struct Fields<'a> {
    line: &'a [u8],
    /// Byte offset of the next field.
    at: usize,
}

impl<'a> Fields<'a> {
    pub fn new(line: &'a [u8], at: usize) -> Self {
        let mut f = Self { line, at };
        f.skip_spaces();
        f
    }

    fn skip_spaces(&mut self) {
        while self.line.get(self.at) == Some(&b' ') {
            self.at += 1;
        }
    }

    pub fn is_empty(&self) -> bool {
        self.at >= self.line.len()
    }

    /// The rest of the line, as it is.
    pub fn rest(&self) -> &'a [u8] {
        self.line.get(self.at..).unwrap_or(&[])
    }

    fn fault(&self, field: &'static str, expected: &'static str, token: &[u8]) -> Fault {
        Fault {
            column: self.at + 1,
            field,
            expected,
            found: shorten(token),
        }
    }

    /// The next field as a hexadecimal number (heaptrack writes every number in hex).
    pub fn hex(&mut self, field: &'static str) -> Result<u64, Fault> {
        const EXPECTED: &str = "a hexadecimal number";
        let rest = self.rest();
        let len = rest.iter().position(|&c| c == b' ').unwrap_or(rest.len());
        let token = rest.get(..len).unwrap_or(&[]);
        if token.is_empty() || token.len() > 16 {
            return Err(self.fault(field, EXPECTED, token));
        }
        let mut value = 0u64;
        for &c in token {
            let digit = match c {
                b'0'..=b'9' => c - b'0',
                b'a'..=b'f' => c - b'a' + 10,
                b'A'..=b'F' => c - b'A' + 10,
                _ => return Err(self.fault(field, EXPECTED, token)),
            };
            value = (value << 4) | u64::from(digit);
        }
        self.at += len;
        self.skip_spaces();
        Ok(value)
    }

    /// The next field as an index of at most `max` (1-based tables: 0 is "none").
    pub fn index(
        &mut self,
        field: &'static str,
        max: usize,
        expected: &'static str,
    ) -> Result<u32, Fault> {
        let at = self.at;
        let value = self.hex(field)?;
        match u32::try_from(value) {
            Ok(v) if (v as usize) <= max => Ok(v),
            _ => {
                self.at = at;
                let token = self.rest().split(|&c| c == b' ').next().unwrap_or(&[]);
                Err(self.fault(field, expected, token))
            }
        }
    }

    /// Fails when fields are left over.
    pub fn end(&self, expected: &'static str) -> Result<(), Fault> {
        if self.is_empty() {
            Ok(())
        } else {
            Err(self.fault("end of line", expected, self.rest()))
        }
    }
}

/// The first address handed to an allocation of a file whose frees name no address.
const SYNTHETIC_BASE: u64 = 0x1000_0000;
/// The step between synthetic addresses (a malloc alignment, so nothing reads them as odd).
const SYNTHETIC_STEP: u64 = 16;

/// heaptrack's page size when the file has no `I` line.
const DEFAULT_PAGE_BYTES: u64 = 4096;

/// The state of a file read so far.
pub(super) struct Reader {
    /// heaptrack's version (`0x10400`: 1.4.0) and the file format's, from the `v` line (0 for
    /// files older than it).
    pub heaptrack_version: u64,
    pub file_version: u64,
    saw_version: bool,
    page_bytes: u64,
    t_ns: i64,
    pub symbols: Symbols,
    /// `a` lines: (size in bytes, trace node), indexed by `+` and `-` (format 1 on).
    infos: Vec<(u64, u32)>,
    /// The stack of each allocation info, once built (`None` inside: no stack).
    info_stacks: Vec<Option<Option<u32>>>,
    /// The synthetic addresses of the live allocations of each info, the latest last.
    live: Vec<Vec<u64>>,
    next_addr: u64,
    pub records: Vec<Record>,
    pub memory: Vec<MemorySample>,
    /// An `A` line: heaptrack attached to a running process.
    pub attached: bool,
    /// `S` lines: leak suppressions embedded in the file.
    pub suppressions: u64,
    /// Frees of an info with no live allocation left.
    pub unmatched_frees: u64,
}

impl Default for Reader {
    fn default() -> Self {
        Self {
            heaptrack_version: 0,
            file_version: 0,
            saw_version: false,
            page_bytes: DEFAULT_PAGE_BYTES,
            t_ns: 0,
            symbols: Symbols::default(),
            infos: Vec::new(),
            info_stacks: Vec::new(),
            live: Vec::new(),
            next_addr: SYNTHETIC_BASE,
            records: Vec::new(),
            memory: Vec::new(),
            attached: false,
            suppressions: 0,
            unmatched_frees: 0,
        }
    }
}

/// What a raw stream says when read as a data file.
pub(super) const RAW_STREAM: &str = "a line of heaptrack's data file (this is heaptrack's RAW \
     stream, with `m` module and `x` string lines: what heaptrack_interpret reads, not a data \
     file; interpret it first: `/usr/lib/heaptrack/libexec/heaptrack_interpret < FILE | gzip > \
     heaptrack.NAME.gz`)";

impl Reader {
    /// Reads one line (without its newline).
    pub fn line(&mut self, line: &[u8]) -> Result<(), Fault> {
        let Some(&mode) = line.first() else {
            return Ok(());
        };
        if mode == b'#' {
            return Ok(());
        }
        let mut fields = Fields::new(line, 1);
        if line.get(1).is_some_and(|&c| c != b' ') {
            return Err(Fault {
                column: 1,
                field: "mode",
                expected: "a mode letter and a space",
                found: shorten(line),
            });
        }
        match mode {
            b'v' if !self.saw_version && self.records.is_empty() => self.version(&mut fields),
            b'X' | b'S' => {
                self.suppressions += u64::from(mode == b'S');
                Ok(())
            }
            b'I' => {
                let page_bytes = fields.hex("page size")?;
                fields.hex("physical pages")?;
                fields.end("the end of an `I` line")?;
                if page_bytes > 0 {
                    self.page_bytes = page_bytes;
                }
                Ok(())
            }
            b's' => self.string(&mut fields),
            b'i' => {
                self.symbols.add_ip(&mut fields)?;
                fields.end("another frame of three fields")
            }
            b't' => {
                self.symbols.add_trace(&mut fields)?;
                fields.end("the end of a `t` line")
            }
            b'a' => {
                let size_bytes = fields.hex("size")?;
                let max = self.symbols.num_traces();
                let trace = fields.index("trace", max, "a trace already defined by a `t` line")?;
                fields.end("the end of an `a` line")?;
                self.infos.push((size_bytes, trace));
                self.info_stacks.push(None);
                self.live.push(Vec::new());
                Ok(())
            }
            b'+' if self.file_version >= 1 => self.alloc(&mut fields),
            b'-' if self.file_version >= 1 => self.free(&mut fields),
            b'+' => self.alloc_v0(&mut fields),
            b'-' => {
                let addr = fields.hex("pointer")?;
                fields.end("the end of a `-` line")?;
                self.push(None, addr, None);
                Ok(())
            }
            b'c' => {
                let t_ms = fields.hex("timestamp")?;
                fields.end("the end of a `c` line")?;
                self.t_ns = i64::try_from(t_ms.saturating_mul(1_000_000)).unwrap_or(i64::MAX);
                Ok(())
            }
            b'R' => {
                let pages = fields.hex("resident pages")?;
                fields.end("the end of an `R` line")?;
                let resident_bytes = pages.saturating_mul(self.page_bytes);
                // heaptrack samples the whole resident set only; it stands for the anonymous
                // part too (the docs say so).
                self.memory.push(MemorySample {
                    t_ns: self.t_ns,
                    resident_bytes,
                    anon_bytes: resident_bytes,
                });
                Ok(())
            }
            b'A' => {
                self.attached = true;
                Ok(())
            }
            b'm' | b'x' => Err(Fault {
                column: 1,
                field: "mode",
                expected: RAW_STREAM,
                found: shorten(line),
            }),
            _ => Err(Fault {
                column: 1,
                field: "mode",
                expected: "a heaptrack mode letter (v X I S s i t a + - c R A #)",
                found: shorten(line),
            }),
        }
    }

    fn version(&mut self, fields: &mut Fields<'_>) -> Result<(), Fault> {
        self.heaptrack_version = fields.hex("heaptrack version")?;
        self.file_version = if fields.is_empty() {
            0
        } else {
            fields.hex("file version")?
        };
        fields.end("the end of a `v` line")?;
        self.saw_version = true;
        Ok(())
    }

    /// `s <string>`, or from format 3 on `s <length> <string>`.
    fn string(&mut self, fields: &mut Fields<'_>) -> Result<(), Fault> {
        if self.file_version >= 3 {
            let len = fields.hex("string length")?;
            let rest = fields.rest();
            if usize::try_from(len).ok() != Some(rest.len()) {
                return Err(Fault {
                    column: 1,
                    field: "string",
                    expected: "a string of the length its line gives",
                    found: shorten(rest),
                });
            }
        }
        let s = String::from_utf8_lossy(fields.rest()).into_owned();
        self.symbols.add_string(s);
        Ok(())
    }

    fn info_index(&self, fields: &mut Fields<'_>) -> Result<usize, Fault> {
        let at = fields.rest();
        let index = fields.hex("allocation info")?;
        match usize::try_from(index) {
            Ok(i) if i < self.infos.len() => Ok(i),
            _ => Err(Fault {
                column: 3,
                field: "allocation info",
                expected: "an allocation info already defined by an `a` line",
                found: shorten(at),
            }),
        }
    }

    /// `+ <info>`: a new allocation of the info's size and stack, at a synthetic address.
    fn alloc(&mut self, fields: &mut Fields<'_>) -> Result<(), Fault> {
        let i = self.info_index(fields)?;
        fields.end("the end of a `+` line")?;
        let (size_bytes, trace) = self.infos.get(i).copied().unwrap_or((0, 0));
        let stack = match self.info_stacks.get(i).copied().flatten() {
            Some(stack) => stack,
            None => {
                let stack = self.symbols.stack_of(trace);
                if let Some(slot) = self.info_stacks.get_mut(i) {
                    *slot = Some(stack);
                }
                stack
            }
        };
        let addr = self.fresh_address();
        if let Some(live) = self.live.get_mut(i) {
            live.push(addr);
        }
        self.push(Some(size_bytes), addr, stack);
        Ok(())
    }

    /// `- <info>`: ends the info's latest live allocation (LIFO: see the module docs).
    fn free(&mut self, fields: &mut Fields<'_>) -> Result<(), Fault> {
        let i = self.info_index(fields)?;
        fields.end("the end of a `-` line")?;
        let addr = match self.live.get_mut(i).and_then(Vec::pop) {
            Some(addr) => addr,
            None => {
                // An address no allocation had: the event table counts it as unknown.
                self.unmatched_frees += 1;
                self.fresh_address()
            }
        };
        self.push(None, addr, None);
        Ok(())
    }

    /// Format 0: `+ <size> <trace> <pointer>`.
    fn alloc_v0(&mut self, fields: &mut Fields<'_>) -> Result<(), Fault> {
        let size_bytes = fields.hex("size")?;
        let max = self.symbols.num_traces();
        let trace = fields.index("trace", max, "a trace already defined by a `t` line")?;
        let addr = fields.hex("pointer")?;
        fields.end("the end of a `+` line")?;
        let stack = self.symbols.stack_of(trace);
        self.push(Some(size_bytes), addr, stack);
        Ok(())
    }

    fn fresh_address(&mut self) -> u64 {
        let addr = self.next_addr;
        self.next_addr = self.next_addr.saturating_add(SYNTHETIC_STEP);
        addr
    }

    fn push(&mut self, size_bytes: Option<u64>, addr: u64, stack: Option<u32>) {
        self.records.push(Record {
            t_ns: self.t_ns,
            tid: 0,
            size_bytes,
            addr,
            call: None,
            stack,
            heap: 0,
        });
    }

    /// The events and what must be said of them.
    pub fn into_events(self, notes: Vec<String>) -> ForeignEvents {
        ForeignEvents {
            records: self.records,
            stacks: self.symbols.stacks,
            memory: self.memory,
            // heaptrack's `R` lines are the process's whole resident set, nothing more.
            memory_series: crate::events::RecordedSeries::ResidentOnly,
            notes,
        }
    }
}
