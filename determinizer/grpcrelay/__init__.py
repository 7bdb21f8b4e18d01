"""gRPC clients of a replicated app, without gRPC in the app: a relay makes the calls.

    env = relay_env(env, ("127.0.0.1", port))   # the app's grpc.insecure_channel is relayed
    relay = Relay(port=0)                        # relay.address; relay.stop()

channel.py: the in-app channel; relay.py: the relay process; frames.py: their format;
site/sitecustomize.py: the hook that installs the channel. docs in determinizer/README.md.
"""
from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import sys
import threading

SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "site")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _python_path_first(env: dict[str, str], folder: str) -> dict[str, str]:
    """A copy of `env` whose PYTHONPATH starts with `folder`."""
    env = dict(env)
    env["PYTHONPATH"] = os.pathsep.join([folder] + ([env["PYTHONPATH"]]
                                                    if env.get("PYTHONPATH") else []))
    return env


def relay_env(env: dict[str, str], relay: tuple[str, int]) -> dict[str, str]:
    """`env` for an app whose gRPC channels `relay` serves."""
    before = env.get("PYTHONPATH")
    env = _python_path_first(env, SITE_DIR)
    if before is not None:                            # sitecustomize puts it back
        env["LLFT_PYTHONPATH_BEFORE"] = before
    env["LLFT_GRPC_RELAY"] = f"{relay[0]}:{relay[1]}"
    return env


class Relay:
    """A relay for the apps this process starts: its port is bound now, its process
    (relay.py, which imports grpcio: ~0.3 s) starts when the first connection waits, so
    apps that make no gRPC call cost a socket. The process dies with this one.

    `reuse_port`: several relays share the port (SO_REUSEPORT), so every replica of a
    group on one host can bind the group's relay port: any of them serves any app.
    `proc.pid`: the process, once started; `stop()` ends it and closes the port."""

    def __init__(self, port: int = 0, reuse_port: bool = False, host: str = "127.0.0.1",
                 spawning=contextlib.nullcontext, started=lambda pid: None,
                 reaped=lambda pid: None):
        """`spawning()` is held around a start, `started(pid)` called within it,
        `reaped(pid)` once its exit status is taken (a subreaping agent: proctree's
        spawning, own and disown)."""
        self._spawning, self._started, self._reaped = spawning, started, reaped
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            self.sock.bind((host, port))
            self.sock.listen(socket.SOMAXCONN)
        except OSError as e:
            self.sock.close()
            raise OSError(e.errno, f"the gRPC relay cannot listen on {host}:{port}: "
                          f"{e.strerror}") from None
        self.host, self.port = host, self.sock.getsockname()[1]
        self.proc: subprocess.Popen | None = None   # the latest process started
        self.starts = 0
        self._stop_r, self._stop_w = os.pipe()
        self._watch = threading.Thread(target=self._start_when_needed, daemon=True,
                                       name="grpc-relay-watch")
        self._watch.start()

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    def _start_when_needed(self) -> None:
        """The watch thread: start the process when a connection waits, then stay: the
        process dies with this thread (PR_SET_PDEATHSIG names the spawning thread). A
        process that dies (killed with an app's tree, say) is started again when the
        next connection waits: the port never holds connections nobody accepts."""
        cmd = [sys.executable, "-m", "determinizer.grpcrelay.relay",
               "--fd", str(self.sock.fileno()), "--parent", str(os.getpid())]
        env = _python_path_first(os.environ, ROOT)
        while True:
            ready, _, _ = select.select([self.sock, self._stop_r], [], [])
            if self._stop_r in ready:
                return
            with self._spawning():
                proc = subprocess.Popen(cmd, env=env, pass_fds=(self.sock.fileno(),),
                                        stdin=subprocess.DEVNULL)
                self._started(proc.pid)
            self.proc, self.starts = proc, self.starts + 1
            exited = os.pidfd_open(proc.pid)
            try:
                ready, _, _ = select.select([self._stop_r, exited], [], [])
            finally:
                os.close(exited)
            if self._stop_r in ready:
                proc.terminate()
            proc.wait()                               # died (or stopped): reaped
            self._reaped(proc.pid)
            if self._stop_r in ready:
                return

    def stop(self) -> None:
        os.write(self._stop_w, b"x")
        self._watch.join()
        self.sock.close()
        os.close(self._stop_r)
        os.close(self._stop_w)
