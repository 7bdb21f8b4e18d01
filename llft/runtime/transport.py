"""asyncio UDP multicast endpoints that carry llft datagrams.

Theory of operation
-------------------
A group id maps (`GroupMap`) to a multicast address and a port: the paper's virtual
port. All members of a group join its address on the configured interface (default
127.0.0.1: loopback multicast works when the sender sets IP_MULTICAST_IF to 127.0.0.1 and
receivers join on 127.0.0.1, SO_REUSEADDR, bound to the group's address and port). An
`Endpoint` listens to one or more groups (a replica: its own group) and sends to any
group in the map. Where multicast is not available a group may instead list its
members' unicast addresses (`GroupAddress.peers`): sending to the group then sends the
datagram to each peer, and each member listens on its own `unicast_bind` address.

Receive path: socket -> optional fault injection -> `wire.Decoder.decode` -> the
`on_message(Message)` callback, or `on_message_at(Message, at_us)` with the kernel's
receive time of the datagram (`ArrivalClock`): a process that was stopped or starved
handles what queued meanwhile later than it came, and what the cores stamp with the
time -- a remote primary last heard, which PROBE answers report -- must be when it
came. Nothing on it raises: bad datagrams are counted by the
decoder (`rejections`), callback exceptions are counted (`callback_errors`) and logged.
Send path: `wire.Encoder` (fragments to the MTU) -> optional fault injection -> socket.

Fault injection (`Faults`: drop, duplicate and delay probabilities from a seeded
`random.Random`) stands in for netem, which these machines lack; tests and demos put it
on the send path, the receive path, or both.

Multicast loss on one machine comes mostly from full socket buffers, so both buffers
are raised (SO_RCVBUFFORCE/SO_SNDBUFFORCE when root, else up to the sysctl maximum).

Datagram size: the encoder fragments a message to the MTU of the interface the endpoint
sends from (`interface_mtu_bytes`: the link's MTU less the IP and UDP headers), so on
loopback (MTU 65536) a reply with its piggybacked order info is one datagram, where the
Ethernet-sized default of 1400 bytes cut most of them in two; every datagram costs a
sendto that delivers it to each subscribed socket, and a receive at each of them.
This is the I/O layer: it reads the monotonic clock and hands `now_us` to the decoder.
"""
from __future__ import annotations

import asyncio
import ctypes
import fcntl
import hashlib
import ipaddress
import logging
import random
import socket
import struct
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable

from llft.protocol import wire
from llft.protocol.messages import Message, MsgType, stands_for_copies
from llft.runtime.pulse import MAX_WATCHES, LoopRepeater, PulseChannel

log = logging.getLogger(__name__)

DEFAULT_INTERFACE = "127.0.0.1"
DEFAULT_TTL = 1                       # stay on the local network segment
OWN_SENT_KEPT = 1024                  # own datagrams remembered to drop their echoes
DEFAULT_BUFFER_BYTES = 4 << 20        # SO_RCVBUF / SO_SNDBUF asked for
# Default virtual ports: a group id hashes into this range and into 239.255.0.0/16
# (administratively scoped multicast); `llft sniff` and the scapy layer look here.
PORT_BASE = 47100
PORT_SPAN = 800
MCAST_PREFIX = "239.255"
RECV_MAX_BYTES = 65536                # larger than any UDP/IPv4 datagram
DRAIN_BATCH = 64                      # datagrams taken per readiness callback
DRAIN_LIMIT = 4096                    # ... and before a timer (bounded: the loop goes on)
EXPIRE_INTERVAL_S = 0.5               # how often partial messages are checked for timeout

# Linux: the FORCE variants ignore rmem_max/wmem_max for CAP_NET_ADMIN (root here).
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
SO_SNDBUFFORCE = getattr(socket, "SO_SNDBUFFORCE", 32)


@dataclass(frozen=True)
class GroupAddress:
    """Where a group's datagrams go: a multicast address and port, or a peer list."""
    mcast_addr: str
    port: int
    peers: tuple[tuple[str, int], ...] = ()   # unicast fallback: each member's address

    def __post_init__(self):
        if not ipaddress.IPv4Address(self.mcast_addr).is_multicast:
            raise ValueError(f"{self.mcast_addr} is not an IPv4 multicast address")
        if not 0 < self.port < 65536:
            raise ValueError(f"bad port {self.port}")


