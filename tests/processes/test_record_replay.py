"""Record once, replay N times: byte-identical output (stdout and files), no deadlock.

Each program in tests/programs/ is unmodified Python. For each we first show that two
plain runs differ (so identical replays mean something), then record it and replay it.
The default run replays each program twice; `--soak=small|full` replays 3|20 times.
"""
from __future__ import annotations

import shutil
import sys

import pytest

from determinizer.recordreplay import EXIT_DIVERGED
from rr_helpers import PYTHON3, program, record, replay, run_plain, start_echo_server

# name -> (argv after the interpreter, files written, needs the external server)
PROGRAMS = {
    "threads_locks": (["threads_locks.py"], [], False),
    "c_mutex": (["c_mutex.py"], [], False),
    "clocks": (["clocks.py"], [], False),
    "randomness": (["randomness.py"], ["random_out.txt"], False),
    "hashseed": (["hashseed.py"], [], False),
    "addresses": (["addresses.py"], [], False),
    "ext_client": (["ext_client.py", "{port}"], ["client_out.txt"], True),
    "private_child": (["private_child.py"], [], False),
    "asyncio_prog": (["asyncio_prog.py", "{port}"], [], True),
    # races only the GIL's hand-offs arbitrate (shim_gil.c)
    "gil_feeders": (["gil_feeders.py"], [], False),
    "serve_forever_flag": (["serve_forever_flag.py"], [], False),
    "pid_visible": (["pid_visible.py"], [], False),
    "udp_inprocess": (["udp_inprocess.py"], [], False),
    # more threads than logical thread ids: ids of ended threads reused (shim_threads.c)
    "many_threads": (["many_threads.py"], [], False),
    # threads importing at once contend on CPython's import lock (shim_locks.c)
    "concurrent_imports": (["concurrent_imports.py"], [], False),
    # peers inside the process: read sizes, send counts, datagram timing (shim_net.c)
    "inprocess_stream": (["inprocess_stream.py"], [], False),
    "inprocess_dgram": (["inprocess_dgram.py"], [], False),
    "inprocess_stream_unix": (["inprocess_stream.py", "unix"], [], False),
    # ports the kernel chose reach the output (shim_net.c port0_bind)
    "bound_ports": (["bound_ports.py"], [], False),
    # pipes to a child: readiness and read sizes (shim_process.c)
    "child_pipes": (["child_pipes.py"], [], False),
    # timestamps of a file the run wrote are the primary's (shim_process.c)
    "file_times": (["file_times.py"], ["times_out.txt"], False),
}


@pytest.fixture(autouse=True)
def group_pid(monkeypatch):
    # the process id is virtualized only on request (replicas sharing a host would share
    # files named after it); pid_visible.py checks the requested mode
    monkeypatch.setenv("LLFT_GROUP_PID", "1")


@pytest.fixture(scope="module")
def echo_port(tmp_path_factory):
    proc, port = start_echo_server(str(tmp_path_factory.mktemp("echo")))
    yield port
    proc.kill()
    proc.wait()


def _cmd(name, port):
    argv, files, ext = PROGRAMS[name]
    return [PYTHON3, program(argv[0])] + [a.format(port=port) for a in argv[1:]], files, ext


def _record_and_replay(name, port, tmp_path, n_replays, kill_server=None):
    cmd, files, ext = _cmd(name, port)
    work = tmp_path / "work"
    work.mkdir()
    trace = str(tmp_path / "trace")
    # no --external-port: a loopback server outside the replica's process tree is
    # classified external by the shim itself
    out, written = record(cmd, trace, str(work), files)
    assert out, "the program printed nothing"
    if kill_server:
        kill_server()
    for i in range(n_replays):
        p, rwritten = replay(trace, str(work), files)
        assert p.stdout == out, f"replay {i} stdout differs:\n{p.stdout.decode()}\n---\n{out.decode()}"
        assert rwritten == written, f"replay {i}: files differ"
    return out


