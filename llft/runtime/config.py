"""Cluster configuration (TOML): what `llft run`, `llft gateway` and `llft status` read.

The minimal file (every other setting has a default):

    [cluster]
    key_file = "cluster.key"      # written by `llft keygen cluster.key`
    interface = "127.0.0.1"
    [group.counter]
    address = "239.255.0.1:47000"
    service_port = 9000

Everything else, with its default:

    [cluster]
    ttl = 1                       # multicast TTL (1: the local segment)
    runtime_dir = "/tmp/llft-<uid>"  # status files of the replicas of this host
    fault_timeout_ms = 100        # rank-2 backup suspects the primary after this
    heartbeat_ms = 20             # membership and messaging heartbeats (default:
                                  # fault_timeout_ms / 5)
    remote_timeout_ms = 3000      # a gateway silent this long is gone: its connection
                                  # (its clients' streams) reset at every replica
    log_cap_mib = 256             # the group's log kept for joiners (inputs + order info)
    log_cap_entries = 1048576     # ... and its order-info entries; past either, the group
                                  # admits no new replica (docs/LOG.md, "The log's cap")
    [group.counter]
    gateway_address = "239.255.0.1:47001"   # the group's gateway (default: port + 1)
    grpc_relay_port = 2xxxx       # loopback port of the app's gRPC relay (default: 20000 +
                                  # a hash of the group name; the same at every replica)

Why 100 ms and not the paper's ~30: an agent shares the machine with its application
(and, on a test box, with two more replicas on two cores); a primary whose agent is not
scheduled for 25 ms is, to its backups, a failed primary, and a false suspicion costs a
reset and a full rejoin. On a quiet machine `fault_timeout_ms = 25` detects in ~25 ms
(`llft bench failover` measures both). The value is a floor: each replica waits longer
for a peer whose heartbeats have been late before, by up to 3 x fault_timeout_ms
(membership/detector.py).

Why a heartbeat every fault_timeout_ms / 5: a detector then suspects a peer only after
four heartbeats in a row went missing (the ratio the membership simulator checks), and
an idle group costs what its heartbeats cost: every heartbeat is a Python event at every
member (one multicast send, a receive at each peer). At 5 ms with a 100 ms timeout an
idle agent of a 3-replica group used ~9 % of a core, at 20 ms ~4 %, with the same
failover times (docs/BENCHMARKS.md, "A quieter idle group"). A shorter timeout brings
shorter heartbeats with it.

Why remote_timeout_ms = 3000: a group whose gateway dies for good (its host lost) would
hold the gateway's connection, and with it the group watermark, forever: the other
gateways' connections then wait once their window is full. The primary takes a gateway
it has not heard for this long as gone. A live gateway speaks far more often (its
backed-off keep-alives: every 480 ms), and the other gateways' clients wait about this
long when one gateway's host dies. It applies to gateways only (groups of one): a
replicated group is never taken for gone, its backup takes over however long catching up
takes, and a gateway waits for the group it serves.

Relative paths (key_file, runtime_dir) are relative to the configuration file's folder.
Every fault is a `ConfigError` whose str() is one line naming the file and what to fix;
the commands print it and exit with status 2.
"""
from __future__ import annotations

import ipaddress
import os
import re
import socket
import tomllib
import zlib
from dataclasses import dataclass, field

from llft.runtime.transport import GroupAddress, GroupMap
from llft.protocol.messaging import MessagingConfig
from llft.replica.node import LOG_CAP_BYTES, LOG_CAP_ENTRIES

HEARTBEATS_PER_TIMEOUT = 5       # default heartbeat_ms = fault_timeout_ms / this
DEFAULT_FAULT_TIMEOUT_MS = 100.0
DEFAULT_REMOTE_TIMEOUT_MS = MessagingConfig().remote_timeout_us / 1000
# SIGTERM at a primary whose successor still replays the group's history: serve on this
# long at most for it to catch up (llft/runtime/agent.py `_hand_off`; docs/DESIGN.md,
# "A graceful stop"); as long as membership lets a replay hold a takeover
DEFAULT_HANDOFF_WAIT_S = 60.0