def default_address(group: str, port_base: int = PORT_BASE,
                    port_span: int = PORT_SPAN) -> GroupAddress:
    """A stable address for `group` when the configuration names none."""
    h = hashlib.sha256(group.encode("utf-8")).digest()
    return GroupAddress(f"{MCAST_PREFIX}.{h[0]}.{max(h[1], 1)}",
                        port_base + int.from_bytes(h[2:4], "big") % port_span)


class GroupMap:
    """group id -> GroupAddress: configured groups, then families of groups sharing one
    address (every gateway of group G is `G.gateway.<instance>`), then `default_address`."""

    def __init__(self, addresses: dict[str, GroupAddress] | None = None, *,
                 port_base: int = PORT_BASE, port_span: int = PORT_SPAN):
        self._addresses = dict(addresses or {})
        self._families: dict[str, GroupAddress] = {}
        self.port_base, self.port_span = port_base, port_span

    def set(self, group: str, address: GroupAddress) -> None:
        self._addresses[group] = address

    def set_family(self, prefix: str, address: GroupAddress) -> None:
        """Every group whose id starts with `prefix` is at `address`."""
        self._families[prefix] = address

    def address(self, group: str) -> GroupAddress:
        addr = self._addresses.get(group)
        if addr is not None:
            return addr
        for prefix, addr in self._families.items():
            if group.startswith(prefix):
                return addr
        return default_address(group, self.port_base, self.port_span)

    def groups(self) -> list[str]:
        return list(self._addresses)

    @classmethod
    def parse(cls, text: str) -> "GroupMap":
        """'GROUP=MCAST:PORT,...' (the command-line form of tools and tests); a GROUP
        ending in '*' names a family (`set_family`): 'g.gateway.*=...'."""
        gm = cls()
        for item in filter(None, text.split(",")):
            group, sep, where = item.partition("=")
            host, _, port = where.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"bad group address {item!r}: expected GROUP=MCAST:PORT")
            if group.endswith("*"):
                gm.set_family(group[:-1], GroupAddress(host, int(port)))
            else:
                gm.set(group, GroupAddress(host, int(port)))
        return gm


def interface_mtu_bytes(interface: str) -> int:
    """The UDP payload that fits one IP packet on the link whose address is `interface`
    (its MTU less 28 bytes of IPv4 and UDP headers), within the wire format's bounds;
    the Ethernet-sized default when the link cannot be found."""
    try:
        import psutil
        for name, addrs in psutil.net_if_addrs().items():
            if any(a.family == socket.AF_INET and a.address == interface for a in addrs):
                st = psutil.net_if_stats().get(name)
                if st is not None and st.mtu > 0:
                    return max(wire.MIN_MTU_BYTES, min(st.mtu - 28, wire.MAX_DATAGRAM_BYTES))
    except Exception:   # noqa: BLE001 -- no reading: the safe default
        pass
    return wire.DEFAULT_MTU_BYTES


@dataclass
class Faults:
    """Seeded per-datagram faults: each datagram is dropped, or sent once or twice
    (duplicate), each copy possibly delayed by a uniform draw from `delay_us`."""
    drop: float = 0.0
    duplicate: float = 0.0
    delay: float = 0.0
    delay_us: tuple[int, int] = (100, 5_000)
    seed: int = 0
    rng: random.Random = field(init=False, repr=False)

    def __post_init__(self):
        self.rng = random.Random(self.seed)

    def plan(self) -> list[float]:
        """Delays (seconds) of the copies to deliver: [] drop, [0.0] as is, two: dup."""
        if self.drop and self.rng.random() < self.drop:
            return []
        copies = 2 if self.duplicate and self.rng.random() < self.duplicate else 1
        out = []
        for _ in range(copies):
            if self.delay and self.rng.random() < self.delay:
                out.append(self.rng.uniform(*self.delay_us) / 1e6)
            else:
                out.append(0.0)
        return out


