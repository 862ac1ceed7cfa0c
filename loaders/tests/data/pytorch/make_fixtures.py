#!/usr/bin/env python3
"""Writes the hand-made PyTorch snapshot fixtures the loader tests read.

Each is small and its expected figures are worked out by hand in loaders/tests/pytorch_snapshot.rs.
Run from this directory: python3 make_fixtures.py
"""
import pickle

MiB = 1 << 20
T0 = 1_700_000_000_000_000  # Unix-epoch microseconds


def frames(*names):
    return [{"name": n, "filename": f, "line": l} for (n, f, l) in names]


USER = frames(
    ("torch::unwind::unwind()", "??", 0),
    ("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc", "CUDACachingAllocator.cpp", 0),
    ("forward", "/home/me/model.py", 42),
    ("train", "/home/me/train.py", 7),
)
OTHER = frames(("torch::unwind::unwind()", "??", 0), ("step", "/home/me/train.py", 9))


def ring_buffer(alloc_300_at=0x100000200, protocol=5):
    """A trace that starts after the process did: two blocks live at its start, a segment that
    existed then and is released in it, and one new segment."""
    s1 = 0x100000000
    s2 = 0x200000000
    segments = [
        {
            "device": 0, "address": s1, "total_size": 2 * MiB, "allocated_size": 512,
            "active_size": 512, "requested_size": 100, "stream": 0, "segment_type": "small",
            "segment_pool_id": [0, 0],  # a list, as some writers have it
            "is_expandable": False, "frames": [],
            "blocks": [
                {"address": s1, "size": 512, "requested_size": 100, "state": "active_allocated", "frames": OTHER},
                {"address": s1 + 512, "size": 2 * MiB - 512, "requested_size": 300, "state": "inactive", "frames": []},
            ],
        },
        {
            "device": 0, "address": s2, "total_size": 20 * MiB, "allocated_size": 2000384,
            "active_size": 2000384, "requested_size": 2000000, "stream": 0, "segment_type": "large",
            "segment_pool_id": (0, 0), "is_expandable": False, "frames": USER,
            "blocks": [
                {"address": s2, "size": 2000384, "requested_size": 2000000, "state": "active_allocated", "frames": USER},
                {"address": s2 + 2000384, "size": 20 * MiB - 2000384, "requested_size": 0, "state": "inactive", "frames": []},
            ],
        },
    ]
    def e(action, addr, size, dt, fr):
        return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": T0 + dt,
                "compile_context": "N/A", "user_metadata": "", "frames": fr}
    trace = [
        e("free_requested", s1 + 1024, 700, 0, OTHER),
        e("free_completed", s1 + 1024, 700, 1, OTHER),
        e("alloc", alloc_300_at, 300, 2, USER),
        e("segment_alloc", s2, 20 * MiB, 3, USER),
        e("alloc", s2, 2000000, 3, USER),
        e("free_requested", alloc_300_at, 300, 4, OTHER),
        e("free_completed", alloc_300_at, 300, 5, OTHER),
        e("segment_free", 0x300000000, 2 * MiB, 6, []),
        {"action": "some_future_action", "addr": 0, "size": 0, "stream": 0, "time_us": T0 + 7},
    ]
    return {
        "segments": segments,
        "device_traces": [trace],
        "allocator_settings": {
            "PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
            "garbage_collection_threshold": 0.0, "expandable_segments": False,
            "roundup_power2_divisions": {str(1 << i): 0 for i in range(16)},
            "a_setting_from_the_future": True,
        },
        "external_annotations": [
            {"stage": "START", "name": "Optimizer.step#AdamW.step", "device": 0, "time_us": T0 + 1},
            {"stage": "END", "name": "Optimizer.step#AdamW.step", "device": 0, "time_us": T0 + 5},
        ],
    }


def legacy_1_13():
    """PyTorch 1.13's memory_snapshot(): a bare list of segments whose blocks carry history."""
    return [
        {
            "device": 0, "address": 0x7000000000, "total_size": 2 * MiB, "allocated_size": 1024,
            "active_size": 1024, "stream": 0, "segment_type": "small",
            "blocks": [
                {"size": 1024, "state": "active_allocated",
                 "history": [{"addr": 0x7000000000, "real_size": 1000, "frames": frames(("f", "a.py", 3))}]},
                {"size": 2 * MiB - 1024, "state": "inactive"},
            ],
        }
    ]


def v2_0():
    """PyTorch 2.0: segments and device_traces, blocks with history, no requested_size, no
    block address, no time_us, no settings, no annotations."""
    snap = {"segments": legacy_1_13(), "device_traces": [[
        {"action": "segment_alloc", "addr": 0x7000000000, "size": 2 * MiB, "stream": 0},
        {"action": "alloc", "addr": 0x7000000000, "size": 1000, "stream": 0, "frames": frames(("f", "a.py", 3))},
        {"action": "alloc", "addr": 0x7000000400, "size": 10, "stream": 0},
        {"action": "free_requested", "addr": 0x7000000400, "size": 10, "stream": 0},
        {"action": "free_completed", "addr": 0x7000000400, "size": 10, "stream": 0},
    ]]}
    return snap


def oom_streams():
    """Two streams (one a large handle, as CUDA stream pointers are) and an `oom`, which has
    `device_free` where other entries have `addr`."""
    seg = 0x7F00000000
    side = 0x55D2C3A4B5C0  # a stream handle
    blocks = [
        {"address": seg, "size": 512, "requested_size": 500, "state": "active_allocated", "frames": []},
        {"address": seg + 512, "size": 2 * MiB - 512, "requested_size": 0, "state": "inactive", "frames": []},
    ]
    return {
        "segments": [{
            "device": 0, "address": seg, "total_size": 2 * MiB, "allocated_size": 512,
            "active_size": 512, "requested_size": 500, "stream": side, "segment_type": "small",
            "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks,
        }],
        "device_traces": [[
            {"action": "alloc", "addr": seg, "size": 500, "stream": side, "time_us": T0},
            {"action": "oom", "device_free": 123_456_789, "size": 8 << 30, "stream": side, "time_us": T0 + 1},
            {"action": "alloc", "addr": seg + 512, "size": 100, "stream": 0, "time_us": T0 + 2},
            {"action": "free_requested", "addr": seg + 512, "size": 100, "stream": 0, "time_us": T0 + 3},
            {"action": "free_completed", "addr": seg + 512, "size": 100, "stream": 0, "time_us": T0 + 4},
        ]],
    }


def many_bad():
    """25 trace entries without `addr`: every one is skipped and counted, 20 are described."""
    snap = oom_streams()
    snap["device_traces"][0] += [{"action": "alloc", "size": 16 * (i + 1), "stream": 0} for i in range(25)]
    return snap


if __name__ == "__main__":
    for name, obj, proto in [
        ("ring_buffer.pickle", ring_buffer(), 5),
        ("ring_buffer_p2.pickle", ring_buffer(protocol=2), 2),
        ("ring_buffer_diverging.pickle", ring_buffer(alloc_300_at=0x100000600), 4),
        ("legacy_1_13.pickle", legacy_1_13(), 2),
        ("v2_0.pickle", v2_0(), 3),
        ("oom_streams.pickle", oom_streams(), 4),
        ("many_bad.pickle", many_bad(), 4),
    ]:
        with open(name, "wb") as f:
            pickle.dump(obj, f, protocol=proto)
        print(name, proto)
