"""Cluster key files: creation mode, refusal to overwrite, one-line errors."""
import os
import stat
import subprocess
import sys

import pytest

from llft import cli
from llft.runtime.keys import KEY_BYTES, KeyFileError, load_key, write_key


def test_keygen_writes_0600_hex_key(tmp_path, capsys):
    path = tmp_path / "cluster.key"
    assert cli.main(["keygen", str(path)]) == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert len(text) == 2 * KEY_BYTES + 1 and text.endswith("\n")
    key = load_key(str(path))
    assert len(key) == KEY_BYTES and key.hex() == text.strip()
    assert not [p for p in tmp_path.iterdir() if p.name != "cluster.key"]   # no temp left


def test_keygen_is_0600_even_with_permissive_umask(tmp_path):
    old = os.umask(0)
    try:
        write_key(str(tmp_path / "k"))
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "k").stat().st_mode) == 0o600


def test_keygen_refuses_overwrite_unless_forced(tmp_path, capsys):
    path = tmp_path / "k"
    assert cli.main(["keygen", str(path)]) == 0
    first = load_key(str(path))
    assert cli.main(["keygen", str(path)]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and len(err.strip().splitlines()) == 1
    assert load_key(str(path)) == first
    assert cli.main(["keygen", "--force", str(path)]) == 0
    assert load_key(str(path)) != first
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_keygen_cli_subprocess(tmp_path):
    path = tmp_path / "k"
    r = subprocess.run([sys.executable, "-m", "llft", "keygen", str(path)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "llft", "keygen", str(path)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def _key_file(tmp_path, content: bytes, mode=0o600):
    path = tmp_path / "k"
    path.write_bytes(content)
    os.chmod(path, mode)
    return str(path)


@pytest.mark.parametrize("content,mode,fragment", [
    (None, 0o600, "no such key file"),
    (b"00" * 32 + b"\n", 0o644, "too permissive"),
    (b"00" * 32 + b"\n", 0o640, "too permissive"),
    (b"00" * 31 + b"\n", 0o600, "malformed"),
    (b"zz" * 32 + b"\n", 0o600, "malformed"),
    (b"\xff" * 64, 0o600, "malformed"),
    (b"", 0o600, "malformed"),
    (b"0" * 4096, 0o600, "too large"),
])
def test_load_key_errors_are_one_line(tmp_path, content, mode, fragment):
    path = str(tmp_path / "k") if content is None else _key_file(tmp_path, content, mode)
    with pytest.raises(KeyFileError) as info:
        load_key(path)
    msg = str(info.value)
    assert fragment in msg and "\n" not in msg and path in msg


def test_load_key_not_regular_file(tmp_path):
    with pytest.raises(KeyFileError, match="not a regular file"):
        load_key(str(tmp_path))


def test_load_key_unreadable(tmp_path):
    path = _key_file(tmp_path, b"00" * 32, 0o000)
    if os.geteuid() == 0:
        # root reads anything; an unreadable path is then one under a non-directory
        path = path + "/x"
    with pytest.raises(KeyFileError, match="cannot open"):
        load_key(path)


def test_load_key_accepts_trailing_whitespace(tmp_path):
    assert load_key(_key_file(tmp_path, b"ab" * 32 + b"\r\n")) == b"\xab" * 32
