"""Cluster key files: `llft keygen PATH` and `load_key(path)`.

Theory of operation
-------------------
Every llft datagram carries an HMAC-SHA256 tag under one 32-byte cluster key shared by
all replicas (llft/protocol/wire.py). The key file holds that key as 64 lowercase hex digits and a
newline: printable, diffable, safe to copy with ordinary tools.

The file must never be readable by anyone but its owner, not even for an instant, so
keygen writes the key into a fresh temporary file created with O_EXCL and mode 0600 in
the target's directory, fsyncs it, and then links it into place: `os.link` refuses to
overwrite (so the check-and-create is atomic), `os.replace` overwrites with `--force`.
A reader either sees no file or the whole key, never a partial one.

`load_key` refuses (with one `KeyFileError` line that the CLI prints, exit code 2) a
file that is missing, unreadable, not a regular file, readable or writable by group or
others, or not exactly one 32-byte hex key.
"""
from __future__ import annotations

import argparse
import os
import secrets
import stat
import sys

KEY_BYTES = 32
KEY_MODE = 0o600
# A key file is 64 hex digits and a newline; anything much longer is not a key file, and
# reading it whole would let a wrong path (a log, a device) cost unbounded memory.
KEY_FILE_MAX_BYTES = 256


class KeyFileError(Exception):
    """A key file that cannot be used; str() is one line naming the file and the fault."""


def generate_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def write_key(path: str, key: bytes | None = None, *, force: bool = False) -> bytes:
    """Atomically create `path` (mode 0600) holding `key` (new if None); returns the key."""
    key = generate_key() if key is None else key
    if len(key) != KEY_BYTES:
        raise ValueError(f"a cluster key is {KEY_BYTES} bytes")
    if not force and os.path.lexists(path):
        raise KeyFileError(f"{path}: already exists (use --force to replace it)")
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(8)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, KEY_MODE)
    except OSError as e:
        raise KeyFileError(f"{path}: cannot create: {e.strerror}") from None
    try:
        try:
            os.fchmod(fd, KEY_MODE)        # umask can only remove bits; make it exact
            os.write(fd, key.hex().encode("ascii") + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        if force:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)         # fails with EEXIST: never overwrites
            except FileExistsError:
                raise KeyFileError(f"{path}: already exists (use --force to replace it)") \
                    from None
    except OSError as e:
        raise KeyFileError(f"{path}: cannot write: {e.strerror}") from None
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:          # os.replace consumed it
            pass
    return key


def load_key(path: str) -> bytes:
    """The 32-byte cluster key in `path`; raises KeyFileError (one line) if unusable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise KeyFileError(f"{path}: no such key file (create one with 'llft keygen')") \
            from None
    except OSError as e:
        raise KeyFileError(f"{path}: cannot open key file: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise KeyFileError(f"{path}: not a regular file")
        if st.st_mode & 0o077:
            raise KeyFileError(f"{path}: mode {stat.S_IMODE(st.st_mode):04o} is too "
                               f"permissive (group/others can access it); chmod 600 it")
        try:
            raw = os.read(fd, KEY_FILE_MAX_BYTES + 1)
        except OSError as e:
            raise KeyFileError(f"{path}: cannot read key file: {e.strerror}") from None
    finally:
        os.close(fd)
    if len(raw) > KEY_FILE_MAX_BYTES:
        raise KeyFileError(f"{path}: too large for a key file")
    text = raw.strip()
    try:
        if len(text) != 2 * KEY_BYTES:
            raise ValueError
        key = bytes.fromhex(text.decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        raise KeyFileError(f"{path}: malformed key file (want {2 * KEY_BYTES} hex digits)") \
            from None
    return key


# -- `llft keygen` ------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="PATH", help="key file to create (mode 0600)")
    parser.add_argument("--force", action="store_true", help="replace an existing file")


def run(args: argparse.Namespace) -> int:
    try:
        write_key(args.path, force=args.force)
    except KeyFileError as e:
        print(f"llft keygen: {e}", file=sys.stderr)
        return 2
    print(f"wrote a new cluster key to {args.path} (mode 0600)")
    return 0