PLAIN_RUNS_MAX = 6


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_plain_runs_differ(name, echo_port, tmp_path):
    # Some programs differ only by thread scheduling, which a quiet machine can repeat
    # once by chance: run until two outputs differ, up to PLAIN_RUNS_MAX runs.
    cmd, files, _ = _cmd(name, echo_port)
    seen = {repr(run_plain(cmd, str(tmp_path), files))}
    for _ in range(PLAIN_RUNS_MAX - 1):
        seen.add(repr(run_plain(cmd, str(tmp_path), files)))
        if len(seen) > 1:
            break
    assert len(seen) > 1, (f"{name}: {PLAIN_RUNS_MAX} plain runs gave the same output; "
                           "replay would prove nothing")


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_record_replay_identical(name, echo_port, tmp_path):
    _record_and_replay(name, echo_port, tmp_path, n_replays=2)


def test_external_replay_without_server(tmp_path):
    """The replay runs with the external server gone: its replies come from the trace."""
    proc, port = start_echo_server(str(tmp_path))

    def kill():
        proc.kill()
        proc.wait()

    try:
        out = _record_and_replay("ext_client", port, tmp_path, n_replays=2, kill_server=kill)
        assert b"request-4" in out
    finally:
        kill()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_record_replay_soak(name, echo_port, tmp_path, soak):
    _record_and_replay(name, echo_port, tmp_path, n_replays=3 if soak == "small" else 20)


def _replay_changed(tmp_path, name, old, new):
    """Record `name`, replay a copy with `old` replaced by `new`; (process, stderr)."""
    work = tmp_path / "w"
    work.mkdir()
    trace = str(tmp_path / "trace")
    record([PYTHON3, program(name)], trace, str(work))
    src = open(program(name)).read()
    assert old in src
    changed = tmp_path / name
    changed.write_text(src.replace(old, new, 1))
    p, _ = replay(trace, str(work), cmd=[PYTHON3, str(changed)], check=False)
    return p, p.stderr.decode()


def test_changed_program_is_a_divergence(tmp_path):
    """An extra clock read in the middle is reported, naming the first differing call."""
    p, err = _replay_changed(tmp_path, "clocks.py", 'print("monotonic", time.monotonic())',
                             'time.time()\nprint("monotonic", time.monotonic())')
    assert p.returncode == EXIT_DIVERGED, err
    assert "divergence: thread 0 call #" in err
    assert "the trace has clock_gettime(clock 1)" in err and "the program made clock_gettime(clock 0)" in err
    assert p.elapsed < 2.0, f"divergence took {p.elapsed:.2f}s to report"


def test_divergence_report_names_where_the_primary_made_the_call(tmp_path):
    """Recorded with LLFT_TRACE_WHERE=1, the trace keeps each call's Python location; the
    report then names the replaying thread's stack AND where the recording thread was."""
    import os
    work = tmp_path / "w"
    work.mkdir()
    trace = str(tmp_path / "trace")
    record([PYTHON3, program("clocks.py")], trace, str(work), env=dict(os.environ, LLFT_TRACE_WHERE="1"))
    src = open(program("clocks.py")).read()
    line = src.splitlines().index('print("monotonic", time.monotonic())') + 1
    changed = tmp_path / "clocks.py"
    changed.write_text(src.replace('print("monotonic", time.monotonic())',
                                   'time.time(); print("monotonic", time.monotonic())', 1))
    p, _ = replay(trace, str(work), cmd=[PYTHON3, str(changed)], check=False)
    err = p.stderr.decode()
    assert p.returncode == EXIT_DIVERGED, err
    assert "the program made clock_gettime(clock 0)" in err
    assert f"was made at clocks.py:{line} in <module>" in err, err       # the primary's side
    assert f'File "{changed}", line {line}' in err, err                   # the backup's stack


def test_changed_threaded_program_is_a_divergence(tmp_path):
    """A worker thread that takes an extra lock: reported with its logical thread id."""
    p, err = _replay_changed(tmp_path, "threads_locks.py", "        with rlock:\n            with rlock:",
                             "        with log_lock:\n            pass\n        with rlock:\n            with rlock:")
    assert p.returncode == EXIT_DIVERGED, err
    assert "divergence: thread " in err and "the program made sem_trywait(lock 0:" in err, err
    assert p.elapsed < 5.0