async def wait_for_event(event: asyncio.Event, predicate: Callable[[], bool],
                         timeout_s: float) -> bool:
    """Wait until `predicate()` holds, re-checking each time `event` is set (whoever
    sets it: a received datagram, a driver's pump); False on timeout. No polling."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        remaining = deadline - loop.time()
        if remaining <= 0:
            return False
        event.clear()
        try:
            await asyncio.wait_for(event.wait(), remaining)
        except asyncio.TimeoutError:
            return predicate()
    return True


def _set_buffer(sock: socket.socket, force_opt: int, opt: int, nbytes: int) -> int:
    try:
        sock.setsockopt(socket.SOL_SOCKET, force_opt, nbytes)
    except OSError:                         # not root: the kernel caps it at *mem_max
        sock.setsockopt(socket.SOL_SOCKET, opt, nbytes)
    return sock.getsockopt(socket.SOL_SOCKET, opt)


def pulse_address(addr: GroupAddress) -> GroupAddress:
    """Where a group's heartbeats go (llft/runtime/pulse.py): its port, at its multicast
    address with the lowest bit of the second byte flipped (239.255.a.b -> 239.254.a.b:
    still administratively scoped). Not a port of its own: the gateway takes the next
    one (config.py), and sockets bound to different group addresses never share
    datagrams."""
    a, b, c, d = addr.mcast_addr.split(".")
    return GroupAddress(f"{a}.{int(b) ^ 1}.{c}.{d}", addr.port)


PULSE_RCVBUF_BYTES = 256 << 10        # heartbeats only: a few hundred bytes each
PULSE_SOURCES_KEPT = 64               # the native table's size too (llft_pulse.c)


def multicast_receive_socket(addr: GroupAddress, interface: str,
                             rcvbuf_bytes: int) -> socket.socket:
    """A socket bound to the group's address and port, joined on `interface`."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        _set_buffer(s, SO_RCVBUFFORCE, socket.SO_RCVBUF, rcvbuf_bytes)
        # Binding to the group address (not INADDR_ANY) keeps other groups that share
        # the port out of this socket.
        s.bind((addr.mcast_addr, addr.port))
        mreq = struct.pack("4s4s", socket.inet_aton(addr.mcast_addr),
                           socket.inet_aton(interface))
        s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)
        s.setblocking(False)
    except BaseException:
        s.close()
        raise
    return s


SIOCGSTAMPNS = 0x8907                 # linux/sockios.h: the last datagram's receive time
ARRIVAL_RESYNC_NS = 1_000_000_000     # realtime -> monotonic offset refreshed this often
ARRIVAL_MAX_AGE_US = 60_000_000       # an older stamp is not believed (a clock step)


class ArrivalClock:
    """When the datagram just read from a socket reached it, on the monotonic clock:
    SIOCGSTAMPNS reads the receive timestamp the kernel wrote for it (the first call
    on a socket, `enable`, turns the stamps on), which is CLOCK_REALTIME; the offset to
    the monotonic clock is refreshed every ARRIVAL_RESYNC_NS. ~1.4 µs a datagram."""

    def __init__(self) -> None:
        self._offset_ns = 0
        self._synced_ns = -ARRIVAL_RESYNC_NS

    @staticmethod
    def enable(sock: socket.socket) -> None:
        try:
            fcntl.ioctl(sock.fileno(), SIOCGSTAMPNS, bytes(16))
        except OSError:
            pass                        # ENOENT: on, nothing received yet

    def arrival_us(self, sock: socket.socket) -> int | None:
        try:
            sec, nsec = struct.unpack("ll", fcntl.ioctl(sock.fileno(), SIOCGSTAMPNS,
                                                         bytes(16)))
        except OSError:
            return None
        mono = time.monotonic_ns()
        if mono - self._synced_ns >= ARRIVAL_RESYNC_NS:
            self._resync(mono)
        at_us = (sec * 1_000_000_000 + nsec - self._offset_ns) // 1000
        age_us = mono // 1000 - at_us
        if age_us < 0 and self._synced_ns != mono:
            # a stamp from the future: the realtime clock was slewed or stepped since the
            # offset was taken (on this VM it was, and most of a run's stamps were lost)
            self._resync(mono)
            at_us = (sec * 1_000_000_000 + nsec - self._offset_ns) // 1000
            age_us = mono // 1000 - at_us
        return at_us if 0 <= age_us < ARRIVAL_MAX_AGE_US else None

    def _resync(self, mono: int) -> None:
        self._offset_ns = time.time_ns() - mono
        self._synced_ns = mono


SO_ATTACH_FILTER = 26                 # linux/asm-generic/socket.h
SKF_NET_OFF = -0x100000               # linux/filter.h: classic BPF offset of the IP header


