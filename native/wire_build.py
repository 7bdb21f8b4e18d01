"""cffi builder for native._llft_wire: the wire codec's per-datagram work (native/wire/).

Like native/pulse_build.py: the C source lives in its own folder (out of the preload
shim's glob), its text is read at build time, and the cdef is the header's "cdef begin"
.. "cdef end" region. The tag uses OpenSSL's SHA-256 (libcrypto, which CPython's hashlib
already loads; the headers come with Debian's libssl-dev, which scripts/setup.sh installs
if they are missing).
"""
import os
import runpy

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
WIRE = os.path.join(HERE, "wire")
HEADER = os.path.join(WIRE, "llft_wire.h")
SOURCE = os.path.join(WIRE, "llft_wire.c")


# native/pulse_build.py's, run by its path: pip runs this file in an isolated build
# environment where neither `native` nor this folder is importable
header_cdef = runpy.run_path(os.path.join(HERE, "pulse_build.py"))["header_cdef"]

ffibuilder = FFI()
ffibuilder.cdef(header_cdef(HEADER))
ffibuilder.set_source(
    "native._llft_wire",
    f'#line 1 "{SOURCE}"\n' + open(SOURCE).read(),
    include_dirs=[WIRE],
    libraries=["crypto"],
    extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
    depends=[HEADER, SOURCE],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