def test_replay_reports_a_stall_instead_of_hanging(tmp_path):
    """A thread waiting for its turn behind a call that never comes: a stall report."""
    src = tmp_path / "stall.py"
    src.write_text(
        "import os, threading, time\n"
        "lock = threading.Lock()\n"
        "r, wr = os.pipe()\n"
        "def w():\n"
        "    with lock: time.time()\n"
        "t = threading.Thread(target=w); t.start(); t.join()\n"
        "with lock: print('main got the lock')\n")
    work = tmp_path / "w"
    work.mkdir()
    trace = str(tmp_path / "trace")
    record([PYTHON3, str(src)], trace, str(work))
    # the changed worker blocks forever (on a pipe: not determinized, and it released
    # the GIL as the primary's worker did at the same point) before its lock: main,
    # joining it, waits in vain
    changed = tmp_path / "stall2.py"
    changed.write_text(src.read_text().replace(
        "    with lock: time.time()", "    os.read(r, 1)\n    with lock: time.time()"))
    p, _ = replay(trace, str(work), cmd=[PYTHON3, str(changed)], stall_ms=800, check=False)
    err = p.stderr.decode()
    assert p.returncode == EXIT_DIVERGED, err
    assert "stall: thread 0" in err and "waited 800 ms" in err, err
    assert p.elapsed < 10


def test_bash_and_java_run_under_record_and_replay(tmp_path):
    """bash and a JVM carry the shim preloaded but inactive, and run normally."""
    work = str(tmp_path)
    for cmd in (["bash", "-c", "echo hello $((6*7)); echo from-bash"],
                ["java", "-version"],
                ["bash", "-c", f"{PYTHON3} -c 'print(sorted({{3,1,2}}))'"]):
        trace = str(tmp_path / ("t" + str(abs(hash(tuple(cmd))))))
        out, _ = record(cmd, trace, work)
        p, _ = replay(trace, work)
        assert p.stdout == out
    shutil.rmtree(str(tmp_path / "w"), ignore_errors=True)


def test_external_server_replays_without_clients(tmp_path):
    """accept() of an external client: the replay gets the connection and the requests
    from the trace; nobody connects."""
    import socket
    import subprocess
    s = socket.socket()
    s.bind(("", 0))
    port = s.getsockname()[1]
    s.close()
    work = tmp_path / "w"
    work.mkdir()
    trace = str(tmp_path / "trace")
    client = subprocess.Popen([sys.executable, program("ext_server_client.py"), str(port)],
                              stdout=subprocess.PIPE)
    try:
        out, _ = record([PYTHON3, program("ext_server.py"), str(port)], trace, str(work))
    finally:
        client_out = client.communicate(timeout=30)[0]
    assert out.count(b"request hello-") == 3 and client_out.count(b"got hello-") == 3
    for _ in range(2):
        p, _ = replay(trace, str(work))
        assert p.stdout == out


def test_udp_external_client_without_server(tmp_path):
    """sendto/recvfrom on an unconnected UDP socket: external, replayed with the
    server gone; plain runs differ (the server adds a random token)."""
    proc, port = start_echo_server(str(tmp_path), "udp_echo_server.py")
    work = tmp_path / "w"
    work.mkdir()
    cmd = [PYTHON3, program("udp_client.py"), str(port)]
    try:
        assert run_plain(cmd, str(work)) != run_plain(cmd, str(work))
        out, _ = record(cmd, str(tmp_path / "trace"), str(work))
    finally:
        proc.kill()
        proc.wait()
    assert out.count(b"ping-") == 4
    for _ in range(2):
        p, _ = replay(str(tmp_path / "trace"), str(work))
        assert p.stdout == out


def test_load_average_is_recorded_input(tmp_path):
    """os.getloadavg() differs between replicas (libc reads /proc/loadavg through its own
    internal calls): the shim records the call, and a replay prints the recorded values."""
    from determinizer import orderinfo
    work = tmp_path / "work"
    work.mkdir()
    trace = str(tmp_path / "trace")
    out, _ = record([PYTHON3, program("loadavg.py")], trace, str(work))
    with open(f"{trace}/orderinfo.bin", "rb") as f:
        entries = orderinfo.decode(f.read())
    loads = [e for e in entries if e.call == orderinfo.Call.GETLOADAVG]
    assert len(loads) == 3 and all(len(e.data) == 3 * 8 and e.ret == 3 for e in loads)
    p, _ = replay(trace, str(work))
    assert p.stdout == out


