"""A private L2 segment of network namespaces, whose links a test cuts and heals.

    with Segment(3) as seg:                 # needs root and `ip` (Segment.available())
        seg.ns[0], seg.addr[0]              # "llft-3fa2c1-0", "10.213.87.1"
        seg.host_addr                       # the root namespace's address on the segment
        seg.argv(0, [python, "-m", "llft", "run", ...])   # run it inside namespace 0
        seg.cut(0); ...; seg.heal(0)

The layout (a bridge and one veth pair per namespace):

    root namespace                       namespace llft-ID-i (i = 0..n-1)
    bridge llbID  10.213.X.254/24  ---   vpi (veth) 10.213.X.(i+1)/24, lo up,
      port vbIDi  <-- veth pair -->      route 224.0.0.0/4 dev vpi (the group's multicast)

The bridge lives in the root namespace and carries an address there, so a process of the
root namespace (the gateway, with `interface = host_addr`) joins the groups' multicast on
the segment while the test's clients reach it on 127.0.0.1. X is random in 1..254 and
the names carry a random ID, so concurrent tests do not collide (X is one no address of
the root namespace uses); nothing but the namespaces, the veths and the bridge this class
made is touched.

The bridge is made with multicast snooping off: with snooping on and no IGMP querier,
a port re-attached after a cut would receive no group traffic until its members re-sent
their IGMP reports (they never do without a querier): the heal would not heal.

`cut(i)` detaches namespace i's bridge-side port from the bridge (`ip link set vbIDi
nomaster`); `heal(i)` attaches it again. Why not the link down, or netem: taking the
namespace's own veth down deletes its routes (the multicast route does not come back on
up) and makes its sends fail with ENETUNREACH, a different fault from a partition;
detaching the port keeps every link, address and route of the namespace unchanged: its
datagrams leave and are dropped at the detached port, nothing arrives: exactly a cable
pulled out of a switch. Links stay up, so nothing in the namespace sees a carrier change.

Teardown (`close`, also on an exception inside the `with`): delete the namespaces (which
deletes their veths, and with them the bridge-side ends) and the bridge. Processes still
running inside a namespace keep it alive (the kernel frees it when the last one exits):
stop them first (LocalCluster.stop, in an inner `with`). `leftovers()` lists this
segment's names still present, for a test's no-leftovers check.
"""
from __future__ import annotations

import os
import random
import shutil
import subprocess

BRIDGE_PREFIX = "llb"
NS_PREFIX = "llft-"


class NetnsError(RuntimeError):
    pass


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {p.stderr.strip() or p.returncode}")
    return p


def available() -> str | None:
    """None when namespaces can be made here; else why not (a test's skip reason)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    name = f"{NS_PREFIX}probe-{os.getpid()}"
    p = _ip("netns", "add", name, check=False)
    if p.returncode != 0:
        return f"cannot create a network namespace: {p.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return None


class Segment:
    def __init__(self, n: int, rng: random.Random | None = None) -> None:
        rng = rng or random.Random(os.getpid() ^ int.from_bytes(os.urandom(4), "big"))
        ident = f"{rng.randrange(16 ** 6):06x}"
        in_use = _ip("-o", "addr", "show", check=False).stdout
        subnet = rng.choice([x for x in range(1, 255) if f" 10.213.{x}." not in in_use])
        self.bridge = f"{BRIDGE_PREFIX}{ident}"                   # <= 15 chars (IFNAMSIZ)
        self.ns = [f"{NS_PREFIX}{ident}-{i}" for i in range(n)]
        self.ports = [f"vb{ident}{i}" for i in range(n)]        # bridge side of veth i
        self.inner = "vp0"                                      # inside each namespace
        self.addr = [f"10.213.{subnet}.{i + 1}" for i in range(n)]
        self.host_addr = f"10.213.{subnet}.254"
        self._made: list[tuple[str, str]] = []                   # ("netns"|"link", name)
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge", "mcast_snooping", "0")
        self._made.append(("link", self.bridge))
        _ip("addr", "add", f"{self.host_addr}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for ns, port, addr in zip(self.ns, self.ports, self.addr):
            _ip("netns", "add", ns)
            self._made.append(("netns", ns))
            _ip("link", "add", port, "type", "veth", "peer", "name", self.inner, "netns", ns)
            self._made.append(("link", port))
            _ip("link", "set", port, "master", self.bridge, "up")
            inside = ("-n", ns)
            _ip(*inside, "link", "set", "lo", "up")
            _ip(*inside, "addr", "add", f"{addr}/24", "dev", self.inner)
            _ip(*inside, "link", "set", self.inner, "up")
            _ip(*inside, "route", "add", "224.0.0.0/4", "dev", self.inner)

    # ---- use -------------------------------------------------------------------------------
    def argv(self, i: int, argv: list[str]) -> list[str]:
        """argv run inside namespace i (`ip netns exec` execs it: same pid, same files)."""
        return ["ip", "netns", "exec", self.ns[i], *argv]

    def cut(self, i: int) -> None:
        """Namespace i loses the segment (its bridge port detached); nothing else changes."""
        _ip("link", "set", self.ports[i], "nomaster")

    def heal(self, i: int) -> None:
        _ip("link", "set", self.ports[i], "master", self.bridge)

    def is_cut(self, i: int) -> bool:
        return f"master {self.bridge}" not in _ip("-o", "link", "show", self.ports[i]).stdout

    # ---- teardown --------------------------------------------------------------------------
    def leftovers(self) -> list[str]:
        present = set(_ip("netns", "list", check=False).stdout.split())
        links = _ip("-o", "link", "show", check=False).stdout
        out = [ns for ns in self.ns if ns in present]
        out += [name for name in (self.bridge, *self.ports) if f" {name}:" in links
                or f" {name}@" in links]
        return out

    def close(self) -> None:
        """Delete everything this segment made (namespaces first: that takes their veths)."""
        errors = []
        for kind, name in reversed(self._made):
            if kind == "netns":
                p = _ip("netns", "del", name, check=False)
            else:
                p = _ip("link", "del", name, check=False)
                if p.returncode != 0 and "Cannot find device" in p.stderr:
                    continue                    # a veth gone with its namespace
            if p.returncode != 0:
                errors.append(f"{kind} {name}: {p.stderr.strip()}")
        self._made.clear()
        if errors:
            raise NetnsError("teardown: " + "; ".join(errors))

    def __enter__(self) -> "Segment":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
