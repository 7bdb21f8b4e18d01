"""The runtime's parts on their own: the application's mode transitions, the status-file
writer, the driver's pump, and the node's action vocabulary."""
from __future__ import annotations

import json
import random

import pytest

from llft.protocol.messages import Message, MsgType, Role, Send
from llft.replica import actions
from llft.replica.node import ReplicaNode
from llft.runtime.application import TRANSITIONS, AppMode, Application
from llft.runtime.driver import Driver
from llft.runtime.status import StatusFile


def _app() -> Application:
    return Application(["true"], "/", 0, on_exit=lambda app, rc: None,
                       on_order_info=lambda: None, on_feed_failed=lambda app, why: None)


def test_app_modes_follow_the_written_transitions():
    assert set(TRANSITIONS) == set(AppMode)
    app = _app()
    assert app.mode is AppMode.NONE and app.pid is None and not app.diverged
    for bad in (AppMode.PROMOTING, AppMode.NONE):
        with pytest.raises(RuntimeError):
            app._enter(bad)
    for mode in (AppMode.BACKUP, AppMode.PROMOTING, AppMode.PRIMARY):
        app._enter(mode)
    with pytest.raises(RuntimeError):
        app._enter(AppMode.BACKUP)          # a primary never goes back


def test_app_without_process_feeds_nothing_and_stops():
    app = _app()
    app.feed(b"entries")                    # no app yet: nothing queued
    assert app._feed_busy == [0] and app._feed_queue.empty()
    assert app.fed_entries is None and app.consumed_entries is None
    app.stop()                              # nothing started: nothing to kill


def test_status_file_replaces_and_removes(tmp_path):
    f = StatusFile()                        # written by a helper thread: close() waits
    a, b = tmp_path / "g" / "a.json", tmp_path / "g" / "b.json"
    f.write(str(a), {"n": 1})
    assert f.close()
    assert json.loads(a.read_text()) == {"n": 1}
    f.write(str(b), {"n": 2})               # a new birth id: the old file goes
    assert f.close()
    assert not a.exists() and json.loads(b.read_text()) == {"n": 2}
    f.remove()
    assert f.close()
    assert not b.exists() and f.path is None
    f.remove()                              # twice is harmless
    assert f.close() and f.errors == 0


def test_status_file_keeps_the_order_of_writes_and_removal(tmp_path):
    f = StatusFile()
    a = tmp_path / "a.json"
    for n in range(200):                    # a burst: only the latest needs writing
        f.write(str(a), {"n": n})
    f.remove()                              # asked after them: nothing is left behind
    assert f.close()
    assert not a.exists() and not (tmp_path / "a.json.tmp").exists()
    f.write(str(a), {"n": "last"})
    assert f.close() and json.loads(a.read_text()) == {"n": "last"}


def test_status_file_counts_a_failure_and_goes_on(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    f = StatusFile()
    f.write(str(blocker / "sub" / "a.json"), {"n": 1})     # a file where a folder must be
    assert f.close()
    assert f.errors == 1 and isinstance(f.last_error, OSError)
    f.write(str(tmp_path / "ok.json"), {"n": 2})
    assert f.close() and json.loads((tmp_path / "ok.json").read_text()) == {"n": 2}


class _Endpoint:
    def __init__(self):
        self.sent = []
        self.on_message = None

    def send(self, group, msg):
        self.sent.append((group, msg))

    def take_absorbed(self):
        return []                   # no pulse channel: nothing absorbed

    def read_pulse(self):
        self.sent.append("read_pulse")


class _Core:
    """Emits a send and a delivery, then (called again by the handler) one more."""

    def __init__(self):
        self.out = []

    def take_actions(self):
        out, self.out = self.out, []
        return out

    def next_timer_us(self):
        return None

    def handle_message(self, msg, now_us):
        self.out += [Send("g", msg), "deliver"]


def test_driver_sends_sends_and_hands_the_rest_to_on_action():
    ep, core, seen = _Endpoint(), _Core(), []

    def on_action(a):
        seen.append(a)
        if len(seen) == 1:
            core.out.append("later")        # a handler feeding the core again

    Driver(ep, core, on_action=on_action)
    msg = Message(type=MsgType.HEARTBEAT, src_group="g", dst_group="g", conn_seq=0,
                  role=Role.CLIENT, pvn=1, precedence=1, sender=1)
    ep.on_message(msg)
    assert ep.sent == [("g", msg)] and seen == ["deliver", "later"]


def test_driver_reads_the_pulse_socket_before_a_message_while_a_takeover_is_held():
    """A held takeover is decided by messages (PROBE answers): each is judged with every
    heartbeat that came, so the pulse socket is read before it, and only then."""
    ep, core = _Endpoint(), _Core()
    Driver(ep, core)
    msg = Message(type=MsgType.HEARTBEAT, src_group="g", dst_group="g", conn_seq=0,
                  role=Role.CLIENT, pvn=1, precedence=1, sender=1)
    ep.on_message(msg)
    assert ep.sent == [("g", msg)]
    core.takeover_held = True
    ep.on_message(msg)
    assert ep.sent == [("g", msg), "read_pulse", ("g", msg)]
    node = ReplicaNode("g", random.Random(1))
    assert node.takeover_held is False      # the node says what its membership says


def test_node_emits_only_its_vocabulary():
    node = ReplicaNode("g", random.Random(1))
    node.start(0)
    assert node.take_actions()              # the membership core's first sends
    with pytest.raises(TypeError):
        node._emit("not an action")
    for t in (actions.Deliver, actions.OrderInfo, actions.ViewSwitch, actions.Restored,
              actions.RestartApp):
        assert t in actions.ACTION_TYPES
    snap = node.status_snapshot()
    assert snap["birth"] == node.birth and snap["order_info"]["delivered"] == 0


def test_output_waits_for_a_record_reserved_before_it():
    """Output commit and the ring: thread A reserves a record and is descheduled before
    committing it; thread B records an entry (committed) and writes its output. A drain
    stops at A's record, so B's entry is not drained when B's output is read: the output
    may go only once the ring is drained up to what was reserved when it was read.
    (Seen in `llft chaos --kinds partition,kill_primary,...`: a primary killed in that
    window left its successor without the entries of replies the clients had read.)"""
    from determinizer.shm import Shm, lib
    app = _app()
    app.shm = Shm.create(Shm.PRIMARY)
    try:
        base = app.shm._base
        a = lib.llft_out_reserve(base, 8)           # thread A: reserved, not committed
        b = lib.llft_out_reserve(base, 8)           # thread B: reserved ...
        lib.llft_out_commit(base, b, 8)             # ... and committed; then B writes
        app.owe_drain()                             # the agent reads B's output
        assert app.shm.drain(0) == b""              # B's entry is stuck behind A's
        assert not app.owed_drained()
        lib.llft_out_commit(base, a, 8)             # A runs again
        drained = app.shm.drain(0)
        assert len(drained) == app.shm.out_reserved - a    # A's and B's records
        assert app.owed_drained()
        c = lib.llft_out_reserve(base, 8)           # reserved after the output was read:
        assert app.owed_drained()                   # not owed
        lib.llft_out_commit(base, c, 8)
        assert app.shm.drain(0) and app.owed_drained()
    finally:
        app.shm.close()
        app.shm = None
