//! Writing a trace (kind 0): [`BinaryWriter`].

use std::io::{self, Write};

use super::codec::{put_varint, zigzag};
use super::frames::write_frame;
use super::index::{BlockEntry, BlockIndex};
use super::stacks::{self, NativeStacks};
use super::{
    BLOCK_EVENTS, CODEC_STORED, CODEC_ZSTD, FRAME_END, FRAME_EVENTS, FRAME_INDEX, FRAME_META,
    FRAME_THREADS, KIND_TRACE, MAGIC, OP_CALL_MASK, OP_FREE, OP_HEAP, OP_NO_CALL, OP_STACK,
    OP_THREAD, VERSION, ZSTD_LEVEL,
};
use crate::events::{MAX_THREADS, PtrMap, Record};

/// Writes records as a binary trace (kind 0): blocks of [`BLOCK_EVENTS`] events, zstd each.
pub struct BinaryWriter<W: Write> {
    out: W,
    threads: PtrMap<u64>,
    /// The last record's thread id and index: most records follow one of their own thread.
    prev_tid: u64,
    prev_thread_index: u64,
    new_threads: Vec<u64>,
    block: Vec<u8>,
    block_events: u32,
    prev_t: i64,
    prev_addr: u64,
    prev_thread: u64,
    total: u64,
    compressor: zstd::bulk::Compressor<'static>,
    packed: Vec<u8>,
    /// Bytes written so far: the offset of the next frame.
    written: u64,
    /// The block index written before END (see `index.rs`).
    index: BlockIndex,
    block_first_t: i64,
    block_max_t: i64,
    /// The heaps other than malloc's that the records used (at most [`super::heaps::MAX_HEAPS`]).
    heaps_used: std::collections::BTreeSet<u32>,
    /// The heap names written so far (HEAPS frames).
    heaps_named: Vec<super::HeapName>,
}