def default_heartbeat_ms(fault_timeout_ms: float) -> float:
    """heartbeat_ms when the file does not set it (the module docstring says why)."""
    return max(0.5, fault_timeout_ms / HEARTBEATS_PER_TIMEOUT)


GROUP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
GATEWAY_INFIX = ".gateway."


class ConfigError(Exception):
    """An unusable configuration; str() is one line saying what to fix."""


def lane_setting(native_built: bool, unbuilt: str) -> str:
    """`LLFT_LANE` (environment of `llft run` and `llft gateway`): what runs a process's
    steady messaging events -- `native` (the default: the C engines, native/lane/), their
    Python models (`python`) or the core alone (`off`); `native` is `unbuilt` where the C
    engines are not built. A bad value is a ConfigError (one line)."""
    kind = os.environ.get("LLFT_LANE", "native")
    if kind not in ("native", "python", "off"):
        raise ConfigError(f"LLFT_LANE={kind!r}: use native, python or off")
    return unbuilt if kind == "native" and not native_built else kind


@dataclass(frozen=True)
class GroupConfig:
    name: str
    address: GroupAddress
    service_port: int
    gateway_address: GroupAddress
    grpc_relay_port: int = 0

    @staticmethod
    def default_relay_port(name: str) -> int:
        """The same number at every replica of a group (the app's relayed gRPC channels
        name it: a promoted backup reconnects to its own host's relay there), outside
        Linux's ephemeral range (32768-60999)."""
        return 20000 + zlib.crc32(name.encode()) % 10000

    @property
    def gateway_family(self) -> str:
        """What the group ids of this group's gateways start with."""
        return self.name + GATEWAY_INFIX

    def gateway_group(self, instance: str) -> str:
        """The group id a gateway of this group uses on the wire: each gateway is a group
        of its own (clients on several hosts each run one), all at `gateway_address`."""
        return self.gateway_family + instance


@dataclass(frozen=True)
class ClusterConfig:
    path: str
    key_file: str
    interface: str
    ttl: int = 1
    runtime_dir: str = ""
    heartbeat_ms: float = default_heartbeat_ms(DEFAULT_FAULT_TIMEOUT_MS)
    fault_timeout_ms: float = DEFAULT_FAULT_TIMEOUT_MS
    remote_timeout_ms: float = DEFAULT_REMOTE_TIMEOUT_MS
    log_cap_bytes: int = LOG_CAP_BYTES
    log_cap_entries: int = LOG_CAP_ENTRIES
    handoff_wait_s: float = DEFAULT_HANDOFF_WAIT_S
    groups: dict[str, GroupConfig] = field(default_factory=dict)

    def group(self, name: str) -> GroupConfig:
        g = self.groups.get(name)
        if g is None:
            known = ", ".join(sorted(self.groups)) or "none"
            raise ConfigError(f"{self.path}: no [group.{name}] section (groups: {known})")
        return g

    def messaging_config(self, mtu_bytes: int, **overrides) -> MessagingConfig:
        """Messaging's bounds for an endpoint sending datagrams of `mtu_bytes`: the
        heartbeat of this file; a message's data as large as one datagram comfortably
        carries (one group connection carries every stream between two groups, so the
        replies of several clients share a message: 8 KB on loopback, about a frame of
        1 KB plus its headers on Ethernet), with the queue and a backup's log sized to
        the window of such messages. A message's order info (the piggyback: output
        commit holds a primary's replies while its backups lack more than that) may fill
        the rest of the datagram, and 16 KB at least (fragments off loopback): ~56 KB on
        loopback, where 16 KB held the replies of 16 echo clients 186 times for 5 ms each
        in a 3 s run (docs/BENCHMARKS.md, "Output commit held")."""
        payload = max(1024, min(8192, mtu_bytes - 256))
        window = overrides.get("window_msgs", MessagingConfig().window_msgs)
        kw = dict(heartbeat_us=max(500, int(self.heartbeat_ms * 1000)),
                  remote_timeout_us=int(self.remote_timeout_ms * 1000),
                  lone_groups=tuple(g.gateway_family for g in self.groups.values()),
                  max_piggyback_bytes=max(16 << 10, mtu_bytes - payload - 1024),
                  max_payload_bytes=payload, max_queue_bytes=max(256 << 10, 2 * payload),
                  max_log_bytes=max(1 << 20, 4 * window * payload))
        kw.update(overrides)
        return MessagingConfig(**kw)

    def group_map(self) -> GroupMap:
        """Addresses of every group and every gateway of the file."""
        gm = GroupMap()
        for g in self.groups.values():
            gm.set(g.name, g.address)
            gm.set_family(g.gateway_family, g.gateway_address)
        return gm

    def load_key(self) -> bytes:
        from llft.runtime import keys
        try:
            return keys.load_key(self.key_file)
        except keys.KeyFileError as e:
            raise ConfigError(f"{self.path}: [cluster] key_file: {e}") from None

    def status_dir(self, group: str) -> str:
        return os.path.join(self.runtime_dir, group)