def drop_datagrams_from(sock: socket.socket, src: tuple[str, int]) -> bool:
    """Make the kernel drop datagrams from `src` (ip, port) before they reach `sock`:
    a classic BPF socket filter. With multicast loop on, every multicast of ours comes
    back to our own receive socket; dropped here it wakes nobody (at an idle agent a
    third of its input). A UDP socket's filter sees the datagram from its UDP header
    (offset 0: source port) and the IPv4 header at SKF_NET_OFF. False where the kernel
    refuses it (the endpoint then drops the echoes itself, after receiving them)."""
    ip = struct.unpack("!I", socket.inet_aton(src[0]))[0]
    prog = [(0x28, 0, 0, 0),                                # ldh [0]: source port
            (0x15, 0, 3, src[1]),                           # jeq port ? next : accept
            (0x20, 0, 0, (SKF_NET_OFF + 12) & 0xFFFFFFFF),  # ld [net 12]: source address
            (0x15, 0, 1, ip),                               # jeq ip ? drop : accept
            (0x06, 0, 0, 0),                                # drop
            (0x06, 0, 0, 0xFFFFFFFF)]                       # accept all of it
    code = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *i) for i in prog))
    fprog = struct.pack("HxxxxxxQ", len(prog), ctypes.addressof(code))
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
    except OSError:
        return False
    return True


def send_socket(interface: str, ttl: int, loop: bool, sndbuf_bytes: int,
                bind: tuple[str, int] | None = None) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
    try:
        _set_buffer(s, SO_SNDBUFFORCE, socket.SO_SNDBUF, sndbuf_bytes)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(interface))
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, ttl)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, int(loop))
        s.bind(bind or (interface, 0))
        s.setblocking(False)
    except BaseException:
        s.close()
        raise
    return s


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, endpoint: "Endpoint", sock: socket.socket):
        self.endpoint = endpoint
        self.sock = sock

    def datagram_received(self, data: bytes, addr) -> None:
        self.endpoint._on_datagram(data, self.endpoint._arrival_us(self.sock))
        # asyncio reads one datagram per readiness: take what else is queued now, so a
        # backlog is not worked off one loop iteration (and one round of timers) each
        self.endpoint.drain_input(DRAIN_BATCH)

    def error_received(self, exc: Exception) -> None:
        self.endpoint.counters["socket_errors"] += 1


