"""Converts a memray capture that allocview does not read natively, through memray's own reader.

allocview reads memray's capture formats 12 and 13 (memray 1.18 to 1.20) itself. A capture of
another format version is read here with the installed memray (``memray.FileReader``, which
reads the version its release writes) and written again as a format-13 capture, which every
allocview command then reads:

    python -m allocview.memray_convert old.bin converted.bin   # with memray installed
    allocview stats converted.bin

or ``python path/to/memray_convert.py old.bin converted.bin`` without the allocview wheel.

Kept: every allocation record in order, with its thread, address, size and allocator, the
Python frames of each allocation (function, file, line), the threads, and memray's RSS samples.
Lost: the times of the calls (the reader gives none: every call reads as time 0, the RSS
samples keep their times), native frames (memray resolves them only against the binaries of
the machine that reads the file; ``--native`` captures convert with their Python frames),
thread names.
"""

from __future__ import annotations

import struct
import sys
from typing import BinaryIO, Dict, List, Tuple

FORMAT_VERSION = 13
MAGIC = b"memray\0"

# memray's record types and allocator codes (hooks::Allocator).
TRAILER = 1
MEMORY_RECORD = 2
CONTEXT_SWITCH = 12
CODE_OBJECT = 14
FRAME_POP = 0x10
FRAME_PUSH = 0x40
ALLOCATION = 0x80
SIMPLE_FREES = {1, 5}  # pymalloc_free, free: no size
DEALLOCATORS = SIMPLE_FREES | {15}  # and munmap: no stack
# One location-table entry: "no columns" (code 13), one code unit, line delta 0.
ONE_LINE_TABLE = bytes([0x80 | (13 << 3), 0])
PYTHON_ALLOCATORS = {"pymalloc": 1, "pymalloc_debug": 2, "malloc": 3, "mimalloc": 5,
                     "mimalloc_debug": 6}


def _varint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _signed(out: bytearray, value: int) -> None:
    # Zig-zag, as memray writes its deltas (64-bit two's complement).
    _varint(out, ((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF)


def _wrapping_delta(new: int, old: int) -> int:
    delta = (new - old) & 0xFFFFFFFFFFFFFFFF
    return delta - (1 << 64) if delta >= 1 << 63 else delta


class _Writer:
    """The record stream of a format-13 capture, encoded as memray's streaming writer does."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.tid = None
        self.last_units = 0
        self.last_first_line = 0
        self.code_ids: Dict[Tuple[str, str, int], int] = {}
        # Per thread, the code ids on its stack, outermost first.
        self.stacks: Dict[int, List[int]] = {}

    def thread(self, tid: int) -> None:
        if tid != self.tid:
            self.tid = tid
            self.out.append(CONTEXT_SWITCH)
            self.out += struct.pack("<Q", tid)

    def code(self, frame: Tuple[str, str, int]) -> int:
        """The id of a code object standing for one (function, file, line): its line table
        (CPython 3.11's form) says that its one instruction is on its first line."""
        code_id = self.code_ids.get(frame)
        if code_id is None:
            code_id = len(self.code_ids) + 1
            self.code_ids[frame] = code_id
            function, file, line = frame
            self.out.append(CODE_OBJECT)
            _varint(self.out, code_id)
            self.out += function.encode("utf-8", "replace") + b"\0"
            self.out += file.encode("utf-8", "replace") + b"\0"
            _signed(self.out, line - self.last_first_line)
            self.last_first_line = line
            _varint(self.out, len(ONE_LINE_TABLE))
            self.out += ONE_LINE_TABLE
        return code_id

    def stack(self, tid: int, frames_innermost_first: list) -> None:
        """Pops and pushes frames so that thread `tid`'s stack is `frames`."""
        want = [self.code((str(f[0]), str(f[1]), int(f[2])))
                for f in reversed(frames_innermost_first)]
        have = self.stacks.setdefault(tid, [])
        common = 0
        while common < min(len(have), len(want)) and have[common] == want[common]:
            common += 1
        to_pop = len(have) - common
        while to_pop:
            n = min(to_pop, 16)
            self.out.append(FRAME_POP | (n - 1))
            to_pop -= n
        for code_id in want[common:]:
            self.out.append(FRAME_PUSH)
            _varint(self.out, code_id)
            _signed(self.out, 0)
        self.stacks[tid] = want

    def allocation(self, addr: int, allocator: int, size: int) -> None:
        short = allocator if allocator < 8 else 0
        self.out.append(ALLOCATION | (15 << 3) | short)
        units = addr >> 3
        _signed(self.out, _wrapping_delta(units, self.last_units))
        self.last_units = units
        if short == 0:
            self.out.append(allocator)
        if allocator not in SIMPLE_FREES:
            _varint(self.out, size)


def _ms(when) -> int:
    """Milliseconds since the epoch: the metadata's times are datetimes, a snapshot's an int."""
    if hasattr(when, "timestamp"):
        return int(when.timestamp() * 1000)
    return int(when)


def convert(capture: str, out_path: str) -> int:
    """Writes `capture` (any version the installed memray reads) to `out_path` as a format-13
    capture; returns the allocation records written."""
    import memray  # the caller's memray: its reader knows its own release's format

    reader = memray.FileReader(capture)
    meta = reader.metadata
    if getattr(meta, "file_format", 0) != 0:
        raise ValueError(f"{capture}: an aggregated capture holds no allocations to convert")
    w = _Writer()
    records = 0
    for r in reader.get_allocation_records():
        w.thread(r.tid)
        allocator = int(r.allocator)
        if allocator not in DEALLOCATORS:
            w.stack(r.tid, list(r.stack_trace()))
        w.allocation(r.address, allocator, r.size)
        records += 1
    start_ms = _ms(meta.start_time)
    for s in reader.get_memory_snapshots():
        w.out.append(MEMORY_RECORD)
        _varint(w.out, s.rss)
        _varint(w.out, max(0, _ms(s.time) - start_ms))
    w.out.append(TRAILER)
    with open(out_path, "wb") as f:
        _write_header(f, meta, records, start_ms)
        f.write(w.out)
    return records


def _write_header(f: BinaryIO, meta, records: int, start_ms: int) -> None:
    h = bytearray(MAGIC)
    h += struct.pack("<i", FORMAT_VERSION)
    # The line tables written are in CPython 3.11's form, read for 3.11 and later.
    h += struct.pack("<i", 0x030C0000)
    h += bytes([0, 0])  # no native frames; every allocation
    h += struct.pack("<QQqq", records, 0, start_ms, _ms(meta.end_time))
    h += str(meta.command_line).encode("utf-8", "replace") + b"\0"
    h += struct.pack("<iQQ", int(meta.pid), int(meta.main_thread_id), 0)
    allocator = PYTHON_ALLOCATORS.get(str(meta.python_allocator), 4)
    h += bytes([allocator, 1 if meta.trace_python_allocators else 0, 0])
    h += b"\0\0\0"  # libdest, site-packages and sys.path: not kept
    f.write(h)


def main(argv: List[str]) -> int:
    if len(argv) != 3:
        print(f"usage: {argv[0]} CAPTURE OUT", file=sys.stderr)
        return 2
    n = convert(argv[1], argv[2])
    print(f"wrote {argv[2]}: {n} allocation records (memray capture format {FORMAT_VERSION})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
