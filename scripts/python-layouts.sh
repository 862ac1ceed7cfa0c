#!/usr/bin/env bash
# Prints the offsets the tracer's Python frame walk reads (tracer/src/python/layout.rs), as
# compiled from a CPython's installed headers: one line per include directory given, in the
# format of `layout::describe`. Usage: scripts/python-layouts.sh INCLUDE_DIR...
# (e.g. ~/.pyenv/versions/3.12.1/include/python3.12 or /usr/include/python3.11).
set -euo pipefail
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/layout.c" <<'C'
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#if PY_VERSION_HEX < 0x030b0000
#include "frameobject.h"
#else
#include "internal/pycore_frame.h"
#endif
#if PY_VERSION_HEX >= 0x030d0000
#include "internal/pycore_tstate.h"
#endif
#define O(t, f) ((long)offsetof(t, f))
int main(void) {
  long tstate_frame, cframe_current = 0, frame_code, frame_back, frame_instr, frame_owner = 0;
  long frame_is_entry = -1, code_qualname = -1, code_instructions = 0, code_firsttraceable = 0;
#if PY_VERSION_HEX < 0x030b0000
  tstate_frame = O(PyThreadState, frame);
  frame_code = O(PyFrameObject, f_code);
  frame_back = O(PyFrameObject, f_back);
  frame_instr = O(PyFrameObject, f_lasti);
#else
#if PY_VERSION_HEX < 0x030d0000
  tstate_frame = O(PyThreadState, cframe);
  cframe_current = O(_PyCFrame, current_frame);
  frame_code = O(_PyInterpreterFrame, f_code);
  frame_instr = O(_PyInterpreterFrame, prev_instr);
#else
  tstate_frame = O(PyThreadState, current_frame);
  frame_code = O(_PyInterpreterFrame, f_executable);
  frame_instr = O(_PyInterpreterFrame, instr_ptr);
#endif
  frame_back = O(_PyInterpreterFrame, previous);
  frame_owner = O(_PyInterpreterFrame, owner);
#if PY_VERSION_HEX < 0x030c0000
  frame_is_entry = O(_PyInterpreterFrame, is_entry);
#endif
  code_qualname = O(PyCodeObject, co_qualname);
  code_instructions = O(PyCodeObject, co_code_adaptive);
  code_firsttraceable = O(PyCodeObject, _co_firsttraceable);
#endif
  printf("%d.%d tstate_frame=%ld cframe_current=%ld frame_code=%ld frame_back=%ld "
         "frame_instr=%ld frame_owner=%ld frame_is_entry=%ld code_filename=%ld code_name=%ld "
         "code_qualname=%ld code_firstlineno=%ld code_instructions=%ld "
         "code_firsttraceable=%ld ascii_data=%ld compact_data=%ld\n",
         PY_MAJOR_VERSION, PY_MINOR_VERSION, tstate_frame, cframe_current, frame_code,
         frame_back, frame_instr, frame_owner, frame_is_entry, O(PyCodeObject, co_filename),
         O(PyCodeObject, co_name), code_qualname, O(PyCodeObject, co_firstlineno),
         code_instructions, code_firsttraceable, (long)sizeof(PyASCIIObject),
         (long)sizeof(PyCompactUnicodeObject));
  return 0;
}
C
for inc in "$@"; do
  gcc -I "$inc" "$work/layout.c" -o "$work/layout"
  "$work/layout"
done
