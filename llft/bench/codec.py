"""`llft bench codec`: the wire codec's two halves, side by side, in one process.

Per kind of datagram a replica handles (a 1 KB request, a 16 KB reply, a heartbeat, an
ack, an order-info report, a NACK -- a type the C half hands back to the reference -- and
a forged datagram that fails its tag), the time to encode a Message into its datagram
and to decode the datagram back, with the Python reference (`wire.Decoder(native=False)`,
`Encoder(codec="python")`) and with the C half (native/wire/). Both halves are timed in
interleaved blocks of the same loop (median of the blocks), so the machine's noise falls
on both alike; the ratio column is what to compare across machines. Every decoded
message is checked equal to the one encoded, in both halves, before timing starts.

Writes `<results>/codec.csv`, `codec.md` and `codec.png` (µs per datagram, both halves).
"""
from __future__ import annotations

import argparse
import statistics
import time

from llft.bench import report
from llft.bench.report import Table, write_markdown
from llft.protocol import wire
from llft.protocol.messages import Message, MsgType, Role

KEY = bytes(range(32))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ops", type=int, default=2000, help="operations per timed block")
    p.add_argument("--blocks", type=int, default=7, help="interleaved blocks per half")
    p.add_argument("--quick", action="store_true", help="--ops 300 --blocks 3")
    p.add_argument("--results", default=report.DEFAULT_RESULTS_DIR, help="output folder")


def _msg(mtype: MsgType, body: dict, *, msn: int = 0, order_info: bytes = b"") -> Message:
    return Message(type=mtype, src_group="echo3.gateway.70511278ac6248d1", dst_group="echo3",
                   conn_seq=971061898376, role=Role.CLIENT, pvn=4, precedence=3,
                   sender=0x1234_5678_9ABC, msn=msn, ack=15217, back=1 << 40, ts=41277,
                   body=body, order_info=order_info)


def samples() -> dict[str, Message]:
    """One message per row, shaped like what `llft bench echo` puts on the wire."""
    oi = bytes(range(256)) * 2
    return {
        "request 1 KB": _msg(MsgType.REQUEST, {"offset": 1 << 20, "data": b"x" * 1040,
                                               "flags": 0}, msn=15219, order_info=oi[:96]),
        "reply 16 KB": _msg(MsgType.REPLY, {"offset": 1 << 24, "data": b"y" * 16_384,
                                            "flags": 0}, msn=9, order_info=oi),
        "heartbeat": _msg(MsgType.HEARTBEAT, {"rank": 2, "served": 1, "lineage": 1,
                                              "change": 3, "wait": 0, "replay": 0, "rm": 0, "done": 0}),
        "first ack": _msg(MsgType.FIRST_ACK, {}),
        "order-info report": _msg(MsgType.ORDER_INFO, {"upto": 123456, "done": 123400}),
        "nack (reference in both)": _msg(MsgType.NACK, {"missing": [15220, 15221]}),
    }


def _time(fn, arg, ops: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(ops):
        fn(arg)
    return (time.perf_counter_ns() - t0) / ops / 1000


def run(args) -> int:
    command = report.command_of(args, add_arguments, "codec")
    if args.quick:
        args.ops, args.blocks = 300, 3
    if not wire.native_available():
        print("codec: native._llft_wire is not built (run scripts/setup.sh)")
        return 1
    enc = {"python": wire.Encoder(KEY, mtu_bytes=wire.MAX_DATAGRAM_BYTES, check=False,
                                  codec="python"),
           "native": wire.Encoder(KEY, mtu_bytes=wire.MAX_DATAGRAM_BYTES, check=False,
                                  codec="native")}
    dec = {"python": wire.Decoder(KEY, None, native=False),
           "native": wire.Decoder(KEY, None, native=True)}
    rows = dict(samples())
    table = Table("codec", f"Wire codec, µs per datagram: median of {args.blocks} interleaved "
                  f"blocks of {args.ops}", ["datagram", "bytes", "encode_python_us",
                                            "encode_native_us", "encode_x", "decode_python_us",
                                            "decode_native_us", "decode_x"])
    cases = []
    for name, msg in rows.items():
        (dg,) = enc["python"].encode(msg)
        for half in ("python", "native"):
            if enc[half].encode(msg) != [dg] or dec[half].decode(dg, 0) != msg:
                raise AssertionError(f"codec: {half} half does not round-trip {name}")
        cases.append((name, msg, dg))
    forged = bytearray(cases[0][2])
    forged[-1] ^= 1
    cases.append(("forged (bad tag)", None, bytes(forged)))
    for name, msg, dg in cases:
        t: dict[str, list[float]] = {k: [] for k in ("ep", "en", "dp", "dn")}
        for _ in range(args.blocks):
            if msg is not None:
                t["ep"].append(_time(enc["python"].encode, msg, args.ops))
                t["en"].append(_time(enc["native"].encode, msg, args.ops))
            t["dp"].append(_time(lambda d: dec["python"].decode(d, 0), dg, args.ops))
            t["dn"].append(_time(lambda d: dec["native"].decode(d, 0), dg, args.ops))
        m = {k: statistics.median(v) if v else float("nan") for k, v in t.items()}
        table.add(datagram=name, bytes=len(dg), encode_python_us=m["ep"],
                  encode_native_us=m["en"], encode_x=m["ep"] / m["en"] if msg else "",
                  decode_python_us=m["dp"], decode_native_us=m["dn"],
                  decode_x=m["dp"] / m["dn"])
    table.print()
    path = table.write_csv(args.results)
    png = report.bars(args.results, "codec", "Wire codec: µs per datagram (decode)",
                      "µs per datagram", [r["datagram"] for r in table.rows],
                      {"python": [r["decode_python_us"] for r in table.rows],
                       "native": [r["decode_native_us"] for r in table.rows]})
    write_markdown(args.results, "codec", [table.markdown()], plots=[png], command=command,
                   notes="Both halves of llft/protocol/wire.py in one process: the Python "
                         "reference and the C half (native/wire/), timed in interleaved "
                         "blocks; x = Python time / C time. Encoding is msgpack's packb "
                         "plus the seal in both; the C half seals (tag) in C. A NACK's "
                         "body holds a list: the C half checks its tag, then hands it to "
                         "the reference.")
    print(f"wrote {path}")
    return 0
