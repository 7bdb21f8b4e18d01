"""Helpers for the record/replay tests: run a program plainly, recorded, replayed."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = os.path.join(ROOT, "tests", "programs")
LLFT = [sys.executable, "-m", "llft"]
PYTHON3 = shutil.which("python3")  # pyenv's bash wrapper: the shim must skip the bash stage


def program(name: str) -> str:
    return os.path.join(PROGRAMS, name)


def snapshot(cwd: str, files: list[str]) -> dict[str, bytes]:
    out = {}
    for f in files:
        p = os.path.join(cwd, f)
        out[f] = open(p, "rb").read() if os.path.exists(p) else None
        if os.path.exists(p):
            os.unlink(p)
    return out


def private_tmp(env: dict | None, folder: str) -> dict:
    """The environment with TMPDIR in `folder` (made if missing): a test program's
    mkdtemp() (a Unix socket's folder) lands in the test's tmp_path, not in /tmp, where
    every run left its empty folders. Record and replays of one trace share the folder
    (next to the trace), so a path a program binds is the same in each."""
    os.makedirs(folder, exist_ok=True)
    return {**(os.environ if env is None else env), "TMPDIR": folder}


def run_plain(cmd: list[str], cwd: str, files=(), timeout=120) -> tuple[bytes, dict]:
    p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                       env=private_tmp(None, os.path.join(cwd, "tmp")))
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    return p.stdout, snapshot(cwd, list(files))


def record(cmd: list[str], trace: str, cwd: str, files=(), external_ports=(), timeout=120, env=None):
    args = LLFT + ["record", "-q", "--trace", trace]
    for port in external_ports:
        args += ["--external-port", str(port)]
    p = subprocess.run(args + ["--"] + cmd, cwd=cwd, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=timeout,
                       env=private_tmp(env, trace.rstrip("/") + ".tmp"))
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    return p.stdout, snapshot(cwd, list(files))


def replay(trace: str, cwd: str, files=(), cmd=None, stall_ms=None, timeout=120, check=True,
           quiet=True):
    args = LLFT + ["replay"] + (["-q"] if quiet else []) + ["--trace", trace]
    if stall_ms:
        args += ["--stall-ms", str(stall_ms)]
    if cmd:
        args += ["--"] + cmd
    t0 = time.monotonic()
    p = subprocess.run(args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                       env=private_tmp(None, trace.rstrip("/") + ".tmp"))
    p.elapsed = time.monotonic() - t0
    if check:
        assert p.returncode == 0, p.stderr.decode()[-2000:]
    return p, snapshot(cwd, list(files))


def start_echo_server(tmpdir: str, script: str = "echo_server.py"):
    portfile = os.path.join(tmpdir, script + ".port")
    proc = subprocess.Popen([sys.executable, program(script), portfile])
    for _ in range(200):
        if os.path.exists(portfile):
            return proc, int(open(portfile).read())
        time.sleep(0.02)
    proc.kill()
    raise RuntimeError("echo server did not start")