def _address(path: str, where: str, text) -> GroupAddress:
    if not isinstance(text, str):
        raise ConfigError(f"{path}: {where} must be a string \"MCAST_IP:PORT\"")
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"{path}: {where} = {text!r}: expected \"MCAST_IP:PORT\", "
                          "e.g. \"239.255.0.1:47000\"")
    try:
        return GroupAddress(host, int(port))
    except ValueError as e:
        raise ConfigError(f"{path}: {where} = {text!r}: {e}") from None


def _number(path: str, where: str, value, lo: float, hi: float, integer: bool = False):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            integer and not isinstance(value, int)):
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"{path}: {where} must be {kind}, not {value!r}")
    if not lo <= value <= hi:
        raise ConfigError(f"{path}: {where} = {value} is outside [{lo}, {hi}]")
    return value


def _known_settings(path: str, where: str, table: dict, known: set[str]) -> None:
    bad = set(table) - known
    if bad:
        raise ConfigError(f"{path}: {where} unknown setting(s) {sorted(bad)}; "
                          f"known: {sorted(known)}")


CLUSTER_KEYS = {"key_file", "interface", "ttl", "runtime_dir", "heartbeat_ms",
                "fault_timeout_ms", "remote_timeout_ms", "log_cap_mib", "log_cap_entries",
                "handoff_wait_s"}
GROUP_KEYS = {"address", "service_port", "gateway_address", "grpc_relay_port"}


def load(path: str) -> ClusterConfig:
    """Read and check a configuration file (ConfigError on any fault)."""
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such configuration file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a configuration file") from None
    except PermissionError:
        raise ConfigError(f"{path}: not readable (permission denied)") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not valid TOML (not UTF-8 text)") from None
    return parse(raw, path)


