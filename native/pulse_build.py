"""cffi builder for native._llft_pulse: the agent's heartbeat thread (native/pulse/).

The C source lives in native/pulse/, not native/: setup.py compiles every native/*.c
into the preload shim, and the pulse thread has no business inside the app's process.
Its text is read here at build time, so any change to it changes the generated module
source and cffi rebuilds; the cdef is the header's "cdef begin" .. "cdef end" region,
one definition for both sides (as native/shm_build.py does for llft_shm.h).
"""
import os
import re

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
PULSE = os.path.join(HERE, "pulse")
HEADER = os.path.join(PULSE, "llft_pulse.h")
SOURCE = os.path.join(PULSE, "llft_pulse.c")


def header_cdef(path: str = HEADER) -> str:
    """The part of the header between its "cdef begin" and "cdef end" lines."""
    text = open(path).read()
    m = re.search(r"^/\* ==== cdef begin .*?\*/\n(.*)^/\* ==== cdef end", text, re.S | re.M)
    if not m:
        raise RuntimeError(f"{path}: no cdef begin/end region")
    return m.group(1)


ffibuilder = FFI()
ffibuilder.cdef(header_cdef())
ffibuilder.set_source(
    "native._llft_pulse",
    # #line: compiler messages point at the real file, not cffi's generated one
    f'#line 1 "{SOURCE}"\n' + open(SOURCE).read(),
    include_dirs=[PULSE],
    extra_compile_args=["-O2", "-pthread", "-Wall", "-Wextra", "-Wno-unused-parameter"],
    extra_link_args=["-pthread"],
    depends=[HEADER, SOURCE],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
