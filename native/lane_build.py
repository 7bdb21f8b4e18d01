"""cffi builder for native._llft_lane: the steady lanes in C (native/lane/): a lone
primary's (llft_lane.c) and a backup's (llft_backup.c, appended to the same unit).

Like native/wire_build.py: the C source lives in its own folder (out of the preload
shim's glob native/*.c), its text is read at build time, and the cdef is the header's
"cdef begin" .. "cdef end" region. llft_lane.c includes native/wire/llft_wire.c (one
translation unit: the lane verifies, parses and seals datagrams with the codec's own
code), so both files are build dependencies; the tag needs OpenSSL's libcrypto as the
wire module does.
"""
import os
import runpy

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
LANE = os.path.join(HERE, "lane")
WIRE = os.path.join(HERE, "wire")
HEADER = os.path.join(LANE, "llft_lane.h")
SOURCE = os.path.join(LANE, "llft_lane.c")
BACKUP_HEADER = os.path.join(LANE, "llft_backup.h")     # a backup's lane: the same unit
BACKUP_SOURCE = os.path.join(LANE, "llft_backup.c")


# native/pulse_build.py's, run by its path: pip runs this file in an isolated build
# environment where neither `native` nor this folder is importable
header_cdef = runpy.run_path(os.path.join(HERE, "pulse_build.py"))["header_cdef"]

ffibuilder = FFI()
ffibuilder.cdef(header_cdef(HEADER) + header_cdef(BACKUP_HEADER))
ffibuilder.set_source(
    "native._llft_lane",
    f'#line 1 "{SOURCE}"\n' + open(SOURCE).read()
    + f'\n#line 1 "{BACKUP_SOURCE}"\n' + open(BACKUP_SOURCE).read(),
    include_dirs=[LANE, WIRE],
    libraries=["crypto"],
    extra_compile_args=["-O2", "-Wall", "-Wextra"],
    depends=[HEADER, SOURCE, BACKUP_HEADER, BACKUP_SOURCE, os.path.join(WIRE, "llft_wire.h"),
             os.path.join(WIRE, "llft_wire.c")],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