class Endpoint:
    """One replica's network attachment: listens to `listen` groups, sends to any.

    `on_message(msg)` is called from the event loop for each accepted message.
    `counters`: sent_messages, sent_datagrams, send_errors, received_datagrams (off the
    socket), processed_datagrams (given to the decoder, after receive faults),
    accepted_messages, own_messages, callback_errors, socket_errors, and per side
    (send/recv) dropped_*, duplicated_*, delayed_* from fault injection. Rejections by
    reason are `rejections` (the decoder's Counter of wire.Reject); `stats()` has both.
    """

    def __init__(self, key: bytes, listen: str | Iterable[str],
                 on_message: Callable[[Message], None], *,
                 groups: GroupMap | None = None, interface: str = DEFAULT_INTERFACE,
                 ttl: int = DEFAULT_TTL, multicast_loop: bool = True,
                 mtu_bytes: int | None = None,
                 unicast_bind: tuple[str, int] | None = None,
                 send_faults: Faults | None = None, recv_faults: Faults | None = None,
                 rcvbuf_bytes: int = DEFAULT_BUFFER_BYTES,
                 sndbuf_bytes: int = DEFAULT_BUFFER_BYTES,
                 clock_us: Callable[[], int] | None = None, birth_id: int | None = None,
                 decoder: wire.Decoder | None = None, encoder: wire.Encoder | None = None,
                 pulse: bool = False, pulse_native: bool = True):
        self.listen_groups = [listen] if isinstance(listen, str) else list(listen)
        self.on_message = on_message
        # a heartbeat's arrival time matters to a detector (the pulse thread reads its
        # socket up to an interval late): the Driver takes them, (msg, at_us)
        self.on_message_at: Callable[[Message, int], None] | None = None
        # a whole datagram offered before it is decoded (a native steady lane: it
        # verifies and handles the steady ones itself); True: taken, nothing more to do
        self.on_datagram: Callable[[bytes, int | None], bool] | None = None
        self.groups = groups or GroupMap()
        self.interface, self.ttl, self.multicast_loop = interface, ttl, multicast_loop
        self.unicast_bind = unicast_bind
        self.send_faults, self.recv_faults = send_faults, recv_faults
        self.rcvbuf_bytes, self.sndbuf_bytes = rcvbuf_bytes, sndbuf_bytes
        self.clock_us = clock_us or (lambda: time.monotonic_ns() // 1000)
        # kernel receive times, on our clock when it is the monotonic one
        self._arrivals = ArrivalClock() if clock_us is None else None
        self.decoder = decoder or wire.make_decoder(key, self.listen_groups)
        if isinstance(self.decoder, wire.DifferentialDecoder):
            self.decoder.on_divergence = self._on_wire_divergence
        # unchecked encoding (no pack/unpack/parse round trip per message): the simulator
        # checks every message the cores build; receivers still reject a bad one
        # (mtu_bytes None: the interface's, see interface_mtu_bytes)
        if mtu_bytes is None:
            mtu_bytes = interface_mtu_bytes(interface)
        self.encoder = encoder or wire.Encoder(key, mtu_bytes=mtu_bytes, check=False)
        # With multicast loop on (needed for replicas sharing one host) a replica hears
        # its own multicasts; given its birth id, the endpoint drops those echoes.
        self.birth_id = birth_id
        self.counters: Counter[str] = Counter()
        # messages by type (status: sent_<TYPE>, accepted_<TYPE>): what a chatty group says
        self.sent_by_type: Counter = Counter()
        self.accepted_by_type: Counter = Counter()
        self._own_sent: dict[bytes, None] = {}   # our latest datagrams, oldest first
        self.own_filtered = False       # the kernel drops our echoes (drop_datagrams_from)
        self.rcvbuf_actual_bytes = 0
        self._send_transport: asyncio.DatagramTransport | None = None
        self._recv_transports: list[asyncio.DatagramTransport] = []
        self._input_socks: list[socket.socket] = []     # read by drain_input too
        self._progress: asyncio.Event | None = None
        self._expire_handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        # heartbeats of our (first) group on its pulse port (llft/runtime/pulse.py), if
        # `pulse` and the group is multicast; otherwise Pulses are repeated on the loop
        self.pulse_group = self.listen_groups[0] if pulse and self.listen_groups else None
        if self.pulse_group is not None and self.groups.address(self.pulse_group).peers:
            self.pulse_group = None
        self.pulse_native = pulse_native
        self._pulse: PulseChannel | None = None
        self._pulse_msgs: dict[int, Message] = {}   # source -> its last heartbeat
        self.on_watch: Callable[[], None] | None = None   # a silence watch passed
        self._repeater: LoopRepeater | None = None  # Pulses without a channel
        self._pulse_last: tuple[Message | None, list[bytes]] = (None, [])
        for group in self.listen_groups:
            if self.groups.address(group).peers and unicast_bind is None:
                raise ValueError(f"group {group!r} uses unicast peers: "
                                 "listening to it needs unicast_bind (this member's address)")

    # -- life cycle ------------------------------------------------------------------
    async def start(self) -> "Endpoint":
        self._loop = asyncio.get_running_loop()
        self._progress = asyncio.Event()
        try:
            socks = []
            for group in self.listen_groups:
                addr = self.groups.address(group)
                if not addr.peers:
                    socks.append(multicast_receive_socket(addr, self.interface,
                                                          self.rcvbuf_bytes))
            send_bind = None
            if self.unicast_bind is not None:
                # In unicast mode one socket both receives (peers send to it) and sends.
                send_bind = self.unicast_bind
            ssock = send_socket(self.interface, self.ttl, self.multicast_loop,
                                self.sndbuf_bytes, send_bind)
            if send_bind is not None:
                _set_buffer(ssock, SO_RCVBUFFORCE, socket.SO_RCVBUF, self.rcvbuf_bytes)
            self.rcvbuf_actual_bytes = min(
                [s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) for s in socks]
                or [0])
            for s in socks:
                ArrivalClock.enable(s)
                t, _ = await self._loop.create_datagram_endpoint(
                    lambda s=s: _Protocol(self, s), sock=s)
                self._recv_transports.append(t)
            self._input_socks = socks + ([ssock] if send_bind is not None else [])
            src = ssock.getsockname()
            self.own_filtered = (self.multicast_loop and bool(socks) and
                                 all(drop_datagrams_from(s, src) for s in socks))
            ArrivalClock.enable(ssock)
            self._send_transport, _ = await self._loop.create_datagram_endpoint(
                lambda: _Protocol(self, ssock), sock=ssock)
            if self.pulse_group is not None:
                self._start_pulse()
        except BaseException:
            self.close()
            raise
        self._repeater = LoopRepeater(self._loop, self.clock_us)
        self._schedule_expire()
        return self

    def _start_pulse(self) -> None:
        paddr = pulse_address(self.groups.address(self.pulse_group))
        rsock = multicast_receive_socket(paddr, self.interface, PULSE_RCVBUF_BYTES)
        try:
            ssock = send_socket(self.interface, self.ttl, self.multicast_loop,
                                PULSE_RCVBUF_BYTES)
        except BaseException:
            rsock.close()
            raise
        if self.multicast_loop:
            drop_datagrams_from(rsock, ssock.getsockname())     # our own copies
        self._pulse = PulseChannel(rsock, ssock, (paddr.mcast_addr, paddr.port),
                                   self._on_pulse_datagram, self.clock_us,
                                   native=self.pulse_native)
        self._pulse.on_watch = lambda: self.on_watch is not None and self.on_watch()
        self._pulse.start(self._loop)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True
        self._input_socks = []
        if self._pulse is not None:
            self._pulse.close()
            self._pulse = None
        if self._repeater is not None:
            self._repeater.stop()
        if self._expire_handle is not None:
            self._expire_handle.cancel()
            self._expire_handle = None
        for t in self._recv_transports:
            t.close()
        self._recv_transports.clear()
        if self._send_transport is not None:
            self._send_transport.close()
            self._send_transport = None

    async def __aenter__(self) -> "Endpoint":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        self.close()

    # -- the runtime's view of the decoder ---------------------------------------------
    def set_view(self, group: str, pvn: int) -> None:
        self.decoder.set_view(group, pvn)

    @property
    def rejections(self) -> Counter:
        return self.decoder.rejections

    # -- sending ---------------------------------------------------------------------
    def send(self, dst_group: str, msg: Message) -> int:
        """Multicast `msg` to `dst_group`'s virtual port; returns datagrams sent.
        Raises wire.WireError for a message that cannot be packed or is oversized (a
        local bug); other malformed messages are rejected by their receivers."""
        datagrams = self.encoder.encode(msg)
        self.counters["sent_messages"] += 1
        self.sent_by_type[msg.type] += 1
        if self._pulse is not None and dst_group == self.pulse_group \
                and msg.type is MsgType.HEARTBEAT:
            self._pulse.send_once(datagrams)        # heartbeats: on the pulse port
            return len(datagrams)
        own = (self.birth_id is not None and msg.sender == self.birth_id
               and dst_group in self.listen_groups and not self.own_filtered)
        for d in datagrams:
            if own:
                # multicast loops our own datagrams back: recognised by their bytes, they
                # are dropped before HMAC and decoding (a third of an idle agent's input)
                self._own_sent[d] = None
                if len(self._own_sent) > OWN_SENT_KEPT:
                    del self._own_sent[next(iter(self._own_sent))]
            self.send_datagram(dst_group, d)
        return len(datagrams)

    def send_datagrams(self, dst_group: str, datagrams: list[bytes]) -> None:
        """Multicast datagrams sealed elsewhere (a native steady lane's messages)."""
        self.counters["sent_messages"] += len(datagrams)
        self.counters["lane_sent_datagrams"] += len(datagrams)
        for d in datagrams:
            self.send_datagram(dst_group, d)

    def pulse(self, dst_group: str, msg: Message | None, every_us: int,
              until_us: int, lease_us: int = 0) -> None:
        """Carry out a `messages.Pulse`: send `msg` now and repeat its bytes every
        `every_us` until `until_us` while the loop lives (`lease_us`; None: stop)."""
        if msg is None:
            datagrams = []
        elif msg == self._pulse_last[0]:
            datagrams = self._pulse_last[1]     # a quiet refresh: the same bytes
        else:
            datagrams = self.encoder.encode(msg)
            self._pulse_last = (msg, datagrams)
        if msg is not None:
            self.counters["sent_messages"] += 1
            self.sent_by_type[msg.type] += 1
        if self._pulse is not None and dst_group == self.pulse_group:
            self._pulse.repeat(datagrams, every_us, until_us, lease_us)
            return
        def send(ds: list[bytes]) -> None:
            for d in ds:
                self.send_datagram(dst_group, d)
        self._repeater.repeat(send, datagrams, every_us, until_us)  # no channel: the loop

    @property
    def watches_silence(self) -> bool:
        """Whether `watch` can hand silence deadlines to the pulse thread."""
        return self._pulse is not None and self._pulse.watches

    def watch(self, watches: list[tuple[int, int, int]]) -> int | None:
        """Silence watches of the core, (sender, heard_us, deadline_us) each, to the
        pulse thread (`PulseChannel.watch`), which follows the sender's heartbeat copies
        (its pulse source: where its accepted heartbeats came from). Returns the
        earliest deadline it cannot watch (no source known for the sender, or beyond
        the thread's table), for the caller's own timer; None if none."""
        held, rest = [], None
        # (the latest heartbeat's source wins: `_pulse_msgs` is kept in order of use)
        src_of = {m.sender: s for s, m in self._pulse_msgs.items()} if watches else {}
        for birth, heard, deadline in watches:
            src = src_of.get(birth)
            if src is None or len(held) == MAX_WATCHES:
                rest = deadline if rest is None else min(rest, deadline)
            else:
                held.append((src, heard, deadline))
        self._pulse.watch(tuple(held), self.clock_us())
        return rest

    def read_pulse(self) -> None:
        """What waits on the pulse socket, read now (`PulseChannel.poll`): before a
        message is judged as evidence about a peer's silence."""
        if self._pulse is not None:
            self._pulse.poll()

    def take_absorbed(self) -> list[tuple[Message, list[int]]]:
        """The heartbeat copies the pulse thread absorbed since the last call: (the
        message they repeat, their arrival times). The driver hands them to its core
        before each event (`heard_again`)."""
        if self._pulse is None:
            return []
        got = self._pulse.arrivals()
        if not got:
            return []
        msgs = self._pulse_msgs
        return [(msgs[src], times) for src, times in got.items() if src in msgs]

    def send_datagram(self, dst_group: str, data: bytes) -> None:
        """Send raw bytes to a group (fault injection applies); tests use it for fuzz."""
        addr = self.groups.address(dst_group)
        targets = addr.peers or ((addr.mcast_addr, addr.port),)
        plan = self.send_faults.plan() if self.send_faults else [0.0]
        if not plan:
            self.counters["dropped_send"] += 1
            return
        self.counters["duplicated_send"] += len(plan) - 1
        for delay_s in plan:
            for target in targets:
                if delay_s:
                    self.counters["delayed_send"] += 1
                    self._loop.call_later(delay_s, self._sendto, data, target)
                else:
                    self._sendto(data, target)

    def _sendto(self, data: bytes, target: tuple[str, int]) -> None:
        if self._send_transport is None:    # closed while a delayed copy waited
            return
        try:
            self._send_transport.sendto(data, target)
            self.counters["sent_datagrams"] += 1
        except OSError:
            self.counters["send_errors"] += 1

    # -- receiving -------------------------------------------------------------------
    def drain_input(self, limit: int = DRAIN_LIMIT, sockets: bool = True) -> int:
        """Process up to `limit` datagrams already queued on our sockets; how many.
        The driver calls it before a timer: a timer decides on silence (a peer is
        suspected, a backup removed), so what arrived meanwhile must be heard first --
        after a busy spell the socket may hold heartbeats that are not late at all.
        `sockets` False: only what the pulse thread queued (the loop's selector just
        found the sockets empty)."""
        n = self._pulse.drain(limit) if self._pulse is not None else 0
        for s in self._input_socks if sockets else ():
            while n < limit and not self._closed:
                try:
                    data = s.recv(RECV_MAX_BYTES)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    self.counters["socket_errors"] += 1
                    break
                n += 1
                self._on_datagram(data, self._arrival_us(s))
        return n

    def _arrival_us(self, sock: socket.socket) -> int | None:
        """The kernel's receive time of the datagram just read from `sock` (None when
        our clock is not the monotonic one it is converted to, or it is unknown)."""
        return self._arrivals.arrival_us(sock) if self._arrivals is not None else None

    def _on_datagram(self, data: bytes, at_us: int | None = None) -> None:
        self.counters["received_datagrams"] += 1
        plan = self.recv_faults.plan() if self.recv_faults else [0.0]
        if not plan:
            self.counters["dropped_recv"] += 1
        self.counters["duplicated_recv"] += max(len(plan) - 1, 0)
        for delay_s in plan:
            if delay_s:
                self.counters["delayed_recv"] += 1
                self._loop.call_later(delay_s, self._process, data)
            else:
                self._process(data, at_us)
        self._progress.set()

    def _process(self, data: bytes, at_us: int | None = None) -> None:
        if self._closed:                    # a delayed copy outlived the endpoint
            return
        self.counters["processed_datagrams"] += 1
        if data in self._own_sent:
            del self._own_sent[data]
            self.counters["own_messages"] += 1
            return
        if self.on_datagram is not None and self.on_datagram(data, at_us):
            self.counters["lane_datagrams"] += 1
            self._progress.set()
            return
        msg = self._decode(data)
        if msg is not None:
            self._deliver(msg, at_us)
        self._progress.set()

    def _on_wire_divergence(self, err: wire.WireDivergence) -> None:
        """LLFT_WIRE=differential: the codec's two halves judged a datagram apart (a bug
        in one of them); the reference's verdict stands, and it is loud."""
        self.counters["wire_divergences"] += 1
        log.error("llft transport: the wire codec's halves differ (LLFT_WIRE=differential): %s",
                  err)

    def _decode(self, data: bytes) -> Message | None:
        msg = self.decoder.decode(data, self.clock_us())
        if msg is None and self._expire_handle is None and self.decoder.partial_messages:
            self._schedule_expire()
        return msg

    def _deliver(self, msg: Message, at_us: int | None = None) -> None:
        """An accepted message to the owner (`at_us`: when it came, if the owner takes
        that: `on_message_at`); our own echoes are only counted."""
        if self.birth_id is not None and msg.sender == self.birth_id:
            self.counters["own_messages"] += 1
            return
        self.counters["accepted_messages"] += 1
        self.accepted_by_type[msg.type] += 1
        try:
            if at_us is not None and self.on_message_at is not None:
                self.on_message_at(msg, at_us)
            else:
                self.on_message(msg)
        except Exception:   # noqa: BLE001 -- one bad handler must not stop the socket
            self.counters["callback_errors"] += 1
            log.exception("llft transport: on_message raised")

    def _on_pulse_datagram(self, data: bytes, src: int, at_us: int) -> None:
        """A datagram of the pulse port the thread did not absorb: handled as any (at
        its arrival time, `on_message_at`, when the owner takes one), and if it is
        authentic its copies are absorbed from now on."""
        if self._closed:
            return
        self.counters["received_datagrams"] += 1
        self.counters["processed_datagrams"] += 1
        rejected = self.decoder.rejected_total()
        msg = self._decode(data)
        if self.decoder.rejected_total() == rejected and stands_for_copies(
                msg, self._pulse_msgs.get(src)):
            self._pulse.accept(src, data)
            if msg is not None:
                self._pulse_msgs.pop(src, None)
                self._pulse_msgs[src] = msg
                if len(self._pulse_msgs) > PULSE_SOURCES_KEPT:     # peers come and go
                    del self._pulse_msgs[next(iter(self._pulse_msgs))]
        if msg is None:
            return
        self._deliver(msg, at_us)
        self._progress.set()

    def _schedule_expire(self) -> None:
        """Partial messages are checked for their timeout while there are any (an idle
        endpoint is not woken for nothing)."""
        def tick():
            self._expire_handle = None
            self.decoder.expire(self.clock_us())
            self._schedule_expire()
        if (self._expire_handle is None and self.decoder.partial_messages
                and self._loop is not None and not self._loop.is_closed()):
            self._expire_handle = self._loop.call_later(EXPIRE_INTERVAL_S, tick)

    async def wait_until(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Wait (without polling) until `predicate()` holds after some datagram was
        handled; False on timeout. For tests, demos and `llft status`-style tools."""
        return await wait_for_event(self._progress, predicate, timeout_s)

    def stats(self) -> dict[str, int]:
        """Counters and rejections by reason, flat, for status displays."""
        out = dict(self.counters)
        if self._pulse is not None:
            out.update(self._pulse.stats())
        out.update({f"rejected_{r.value}": n for r, n in self.decoder.rejections.items()})
        out["partial_messages"] = self.decoder.partial_messages
        out.update({f"sent_{t.name}": n for t, n in self.sent_by_type.items()})
        out.update({f"accepted_{t.name}": n for t, n in self.accepted_by_type.items()})
        out["wire_native"] = int(self.decoder.native)
        if isinstance(self.decoder, wire.DifferentialDecoder):    # LLFT_WIRE=differential
            out["wire_divergences"] = self.counters["wire_divergences"]
        return out
