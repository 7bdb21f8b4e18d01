"""`llft sniff`: decode live llft traffic, one line per datagram.

Theory of operation
-------------------
scapy captures UDP on an interface (default `lo`; capturing needs root) and keeps the
datagrams addressed to our ports (one `--port`, or the transport's default virtual-port
range). Each datagram is described by `describe()`, a pure function also used by tests:
its fixed header (wire.peek), its message header fields decoded strictly
(wire.unpack_payload; a payload the decoder would refuse is shown with the reason), and,
given the cluster key, whether its tag verifies. Fragments are shown as such; with a key
they also feed a promiscuous wire.Decoder, and the fragment that completes a message
shows that message. Nothing is filtered with BPF (no tcpdump/libpcap needed).
"""
from __future__ import annotations

import argparse
import sys
import time

from llft.runtime import transport
from llft.protocol import wire
from llft.runtime.keys import KeyFileError, load_key
from llft.protocol.messages import Message, Role


def _message_line(msg: Message) -> str:
    return (f"{msg.type.name} {msg.src_group}>{msg.dst_group} "
            f"conn={msg.conn_seq}/{Role(msg.role).name.lower()} pvn={msg.pvn} "
            f"msn={msg.msn} ack={msg.ack} ts={msg.ts}")


def describe(data: bytes, key: bytes | None = None,
             decoder: wire.Decoder | None = None, now_us: int = 0) -> str:
    """One line describing an llft datagram (never raises)."""
    size = len(data)
    p = wire.peek(data)
    if p is None or p.magic != wire.MAGIC:
        return f"not llft ({'short' if p is None else 'bad magic'}) size={size}"
    mac = "-" if key is None else ("ok" if wire.verify_tag(key, data) else "bad")
    tail = f"size={size} mac={mac}"
    if p.version not in wire.SUPPORTED_VERSIONS:
        return f"llft version {p.version} (unsupported) {tail}"
    if p.kind == wire.KIND_FRAGMENT:
        line = f"FRAGMENT {p.sender:#x}/{p.frag_id} {p.index + 1}/{p.count} {tail}"
        if decoder is not None and mac == "ok":
            msg = decoder.decode(data, now_us)
            if msg is not None:
                line += f" -> {_message_line(msg)}"
        return line
    if p.kind != wire.KIND_WHOLE:
        return f"llft kind {p.kind} (unknown) {tail}"
    try:
        msg = wire.unpack_payload(p.data, p.version)
    except wire.WireError as e:
        return f"invalid payload ({e.reason.value}) {tail}"
    except Exception as e:      # noqa: BLE001 -- a sniffer describes, it never dies
        return f"undecodable payload ({type(e).__name__}) {tail}"
    return f"{_message_line(msg)} {tail}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    last_port = transport.PORT_BASE + transport.PORT_SPAN - 1
    parser.add_argument("--iface", default="lo", help="interface to capture on (lo)")
    parser.add_argument("--port", type=int, default=None,
                        help="UDP port to decode (default: the virtual-port range "
                             f"{transport.PORT_BASE}-{last_port})")
    parser.add_argument("--count", type=int, default=0, help="stop after N datagrams")
    parser.add_argument("--key", default=None, help="cluster key file: check tags")
    parser.add_argument("--timeout", type=float, default=None,
                        help="stop after this many seconds")


def run(args: argparse.Namespace) -> int:
    try:
        key = load_key(args.key) if args.key else None
    except KeyFileError as e:
        print(f"llft sniff: {e}", file=sys.stderr)
        return 2
    from scapy.config import conf
    from scapy.layers.inet import IP, UDP
    from scapy.sendrecv import sniff

    if args.port is not None:
        lo, hi = args.port, args.port + 1
    else:
        lo, hi = transport.PORT_BASE, transport.PORT_BASE + transport.PORT_SPAN
    decoder = wire.Decoder(key, None) if key is not None else None

    def wanted(pkt) -> bool:
        return UDP in pkt and IP in pkt and lo <= pkt[UDP].dport < hi

    def show(pkt) -> None:
        ip, udp = pkt[IP], pkt[UDP]
        line = describe(bytes(udp.payload), key, decoder, time.monotonic_ns() // 1000)
        print(f"{ip.src}:{udp.sport} > {ip.dst}:{udp.dport} {line}", flush=True)

    def started() -> None:
        print(f"llft sniff: capturing on {args.iface}, ports {lo}-{hi - 1}",
              file=sys.stderr, flush=True)

    try:
        # An L2Socket (unlike the default listen socket) skips PACKET_OUTGOING copies:
        # on lo every datagram would otherwise be seen twice, leaving and arriving.
        sock = conf.L2socket(iface=args.iface)
        sniff(opened_socket=sock, lfilter=wanted, prn=show, store=False,
              count=args.count, timeout=args.timeout, started_callback=started)
    except PermissionError:
        print("llft sniff: capturing needs root (CAP_NET_RAW)", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"llft sniff: cannot capture on {args.iface}: {e}", file=sys.stderr)
        return 2
    return 0