def test_signal_that_interrupted_a_call_is_replayed(tmp_path):
    """SIGALRM interrupts epoll_wait at the primary (EINTR) and its handler raises. The
    record carries the signal; a backup raises it when it replays that call (its own
    timer's signal is dropped), so the handler's exception comes at the same point."""
    import signal
    from determinizer import orderinfo
    work = tmp_path / "work"
    work.mkdir()
    trace = str(tmp_path / "trace")
    out, _ = record([PYTHON3, program("signal_interrupt.py")], trace, str(work))
    assert out.startswith(b"interrupted after"), out
    with open(f"{trace}/orderinfo.bin", "rb") as f:
        entries = orderinfo.decode(f.read())
    interrupted = [e for e in entries if e.flags >> 8 == signal.SIGALRM]
    assert [e.call for e in interrupted] == [orderinfo.Call.EPOLL_WAIT] and interrupted[0].err == 4
    for _ in range(2):
        p, _ = replay(trace, str(work))
        assert p.stdout == out


def test_a_thread_that_interrupts_another_threads_blocking_write(tmp_path):
    """test_socketserver's test_write in small (tests/programs/thread_signal_write.py): the
    main thread's blocking 16 MB write to a peer in the process is interrupted by the
    peer's thread (pthread_kill). The write's count is recorded when it returns and carries
    the signal; a backup hands the bytes over without blocking, returns the primary's
    count and raises the signal there (its own pthread_kill is dropped). The main thread's
    signal to itself is not recorded: the backup's code sends it again."""
    import signal
    from determinizer import orderinfo
    work = tmp_path / "work"
    work.mkdir()
    trace = str(tmp_path / "trace")
    out, _ = record([PYTHON3, program("thread_signal_write.py")], trace, str(work))
    assert out == b"received 16777216 of 16777216 handlers ['usr1', 'usr2']\n", out
    with open(f"{trace}/orderinfo.bin", "rb") as f:
        entries = orderinfo.decode(f.read())
    carried = [(e.call, e.flags & 0xff) for e in entries if e.flags >> 8]
    writes = [e.ret for e in entries if e.call == orderinfo.Call.PRIVATE_RECV and e.flags & 1]
    assert carried == [(orderinfo.Call.PRIVATE_RECV, 1)], carried   # SIGUSR1 on a write's count
    assert sum(writes) == 16 * 1024 * 1024 and len(writes) >= 2, writes   # interrupted, resent
    assert not any(e.flags >> 8 == signal.SIGUSR2 for e in entries)
    for _ in range(3):
        p, _ = replay(trace, str(work))
        assert p.stdout == out


def test_ports_the_kernel_chose_are_the_primarys(tmp_path):
    """bind to port 0 (tests/programs/bound_ports.py: a loopback and a wildcard TCP server,
    a UDP socket) is an ordered call carrying the port the kernel chose; a backup binds to
    that port, so the digits the program sends its own threads (ftplib's PASV reply) and
    prints are the primary's."""
    import ast
    from determinizer import orderinfo
    work = tmp_path / "work"
    work.mkdir()
    trace = str(tmp_path / "trace")
    out, _ = record([PYTHON3, program("bound_ports.py")], trace, str(work))
    ports = ast.literal_eval(out.decode().split("ports ", 1)[1].split(" reply")[0])
    with open(f"{trace}/orderinfo.bin", "rb") as f:
        binds = [e for e in orderinfo.decode(f.read()) if e.call == orderinfo.Call.BIND]
    assert [e.aux for e in binds] == ports and all(e.ret == 0 for e in binds), binds
    for _ in range(2):
        p, _ = replay(trace, str(work))
        assert p.stdout == out


def test_a_native_thread_pool_replays(tmp_path):
    """tests/programs/native_pool.py: pyarrow's C++ thread pool (and jemalloc's background
    thread) working for the interpreter; record, replay twice: the same output (the wall
    clock included). The venv's interpreter: pyarrow is installed there."""
    cmd = [sys.executable, program("native_pool.py")]
    work = tmp_path / "work"
    work.mkdir()
    trace = str(tmp_path / "trace")
    out, _ = record(cmd, trace, str(work))
    assert b"pool" in out and b"sum" in out
    assert run_plain(cmd, str(tmp_path), []) != run_plain(cmd, str(tmp_path), [])
    for i in range(2):
        p, _ = replay(trace, str(work))
        assert p.stdout == out, f"replay {i}:\n{p.stdout.decode()}\n---\n{out.decode()}"