def parse(raw: dict, path: str = "<config>") -> ClusterConfig:
    base = os.path.dirname(os.path.abspath(path))
    unknown = set(raw) - {"cluster", "group"}
    if unknown:
        raise ConfigError(f"{path}: unknown section(s) {sorted(unknown)}: "
                          "expected [cluster] and [group.NAME]")
    cl = raw.get("cluster")
    if not isinstance(cl, dict):
        raise ConfigError(f"{path}: missing [cluster] section (key_file, interface)")
    _known_settings(path, "[cluster]", cl, CLUSTER_KEYS)
    key_file = cl.get("key_file")
    if not isinstance(key_file, str) or not key_file:
        raise ConfigError(f"{path}: [cluster] key_file is required "
                          "(create one with `llft keygen cluster.key`)")
    interface = cl.get("interface", "127.0.0.1")
    try:
        ipaddress.IPv4Address(interface)
    except (ValueError, TypeError):
        raise ConfigError(f"{path}: [cluster] interface = {interface!r}: "
                          "expected the IPv4 address of a local interface") from None
    runtime_dir = cl.get("runtime_dir", f"/tmp/llft-{os.getuid()}")
    if not isinstance(runtime_dir, str) or not runtime_dir:
        raise ConfigError(f"{path}: [cluster] runtime_dir must be a folder path")
    groups_raw = raw.get("group")
    if not isinstance(groups_raw, dict) or not groups_raw:
        raise ConfigError(f"{path}: no group: add a [group.NAME] section "
                          "with address and service_port")
    groups: dict[str, GroupConfig] = {}
    seen: dict[tuple[str, int], str] = {}
    for name, g in groups_raw.items():
        where = f"[group.{name}]"
        if not GROUP_NAME.match(name):
            raise ConfigError(f"{path}: {where}: a group name is 1-63 letters, digits, "
                              "'_', '.', '-'")
        if not isinstance(g, dict):
            raise ConfigError(f"{path}: {where} must be a table")
        _known_settings(path, where, g, GROUP_KEYS)
        if "address" not in g:
            raise ConfigError(f"{path}: {where} address is required, "
                              "e.g. address = \"239.255.0.1:47000\"")
        if "service_port" not in g:
            raise ConfigError(f"{path}: {where} service_port is required (the TCP port "
                              "the application listens on)")
        addr = _address(path, f"{where} address", g["address"])
        port = _number(path, f"{where} service_port", g["service_port"], 1, 65535, True)
        if "gateway_address" in g:
            gw = _address(path, f"{where} gateway_address", g["gateway_address"])
        else:
            if addr.port >= 65535:
                raise ConfigError(f"{path}: {where} address port 65535 leaves no room "
                                  "for the default gateway_address (port + 1): set it")
            gw = GroupAddress(addr.mcast_addr, addr.port + 1)
        for a, what in ((addr, f"{where} address"), (gw, f"{where} gateway_address")):
            other = seen.get((a.mcast_addr, a.port))
            if other:
                raise ConfigError(f"{path}: {what} {a.mcast_addr}:{a.port} is also "
                                  f"{other}: each group and gateway needs its own")
            seen[(a.mcast_addr, a.port)] = what
        relay = (_number(path, f"{where} grpc_relay_port", g["grpc_relay_port"], 1, 65535, True)
                 if "grpc_relay_port" in g else GroupConfig.default_relay_port(name))
        groups[name] = GroupConfig(name, addr, int(port), gw, int(relay))
    timeout_ms = float(_number(path, "[cluster] fault_timeout_ms",
                               cl.get("fault_timeout_ms", DEFAULT_FAULT_TIMEOUT_MS), 2, 60_000))
    return ClusterConfig(
        path=path,
        key_file=os.path.join(base, key_file),
        interface=interface,
        ttl=int(_number(path, "[cluster] ttl", cl.get("ttl", 1), 0, 255, True)),
        runtime_dir=os.path.join(base, runtime_dir),
        heartbeat_ms=float(_number(path, "[cluster] heartbeat_ms",
                                   cl.get("heartbeat_ms", default_heartbeat_ms(timeout_ms)),
                                   0.5, 1000)),
        fault_timeout_ms=timeout_ms,
        remote_timeout_ms=float(_number(path, "[cluster] remote_timeout_ms",
                                        cl.get("remote_timeout_ms", DEFAULT_REMOTE_TIMEOUT_MS),
                                        1000, 3_600_000)),
        log_cap_bytes=int(_number(path, "[cluster] log_cap_mib",
                                  cl.get("log_cap_mib", LOG_CAP_BYTES >> 20), 1, 1 << 20,
                                  True)) << 20,
        log_cap_entries=int(_number(path, "[cluster] log_cap_entries",
                                    cl.get("log_cap_entries", LOG_CAP_ENTRIES), 1, 1 << 32,
                                    True)),
        handoff_wait_s=float(_number(path, "[cluster] handoff_wait_s",
                                     cl.get("handoff_wait_s", DEFAULT_HANDOFF_WAIT_S), 0,
                                     3600)),
        groups=groups)


def check_interface(cfg: ClusterConfig) -> None:
    """The interface must be an address of this host (a clear error, not a bind failure)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.bind((cfg.interface, 0))
    except OSError as e:
        raise ConfigError(f"{cfg.path}: [cluster] interface = {cfg.interface}: "
                          f"not an address of this host ({e.strerror})") from None
    finally:
        s.close()


def write_example(path: str, key_file: str, groups: dict[str, tuple[str, int]],
                  interface: str = "127.0.0.1", extra_cluster: str = "") -> None:
    """Write a configuration file (the demo, tests and benchmarks use this)."""
    lines = ["[cluster]", f'key_file = "{key_file}"', f'interface = "{interface}"']
    if extra_cluster:
        lines.append(extra_cluster)
    for name, (address, port) in groups.items():
        lines += ["", f"[group.{name}]", f'address = "{address}"', f"service_port = {port}"]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
