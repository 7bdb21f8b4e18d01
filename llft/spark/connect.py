"""`llft spark-connect start|stop|status`: a Spark Connect server from the pyspark wheel.

Spark Connect drivers are thin clients (`SparkSession.builder.remote("sc://host:port")`)
of a shared Spark. The pyspark wheel ships the server (`sbin/start-connect-server.sh`,
the jar `spark-connect_*.jar`); this command runs it next to a group the way the wheel's
scripts do, with what a test or an operator needs on top:

- it listens on `--host` (127.0.0.1 by default: `spark.connect.grpc.binding.address`;
  the script's default is every interface) and `--port` (15002);
- `start` returns once the port accepts connections (or exits 1 with the tail of the
  server's log if the JVM died first), and says where the log is;
- `stop` runs the wheel's stop script, then waits for the JVM and every process it
  started to be gone (SIGKILL after `--stop-timeout`): nothing is left behind;
- several servers coexist, one per port (the pid file is named after the port);
- no Java: one line saying what to install, exit 2.

State (pid and log files) lives under `--dir` (default `~/.llft/spark-connect`), and so
do the server's temporary folders (`tmp/llft-PORT`: the JVM's java.io.tmpdir and Spark's
local dirs, emptied at start and removed at stop: a server killed outright leaves its
`blockmgr-*` and `artifacts-*` there, not in /tmp).

A Connect driver under `llft run` is replicated through its agent's gRPC relay
(determinizer/grpcrelay/): the replicas share this server, only the primary's calls
reach it, backups read the answers from the order information (README, "Spark Connect
drivers").
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time

import psutil

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
DEFAULT_PORT = 15002
DEFAULT_DIR = os.path.join(os.path.expanduser("~"), ".llft", "spark-connect")
START_GRACE_S = 3.0     # the script has written the pid file; no JVM after this: it died


class ConnectError(Exception):
    """A server could not be started or found (the message says what to do)."""


def spark_home() -> str:
    import pyspark
    home = os.path.dirname(pyspark.__file__)
    if not os.path.exists(os.path.join(home, "sbin", "start-connect-server.sh")):
        raise ConnectError(f"this pyspark ({home}) has no sbin/start-connect-server.sh: "
                           "install pyspark>=4.0")
    return home


def java_missing(env: dict[str, str]) -> str | None:
    """Why no Java can run (None: one can)."""
    jh = env.get("JAVA_HOME")
    if jh and os.access(os.path.join(jh, "bin", "java"), os.X_OK):
        return None
    if shutil.which("java", path=env.get("PATH", os.defpath)):
        return None
    return ("no Java found (neither $JAVA_HOME/bin/java nor java on PATH): install a "
            "Java 17+ runtime (Debian: apt-get install default-jre-headless; "
            "scripts/setup.sh does it)")


class Server:
    """One Spark Connect server, named by its port, with its files under `state_dir`."""

    def __init__(self, port: int = DEFAULT_PORT, host: str = "127.0.0.1",
                 state_dir: str = DEFAULT_DIR):
        self.port, self.host, self.state_dir = port, host, state_dir
        self.ident = f"llft-{port}"

    @property
    def pid_file(self) -> str:
        return os.path.join(self.state_dir, "pids", f"spark-{self.ident}-{SERVER_CLASS}-1.pid")

    @property
    def log_file(self) -> str:
        return os.path.join(self.state_dir, "logs",
                            f"spark-{self.ident}-{SERVER_CLASS}-1-{socket.gethostname()}.out")

    @property
    def tmp_dir(self) -> str:
        return os.path.join(self.state_dir, "tmp", self.ident)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        opts = env.get("SPARK_SUBMIT_OPTS")
        env.update(SPARK_HOME=spark_home(), SPARK_IDENT_STRING=self.ident,
                   SPARK_PID_DIR=os.path.join(self.state_dir, "pids"),
                   SPARK_LOG_DIR=os.path.join(self.state_dir, "logs"),
                   SPARK_LOCAL_DIRS=self.tmp_dir,
                   SPARK_SUBMIT_OPTS=f"-Djava.io.tmpdir={self.tmp_dir}"
                   + (f" {opts}" if opts else ""),
                   PYSPARK_PYTHON=env.get("PYSPARK_PYTHON", sys.executable))
        return env

    def pid(self) -> int | None:
        """The server's JVM, if it runs."""
        try:
            with open(self.pid_file) as f:
                pid = int(f.read().strip())
        except (OSError, ValueError):
            return None
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE and SERVER_CLASS in " ".join(p.cmdline()):
                return pid
        except psutil.Error:
            pass
        return None

    def accepting(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=1):
                return True
        except OSError:
            return False

    def url(self) -> str:
        return f"sc://{self.host}:{self.port}"

    def start(self, *, master: str = "local[*]", timeout_s: float = 180.0,
              conf: list[str] = ()) -> int:
        """Start it (or find it running); return the JVM's pid once the port accepts."""
        env = self.env()
        why = java_missing(env)
        if why:
            raise ConnectError(why)
        running = self.pid()
        if running is not None and self.accepting():
            return running
        os.makedirs(env["SPARK_PID_DIR"], exist_ok=True)
        os.makedirs(env["SPARK_LOG_DIR"], exist_ok=True)
        shutil.rmtree(self.tmp_dir, ignore_errors=True)   # a killed server's leftovers
        os.makedirs(self.tmp_dir)
        args = ["bash", os.path.join(env["SPARK_HOME"], "sbin", "start-connect-server.sh"),
                "--master", master,
                "--conf", f"spark.connect.grpc.binding.address={self.host}",
                "--conf", f"spark.connect.grpc.binding.port={self.port}"]
        for c in conf:
            args += ["--conf", c]
        r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise ConnectError(f"start-connect-server.sh exited {r.returncode}: "
                               f"{(r.stderr or r.stdout).strip()[-500:]}")
        started = time.monotonic()
        deadline = started + timeout_s
        while True:
            pid = self.pid()
            if pid is not None and self.accepting():
                return pid
            if pid is None and time.monotonic() - started > START_GRACE_S:
                raise ConnectError(f"the server exited before listening on {self.host}:"
                                   f"{self.port}; its log ({self.log_file}) ends:\n"
                                   + self.log_tail())
            if time.monotonic() > deadline:
                self.stop()
                raise ConnectError(f"not listening on {self.host}:{self.port} after "
                                   f"{timeout_s:.0f} s (stopped); log: {self.log_file}")
            time.sleep(0.2)     # polling the port and the JVM, with a deadline

    def log_tail(self, n: int = 20) -> str:
        try:
            with open(self.log_file, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return "(no log)"

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Stop it and everything it started; False if none was running."""
        pid = self.pid()
        if pid is None:
            return False
        try:
            jvm = psutil.Process(pid)
            tree = [jvm] + jvm.children(recursive=True)
        except psutil.Error:
            tree = []
        env = self.env()
        subprocess.run(["bash", os.path.join(env["SPARK_HOME"], "sbin",
                                             "stop-connect-server.sh")],
                       env=env, capture_output=True, timeout=60)
        _gone, alive = psutil.wait_procs(tree, timeout=timeout_s)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=10)
        try:
            os.unlink(self.pid_file)
        except OSError:
            pass
        shutil.rmtree(self.tmp_dir, ignore_errors=True)
        return True


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["start", "stop", "status"])
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--host", default="127.0.0.1",
                   help="address the server listens on (default: loopback only)")
    p.add_argument("--dir", default=DEFAULT_DIR, help="pid and log files")
    p.add_argument("--master", default="local[*]", help="the server's Spark master")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="more Spark configuration (repeatable)")
    p.add_argument("--timeout", type=float, default=180.0,
                   help="start: seconds to wait for the port")


def run(args) -> int:
    server = Server(args.port, args.host, args.dir)
    try:
        if args.action == "start":
            pid = server.start(master=args.master, timeout_s=args.timeout, conf=args.conf)
            print(f"spark connect server: pid {pid}, {server.url()}, log {server.log_file}")
            return 0
        if args.action == "stop":
            print("stopped" if server.stop() else "not running")
            return 0
        pid = server.pid()
        if pid is None:
            print(f"not running (port {args.port})")
            return 1
        state = "accepting" if server.accepting() else "not accepting yet"
        print(f"spark connect server: pid {pid}, {server.url()} ({state}), "
              f"log {server.log_file}")
        return 0
    except ConnectError as e:
        print(f"llft spark-connect: {e}", file=sys.stderr)
        return 2