def _recording_of(cmd: list[str], trace: str, cwd: str):
    """`llft record` of `cmd` in a session of its own (a terminal's foreground job), once
    `cmd` printed "waiting" and sleeps in the kernel: (recorder, what it printed)."""
    import subprocess
    import psutil
    from polling import wait_for
    from rr_helpers import LLFT, private_tmp
    rec = subprocess.Popen(LLFT + ["record", "-q", "--trace", trace, "--"] + cmd, cwd=cwd,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           start_new_session=True,
                           env=private_tmp(None, trace.rstrip("/") + ".tmp"))
    out = b""
    while not out.endswith(b"waiting\n"):
        line = rec.stdout.readline()
        assert line, rec.stderr.read()
        out += line
    # the program itself (its launcher may exec it or not), asleep in the kernel
    app = [p for p in psutil.Process(rec.pid).children(recursive=True)
           if "until_stopped.py" in " ".join(p.cmdline())][-1]
    wait_for(lambda: app.status() == psutil.STATUS_SLEEPING, "the program asleep", 30)
    return rec, out


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_a_recording_stopped_by_ctrl_c_or_sigterm_is_a_whole_trace(tmp_path, how):
    """A server is recorded until its user stops it: Ctrl-C (SIGINT to the terminal's
    process group, recorder and command alike) or SIGTERM to the recorder (passed on).
    The command decides how to stop; the recorder completes the trace after it, exits
    with its status, and the trace replays to the same output, the signal included."""
    import json
    import os
    import signal
    work = tmp_path / "work"
    work.mkdir()
    trace = str(tmp_path / "trace")
    rec, first = _recording_of([PYTHON3, program("until_stopped.py")], trace, str(work))
    try:
        assert first.startswith(b"tick 1 "), first
        if how == "ctrl-c":
            os.killpg(rec.pid, signal.SIGINT)
        else:
            rec.send_signal(signal.SIGTERM)
        rest, err = rec.communicate(timeout=60)
    finally:
        if rec.poll() is None:
            # failed: the recorder's session goes too, SIGTERM first (the recorder passes
            # it on, completes its trace and unlinks its shared memory), then SIGKILL
            import subprocess
            from determinizer.shm import Shm
            os.killpg(rec.pid, signal.SIGTERM)
            try:
                rec.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(rec.pid, signal.SIGKILL)
                rec.wait()
                for path in Shm.paths_of(rec.pid):
                    os.unlink(path)
    out = first + rest
    assert rec.returncode == 0, err.decode()[-2000:]
    want = b"stopped by SIGINT" if how == "ctrl-c" else b"stopped by SIGTERM"
    assert out.splitlines()[-1].startswith(want), out[-300:]
    with open(os.path.join(trace, "meta.json")) as f:
        meta = json.load(f)
    assert meta["complete"] and meta["returncode"] == 0
    p, _ = replay(trace, str(work))
    assert p.stdout == out


def test_replay_of_what_is_no_whole_trace_says_so_in_one_line(tmp_path):
    """A folder without a trace, a trace without its order info, an unreadable meta.json:
    one line naming what is wrong, exit status 2, nothing started."""
    import subprocess
    from rr_helpers import LLFT
    (tmp_path / "empty").mkdir()
    (tmp_path / "no_oi").mkdir()
    (tmp_path / "no_oi" / "meta.json").write_text('{"cmd": ["true"], "env": {}, "cwd": "/"}')
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "meta.json").write_text("{not json")
    (tmp_path / "bad" / "orderinfo.bin").write_bytes(b"")
    for name, words in (("missing", "no such folder"), ("empty", "no meta.json"),
                        ("no_oi", "no orderinfo.bin"), ("bad", "unreadable")):
        p = subprocess.run(LLFT + ["replay", "--trace", str(tmp_path / name)],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and p.stderr.count("\n") == 1, (name, p.stderr)
        assert p.stderr.startswith("llft replay: ") and words in p.stderr, (name, p.stderr)
