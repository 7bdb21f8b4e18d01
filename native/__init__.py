"""Where the built native artefacts live, and the header's names for Python.

- `shim_path()`: the preload shim (libllft_preload.so, built from native/shim_*.c);
- `native._llft_shm`: the cffi module mapping the shared-memory block (native/shm_build.py);
- `c_enum()`: an IntEnum made from one of the header's C enums, so that a Python name
  (`Call.RECV`) and its C name (`LLFT_C_RECV`) are one definition, in native/llft_shm.h.
"""
from __future__ import annotations

import enum
import os

SHIM_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libllft_preload.so")


def shim_path() -> str:
    """Absolute path of libllft_preload.so; a clear error if the package was not built."""
    if not os.path.exists(SHIM_PATH):
        raise FileNotFoundError(
            f"llft preload shim not built ({SHIM_PATH} missing): run scripts/setup.sh")
    return SHIM_PATH


def c_enum(name: str, ctype: str, prefix: str, base: type[enum.IntEnum] = enum.IntEnum,
           skip: tuple[str, ...] = ()) -> type[enum.IntEnum]:
    """IntEnum `name` with the members of C `ctype` (e.g. "enum llft_call"), each named
    without `prefix` (LLFT_C_RECV -> RECV); the C names in `skip` are left out."""
    from native._llft_shm import ffi
    members = {c_name.removeprefix(prefix): value
               for value, c_name in sorted(ffi.typeof(ctype).elements.items())
               if c_name not in skip}
    return base(name, members)
