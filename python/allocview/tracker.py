"""Recording the running interpreter from inside: :class:`Tracker`.

The tracer that ``allocview record`` preloads is loaded into this process (``dlopen``, not
``LD_PRELOAD``: nothing restarts) and records while the ``with`` block runs: every request to
Python's allocators with its Python and native stack, and with ``native=True`` the C library
calls of the whole process (the imports of every loaded library are redirected to the tracer
while the block runs, as memray does). The result is a normal trace file that every
``allocview`` command and :func:`allocview.load` read.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import shutil
import sys
import tempfile
from typing import Optional, Union

from . import _native

_library: Optional[ctypes.PyDLL] = None
_library_dir: Optional[str] = None
_runs = 0


def _load_library() -> ctypes.PyDLL:
    """The tracer, loaded once per process (a private copy in a temporary folder)."""
    global _library, _library_dir
    if _library is not None:
        return _library
    if os.environ.get("ALLOCVIEW_SPOOL"):
        raise _native.AllocviewError(
            "allocview.Tracker cannot run inside `allocview record`, which traces this "
            "process already")
    so = _native.tracer_library()
    if not so:
        raise _native.AllocviewError(
            "allocview.Tracker needs the tracer, which is not built on this platform "
            "(x86-64 Linux)")
    _library_dir = tempfile.mkdtemp(prefix="allocview-tracker-")
    atexit.register(shutil.rmtree, _library_dir, True)
    path = os.path.join(_library_dir, "liballocview_tracer.so")
    with open(path, "wb") as f:
        f.write(so)
    # PyDLL: the calls keep the GIL, which the tracer needs to change Python's allocators.
    lib = ctypes.PyDLL(path, mode=os.RTLD_LOCAL | getattr(os, "RTLD_NOW", 2))
    lib.allocview_tracker_start.argtypes = [ctypes.c_char_p, ctypes.c_int]
    lib.allocview_tracker_start.restype = ctypes.c_int
    lib.allocview_tracker_stop.argtypes = []
    lib.allocview_tracker_stop.restype = ctypes.c_int
    _library = lib
    return lib


class Tracker:
    """Records this interpreter while a ``with`` block runs, into the trace ``path``.

    >>> with allocview.Tracker("run.avt"):
    ...     table = build_table()
    >>> allocview.sites("run.avt")["sites"][0]["name"]

    ``native``: also record the C library calls (``malloc``...) of the whole process, as
    ``allocview record`` does; without it, only the requests to Python's allocators (objects,
    and what the interpreter and C extensions ask of ``PyMem_*``). After the block,
    ``events``, ``peak_live_bytes`` and ``final_live_bytes`` (of the requests the program
    made) are set. One Tracker records at a time.
    """

    def __init__(self, path: Union[str, "os.PathLike[str]"], native: bool = True):
        self.path = os.fspath(path)
        self.native = native
        self.events: Optional[int] = None
        self.peak_live_bytes: Optional[int] = None
        self.final_live_bytes: Optional[int] = None
        self._prefix: Optional[str] = None

    def __enter__(self) -> "Tracker":
        global _runs
        lib = _load_library()
        _runs += 1
        assert _library_dir is not None
        self._prefix = os.path.join(_library_dir, f"run{_runs}")
        rc = lib.allocview_tracker_start(os.fsencode(self._prefix), int(bool(self.native)))
        if rc == -1:
            raise _native.AllocviewError("a Tracker is already recording in this process")
        if rc != 0:
            raise _native.AllocviewError(
                f"the tracer could not start (code {rc}): cannot create its file in "
                f"{_library_dir}")
        return self

    def __exit__(self, *exc) -> None:
        assert _library is not None and self._prefix is not None
        _library.allocview_tracker_stop()
        spool = f"{self._prefix}.{os.getpid()}.spool"
        try:
            program = " ".join(sys.argv) or sys.executable
            self.events, self.peak_live_bytes, self.final_live_bytes = _native.spool_to_trace(
                spool, self.path, program)
        finally:
            try:
                os.remove(spool)
            except OSError:
                pass