impl<W: Write> BinaryWriter<W> {
    /// Writes the header and a META frame of `meta` (keys and values without `=`/newlines in
    /// keys, without newlines in values).
    ///
    /// # Errors
    /// On write errors.
    pub fn new(mut out: W, meta: &[(String, String)]) -> io::Result<Self> {
        out.write_all(&MAGIC)?;
        out.write_all(&[VERSION, KIND_TRACE])?;
        let mut text = String::new();
        for (k, v) in meta {
            let v = v.replace('\n', " ");
            text.push_str(&format!("{k}={v}\n"));
        }
        write_frame(&mut out, FRAME_META, &[text.as_bytes()])?;
        let written = (MAGIC.len() + 2 + 5 + text.len()) as u64;
        let mut compressor = zstd::bulk::Compressor::new(ZSTD_LEVEL)?;
        // A checksum per block (4 bytes): damage inside a block is found when it is read,
        // rather than decoding into wrong events.
        compressor.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))?;
        Ok(Self {
            out,
            threads: PtrMap::default(),
            prev_tid: 0,
            prev_thread_index: 0,
            new_threads: Vec::new(),
            block: Vec::with_capacity(1 << 20),
            block_events: 0,
            prev_t: 0,
            prev_addr: 0,
            prev_thread: 0,
            total: 0,
            compressor,
            packed: Vec::new(),
            written,
            index: BlockIndex::default(),
            block_first_t: 0,
            block_max_t: 0,
            heaps_used: std::collections::BTreeSet::new(),
            heaps_named: Vec::new(),
        })
    }

    /// Appends one record.
    ///
    /// # Errors
    /// On write errors, and for a record whose thread would be one more than [`MAX_THREADS`]
    /// (nothing of it is written: the loader could not load it).
    pub fn push(&mut self, r: &Record) -> io::Result<()> {
        if r.tid == self.prev_tid && self.total > 0 {
            return self.push_in(r, self.prev_thread_index);
        }
        let next_index = self.threads.len() as u64;
        if next_index >= MAX_THREADS as u64 && !self.threads.contains_key(&r.tid) {
            // The loader holds thread indices in 16 bits: a file with more threads would be
            // written only to be refused when read.
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "thread {} of record {} would be the trace's {}th thread; allocview loads \
                     at most {MAX_THREADS} threads, so the binary form refuses more",
                    r.tid,
                    self.total,
                    MAX_THREADS + 1
                ),
            ));
        }
        let thread = *self.threads.entry(r.tid).or_insert_with(|| {
            self.new_threads.push(r.tid);
            next_index
        });
        self.prev_tid = r.tid;
        self.prev_thread_index = thread;
        self.push_in(r, thread)
    }

    /// Appends one record of thread index `thread`.
    fn push_in(&mut self, r: &Record, thread: u64) -> io::Result<()> {
        let mut op = r.call.map_or(OP_NO_CALL, |c| c & OP_CALL_MASK);
        if r.size_bytes.is_none() {
            op |= OP_FREE;
        }
        if thread != self.prev_thread {
            op |= OP_THREAD;
        }
        if r.stack.is_some() {
            op |= OP_STACK;
        }
        if r.heap != 0 {
            op |= OP_HEAP;
            if !self.heaps_used.contains(&r.heap) {
                if self.heaps_used.len() >= super::heaps::MAX_HEAPS {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "a trace holds at most {} heaps besides malloc's; heap {} would be one more",
                            super::heaps::MAX_HEAPS,
                            r.heap
                        ),
                    ));
                }
                self.heaps_used.insert(r.heap);
            }
        }
        if self.block_events == 0 {
            self.block_first_t = r.t_ns;
            self.block_max_t = r.t_ns;
        }
        self.block_max_t = self.block_max_t.max(r.t_ns);
        self.block.push(op);
        if thread != self.prev_thread {
            put_varint(&mut self.block, thread);
            self.prev_thread = thread;
        }
        put_varint(&mut self.block, zigzag(r.t_ns.wrapping_sub(self.prev_t)));
        self.prev_t = r.t_ns;
        if let Some(size) = r.size_bytes {
            put_varint(&mut self.block, size);
        }
        put_varint(
            &mut self.block,
            zigzag(r.addr.wrapping_sub(self.prev_addr) as i64),
        );
        self.prev_addr = r.addr;
        if let Some(id) = r.stack {
            put_varint(&mut self.block, u64::from(id));
        }
        if r.heap != 0 {
            put_varint(&mut self.block, u64::from(r.heap));
        }
        self.block_events += 1;
        self.total += 1;
        if self.block_events >= BLOCK_EVENTS {
            self.flush_block()?;
        }
        Ok(())
    }

    /// Writes a frame, counting its bytes.
    fn frame(&mut self, tag: u8, parts: &[&[u8]]) -> io::Result<()> {
        write_frame(&mut self.out, tag, parts)?;
        self.written += 5 + parts.iter().map(|p| p.len() as u64).sum::<u64>();
        Ok(())
    }

    /// Ends the block in progress and flushes everything to `out`: a reader of the file while
    /// it is written (`allocview FILE --follow`) finds the records pushed so far, in a file
    /// that is cut short (no index, no END) but otherwise whole. The next record starts a new
    /// block.
    ///
    /// # Errors
    /// On write errors.
    pub fn flush(&mut self) -> io::Result<()> {
        self.flush_block()?;
        self.out.flush()
    }

    fn flush_block(&mut self) -> io::Result<()> {
        if !self.new_threads.is_empty() {
            let mut t = Vec::new();
            put_varint(&mut t, self.new_threads.len() as u64);
            for &tid in &self.new_threads {
                put_varint(&mut t, tid);
            }
            self.frame(FRAME_THREADS, &[&t])?;
            self.index.threads.append(&mut self.new_threads);
        }
        if self.block_events == 0 {
            return Ok(());
        }
        let bound = zstd::zstd_safe::compress_bound(self.block.len());
        self.packed.clear();
        self.packed.reserve(bound);
        self.compressor
            .compress_to_buffer(&self.block, &mut self.packed)?;
        let (codec, data) = if self.packed.len() < self.block.len() {
            (CODEC_ZSTD, &self.packed)
        } else {
            (CODEC_STORED, &self.block)
        };
        let mut head = vec![codec];
        put_varint(&mut head, u64::from(self.block_events));
        put_varint(&mut head, self.block.len() as u64);
        self.index.blocks.push(BlockEntry {
            offset: self.written,
            first_record: self.total - u64::from(self.block_events),
            records: u64::from(self.block_events),
            first_t_ns: self.block_first_t,
            max_t_ns: self.block_max_t,
        });
        let len = (head.len() + data.len()) as u64;
        write_frame(&mut self.out, FRAME_EVENTS, &[&head, data])?;
        self.written += 5 + len;
        self.block.clear();
        self.block_events = 0;
        self.prev_t = 0;
        self.prev_addr = 0;
        self.prev_thread = 0;
        Ok(())
    }

    /// Writes the call-stack tables (after the events pushed so far: call it once, just
    /// before [`Self::finish`]); records' stack ids refer to them.
    ///
    /// # Errors
    /// On write errors.
    pub fn write_stacks(&mut self, s: &NativeStacks) -> io::Result<()> {
        self.flush_block()?;
        for (tag, payload) in stacks::encode_frames(s) {
            self.frame(tag, &[&payload])?;
        }
        Ok(())
    }

    /// Writes what the call-stack tables `s` hold beyond what `written` says this trace was
    /// given, and `symbols` (source frames by location index, for locations `s` has none for):
    /// the tables of a recording in progress, as they grow (see [`super::StacksWritten`]).
    /// Ends the current block, so that the stacks follow the events that use them.
    ///
    /// # Errors
    /// On write errors.
    pub fn append_stacks(
        &mut self,
        s: &NativeStacks,
        symbols: &[(usize, Vec<super::SourceFrame>)],
        written: &mut super::StacksWritten,
    ) -> io::Result<()> {
        self.flush_block()?;
        for (tag, payload) in stacks::encode_appended(s, symbols, written) {
            self.frame(tag, &[&payload])?;
        }
        Ok(())
    }

    /// Writes the recorded program's memory samples (a MEMORY frame, [`super::memory`]),
    /// after the events written so far; nothing when there are none.
    ///
    /// # Errors
    /// On write errors.
    pub fn write_memory(&mut self, samples: &[super::MemorySample]) -> io::Result<()> {
        if samples.is_empty() {
            return Ok(());
        }
        self.flush_block()?;
        self.frame(
            super::memory::FRAME_MEMORY,
            &[&super::memory::encode_frame(samples)],
        )
    }

    /// Writes the recorded program's mapping calls (a MAPPINGS frame, [`super::memory`]);
    /// nothing when there are none.
    ///
    /// # Errors
    /// On write errors.
    pub fn write_mappings(&mut self, calls: &[super::Mapping]) -> io::Result<()> {
        if calls.is_empty() {
            return Ok(());
        }
        self.flush_block()?;
        self.frame(
            super::memory::FRAME_MAPPINGS,
            &[&super::memory::encode_mappings(calls)],
        )
    }

    /// Writes the run's marks (a MARKS frame, [`super::marks`]); nothing when there are none.
    ///
    /// # Errors
    /// On write errors.
    pub fn write_marks(&mut self, marks: &[super::Mark]) -> io::Result<()> {
        if marks.is_empty() {
            return Ok(());
        }
        self.flush_block()?;
        self.frame(
            super::marks::FRAME_MARKS,
            &[&super::marks::encode_frame(marks)],
        )
    }

    /// Names the program's own heaps (a HEAPS frame, see `heaps.rs`): the entries of `names`
    /// not written yet with that name. Nothing when there are none. [`Self::finish`] names
    /// the heaps the records used and no call named `heap-N`.
    ///
    /// # Errors
    /// On write errors.
    pub fn write_heap_names(&mut self, names: &[super::HeapName]) -> io::Result<()> {
        let new: Vec<super::HeapName> = names
            .iter()
            .filter(|h| h.id != 0 && !self.heaps_named.contains(h))
            .cloned()
            .collect();
        if new.is_empty() {
            return Ok(());
        }
        self.flush_block()?;
        self.frame(
            super::heaps::FRAME_HEAPS,
            &[&super::heaps::encode_names(&new)],
        )?;
        for h in new {
            super::heaps::set_name(&mut self.heaps_named, h.id, h.name);
        }
        Ok(())
    }

    /// Writes the last block and the END frame, and returns the output.
    ///
    /// # Errors
    /// On write errors.
    pub fn finish(mut self) -> io::Result<W> {
        self.flush_block()?;
        let named: std::collections::HashSet<u32> = self.heaps_named.iter().map(|h| h.id).collect();
        let unnamed: Vec<super::HeapName> = self
            .heaps_used
            .iter()
            .filter(|&&id| !named.contains(&id))
            .map(|&id| super::HeapName {
                id,
                name: format!("heap-{id}"),
            })
            .collect();
        self.write_heap_names(&unnamed)?;
        let index = self.index.encode(self.written);
        self.frame(FRAME_INDEX, &[&index])?;
        let mut end = Vec::new();
        put_varint(&mut end, self.total);
        write_frame(&mut self.out, FRAME_END, &[&end])?;
        self.out.flush()?;
        Ok(self.out)
    }
}
