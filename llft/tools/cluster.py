"""A local replicated service: replicas (`llft run`), a gateway, status, kills.

The demo, the end-to-end tests and the benchmarks all start groups through this class,
so they exercise exactly the commands a user runs:

    with LocalCluster(workdir, group="counter", service_port=9000) as lc:
        lc.start_replica("r1", ["python", "examples/kv_counter.py", "9000"])
        lc.wait_members(1)
        lc.start_replica("r2", ...); lc.wait_members(2)
        host, port = lc.start_gateway()
        ...
        lc.kill_primary()                  # SIGKILL the primary's agent (its app dies too)
        lc.wait_primary(other_than=old)    # a backup took over

Every wait polls `llft status`'s reading of the status files (llft/runtime/status.py) with a
deadline; nothing sleeps for a fixed time. Addresses are fresh random loopback multicast
groups, so concurrent runs do not collide.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

from llft.runtime import config as config_mod
from llft.runtime import keys
from llft.tools.procs import read_event
from llft.runtime.status import group_status, read_files

POLL_S = 0.01


class ClusterError(RuntimeError):
    pass


class LocalCluster:
    def __init__(self, workdir: str, group: str = "counter", service_port: int = 9000,
                 extra_cluster: str = "", env: dict[str, str] | None = None):
        """`env`: the environment of every process it starts (default: this one's)."""
        self.workdir = os.path.abspath(workdir)
        self.env = env
        os.makedirs(self.workdir, exist_ok=True)
        self.group = group
        rng = random.Random(os.getpid() ^ time.monotonic_ns())
        port = rng.randrange(20000, 60000, 2)
        self.key_path = os.path.join(self.workdir, "cluster.key")
        if not os.path.exists(self.key_path):
            keys.write_key(self.key_path)
        self.config_path = os.path.join(self.workdir, "cluster.toml")
        mcast = f"239.255.{rng.randrange(1, 255)}.{rng.randrange(1, 255)}"
        self._groups = {group: (f"{mcast}:{port}", service_port)}
        self._extra = 'runtime_dir = "run"' + ("\n" + extra_cluster if extra_cluster else "")
        config_mod.write_example(self.config_path, "cluster.key", self._groups,
                                 extra_cluster=self._extra)
        self.cfg = config_mod.load(self.config_path)
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, str] = {}
        self.replicas: list[str] = []       # names start_replica started

    # ---- processes ----------------------------------------------------------------------
    def _start(self, name: str, argv: list[str], stdout=subprocess.DEVNULL) -> subprocess.Popen:
        log = os.path.join(self.workdir, f"{name}.log")
        self.logs[name] = log
        err = open(log, "ab")
        p = subprocess.Popen(argv, stdout=stdout, stderr=err, stdin=subprocess.DEVNULL,
                             cwd=self.workdir, env=self.env)
        err.close()
        self.procs[name] = p
        return p

    def llft_argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "llft", *args]

    def config_for(self, interface: str) -> str:
        """The cluster's configuration with another `interface` (a replica in a network
        namespace: llft/tools/netns.py); same key, groups and status directory."""
        path = os.path.join(self.workdir, f"cluster-{interface}.toml")
        config_mod.write_example(path, "cluster.key", self._groups, interface=interface,
                                 extra_cluster=self._extra)
        return path

    def start_replica(self, name: str, cmd: list[str], config_path: str | None = None,
                      wrap=lambda argv: argv) -> subprocess.Popen:
        """`wrap`: the command line around `llft run` (e.g. `ip netns exec NS ...`)."""
        if name not in self.replicas:
            self.replicas.append(name)
        return self._start(name, wrap(self.llft_argv(
            "run", "--config", config_path or self.config_path,
            "--group", self.group, "--", *cmd)))

    def start_service(self, names: tuple[str, ...], cmd: list[str]) -> tuple[str, int]:
        """Replicas `names` of `cmd` started in the same instant (as users do), then the
        gateway once all are members running their applications; its address."""
        for name in names:
            self.start_replica(name, cmd)
        self.wait_members(len(names), timeout_s=120)
        return self.start_gateway(timeout_s=60)

    def start_gateway(self, name: str = "gateway", timeout_s: float = 30,
                      config_path: str | None = None, port: int = 0) -> tuple[str, int]:
        """A gateway on 127.0.0.1:`port` (0: a free one); its address once ready. (Its
        group id follows the address: one started again on the port of a dead one takes
        up its id, llft/runtime/gateway.py `gateway_instance`.)"""
        p = self._start(name, self.llft_argv("gateway", "--config",
                                             config_path or self.config_path,
                                             "--group", self.group,
                                             "--listen", f"127.0.0.1:{port}"),
                        stdout=subprocess.PIPE)
        ev = read_event(p, "ready", timeout_s)
        if ev is None:
            if p.poll() is not None:
                raise ClusterError(f"gateway exited {p.returncode}: {self.log_tail(name)}")
            raise ClusterError(f"gateway not ready in {timeout_s} s: {self.log_tail(name)}")
        host, port = ev["listen"]
        return host, int(port)

    def log_tail(self, name: str, n: int = 3000) -> str:
        try:
            with open(self.logs[name], "rb") as f:
                return f.read().decode(errors="replace")[-n:]
        except (KeyError, OSError):
            return ""

    def alive(self, name: str) -> bool:
        p = self.procs.get(name)
        return p is not None and p.poll() is None

    def kill(self, name: str, sig=signal.SIGKILL, timeout_s: float = 30) -> None:
        p = self.procs[name]
        if p.poll() is None:
            p.send_signal(sig)
        p.wait(timeout=timeout_s)

    def name_of(self, agent_pid: int) -> str | None:
        return next((n for n, p in self.procs.items() if p.pid == agent_pid), None)

    def stop(self, timeout_s: float = 10) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None:
            # a failing test's report shows what the group was doing when it gave up
            # (its temporary folder is gone by the time anyone reads a CI log)
            try:
                print(self.diagnosis(), file=sys.stderr)
            except Exception as e:              # noqa: BLE001 (never mask the failure)
                print(f"(no diagnosis: {e!r})", file=sys.stderr)
        self.stop()

    def diagnosis(self, lines: int = 12, width: int = 2000) -> str:
        """Each process's state and log tail, each live status file in one line."""
        out = ["--- LocalCluster diagnosis ---"]
        for name, p in self.procs.items():
            rc = p.poll()
            out.append(f"[{name}] pid {p.pid} {'running' if rc is None else f'exited {rc}'}")
            out += ["  " + ln[:300] for ln in self.log_tail(name).splitlines()[-lines:]]
        agents, gateways, _ = read_files(self.cfg.status_dir(self.group))
        for st in agents + gateways:
            first = ("kind", "role", "pvn", "connections_open", "streams", "clients",
                     "connections", "messaging", "counters")
            st = {**{k: st[k] for k in first if k in st},
                  **{k: v for k, v in st.items() if k not in ("events", "members")}}
            out.append("status " + json.dumps(st, separators=(",", ":"), default=str)[:width])
        return "\n".join(out)

    # ---- status ---------------------------------------------------------------------------
    def status(self) -> dict:
        return group_status(self.cfg, self.group)

    def wait_status(self, predicate, timeout_s: float, what: str,
                    replicas_needed: int = 0) -> dict:
        """`replicas_needed`: fail at once, not at the deadline, when fewer of the
        replicas started are running (an agent that exited at start, a wrong command)."""
        deadline = time.monotonic() + timeout_s
        while True:
            st = self.status()
            if predicate(st):
                return st
            gone = [n for n in self.replicas if not self.alive(n)]
            if len(self.replicas) - len(gone) < replicas_needed:
                raise ClusterError(
                    f"waiting for {what}: only {len(self.replicas) - len(gone)} of the "
                    f"replicas started run; " + "; ".join(
                        f"{n} exited {self.procs[n].returncode}: "
                        + (self.log_tail(n, 400).strip().splitlines() or ["(no log)"])[-1]
                        for n in gone))
            if time.monotonic() > deadline:
                raise ClusterError(f"timed out after {timeout_s} s waiting for {what}; "
                                   f"status: {json.dumps(st)[:2000]}")
            time.sleep(POLL_S)          # polling status files, with a deadline

    def wait_members(self, n: int, timeout_s: float = 60) -> dict:
        """n members in the view, each running its application (backups replaying)."""
        return self.wait_status(
            lambda st: len(st["members"]) == n and all(
                m["app_pid"] and m["app_mode"] in ("primary", "backup")
                for m in st["members"]),
            timeout_s, f"{n} members with running applications", replicas_needed=n)

    def wait_ready(self, n: int, timeout_s: float = 60) -> dict:
        """n members, every backup caught up with the history it joined with
        (`llft status` sync "ready"): a backup stuck "catching-up" waits a longer
        detector timeout and cannot take over first."""
        return self.wait_status(
            lambda st: len(st["members"]) == n and all(
                m["app_pid"] and m["sync"] in ("primary", "ready") for m in st["members"]),
            timeout_s, f"{n} members, every backup ready", replicas_needed=n)

    def primary(self) -> dict | None:
        st = self.status()
        return next((m for m in st["members"] if m["role"] == "primary"), None)

    def primary_delivered_bytes(self) -> int:
        """Input bytes the primary's agent delivered to its app (load progress)."""
        p = self.primary()
        return (p or {}).get("counters", {}).get("delivered_bytes", 0)

    def wait_primary(self, other_than: int | None = None, timeout_s: float = 30) -> dict:
        st = self.wait_status(
            lambda st: any(m["role"] == "primary" and m["birth"] != other_than
                           and m["app_mode"] == "primary" for m in st["members"]),
            timeout_s, "a (new) primary with a promoted application")
        return next(m for m in st["members"] if m["role"] == "primary")

    def kill_primary(self) -> dict:
        p = self.primary()
        if p is None:
            raise ClusterError("no primary to kill")
        name = self.name_of(p["agent_pid"])
        if name is None:
            raise ClusterError(f"primary agent pid {p['agent_pid']} is not ours")
        self.kill(name)
        p["name"] = name
        return p
