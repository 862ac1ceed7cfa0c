#!/usr/bin/env python3
"""Writes a tracer spool of THREADS threads without order keys (encoding 2, a coarse clock):
every thread allocates and frees EVENTS/2 blocks within one clock period, a quarter of them
freed by the next thread (blocks handed over between threads), so the loader must order the
period by causality. For the bench of the spool merge (issue 20, item 8). With `conflict`,
every thread first allocates one shared address that no thread frees: no order of the period
is consistent, the causal search gives up and the greedy fallback orders it.

usage: gen-spool-threads.py OUT [THREADS=2000] [EVENTS=50] [conflict]"""
import struct
import sys

out = sys.argv[1]
threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
events = int(sys.argv[3]) if len(sys.argv) > 3 else 50
conflict = len(sys.argv) > 4 and sys.argv[4] == "conflict"
META = ("pid=5\ntick0=1000\nmono_ns0=1000\nrealtime_ns0=5000\nclock=monotonic_coarse_ns\n"
        "clock_resolution_ns=1000000\nevents=2\n").encode()
OP_FREE, OP_TIME, SHIFT = 0x10, 0x0F, 5


def varint(n):
    b = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            b.append(byte | 0x80)
        else:
            b.append(byte)
            return bytes(b)


def zigzag(d):
    return ((d << 1) ^ (d >> 63)) & (2**64 - 1)


def frame(tag, payload):
    return bytes([tag]) + struct.pack("<I", len(payload)) + payload


def event(buf, prev, op, tick, size, addr):
    if tick != prev[0]:
        buf += bytes([OP_TIME]) + varint(zigzag(tick - prev[0]))
    delta = zigzag((addr - prev[1]) & (2**64 - 1) if addr >= prev[1] else -(prev[1] - addr))
    n = (71 - (64 - delta.bit_length() if delta else 64)) // 8
    code, n = (7, 8) if n >= 7 else (n, n)
    buf.append(op | (code << SHIFT))
    if not op & OP_FREE:
        bits = max(1, size.bit_length())
        k = -(-bits // 7)
        word = (size << k) | (1 << (k - 1))
        buf += word.to_bytes(8, "little")[:k]
    buf += delta.to_bytes(8, "little")[:n]
    prev[0], prev[1] = tick, addr


data = bytearray(b"\x89AVT\r\n\x1a\n" + bytes([1, 1]))
data += frame(1, META)
tick = 1000
for t in range(threads):
    buf, prev = bytearray(), [0, 0]
    base = 0x10_0000_0000 + t * 0x100_0000
    if conflict:
        event(buf, prev, 0, tick, 48, 0x5000)
    for k in range(events // 2):
        addr = base + k * 64
        event(buf, prev, 0, tick, 48, addr)
        # A quarter of the blocks are freed by the previous thread (handed over).
        if k % 4 != 3:
            event(buf, prev, OP_FREE | 3, tick, 0, addr)
    if t > 0:
        pbase = 0x10_0000_0000 + (t - 1) * 0x100_0000
        for k in range(3, events // 2, 4):
            event(buf, prev, OP_FREE | 3, tick, 0, pbase + k * 64)
    head = struct.pack("<IQQq", t, 100 + t, 0, 0)
    data += frame(0x10, head + bytes(buf))
open(out, "wb").write(data)
