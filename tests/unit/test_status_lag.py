"""`llft status` with lag (docs/LOG.md): the primary's per-backup report is the lag shown,
a joiner's own view is the fallback, backpressure and a full log each get a line."""
from __future__ import annotations

import json
import os

from llft.runtime import config as config_mod
from llft.runtime import keys
from llft.runtime.status import group_status, render

P, B = 0xAA, 0xBB


def _agent(birth: int, rank: int, **kw) -> dict:
    members = [{"birth": P, "precedence": 1, "rank": 1},
               {"birth": B, "precedence": 2, "rank": 2}]
    st = {"group": "g", "birth": birth, "role": "primary" if rank == 1 else "backup",
          "rank": rank, "pvn": 3, "primary": P, "members": members, "host": "h",
          "agent_pid": os.getpid(), "app_pid": os.getpid(),
          "app_mode": "primary" if rank == 1 else "backup",
          "order_info": {"produced": 50 if rank == 1 else None, "delivered": 40},
          "counters": {}, "sync": "none", "lag_held": False, "log": None}
    st.update(kw)
    return st


def _status(tmp_path, primary: dict, backup: dict) -> dict:
    keys.write_key(str(tmp_path / "k"))
    cfg_path = str(tmp_path / "c.toml")
    config_mod.write_example(cfg_path, "k", {"g": ("239.255.1.1:30000", 9000)},
                             extra_cluster='runtime_dir = "run"')
    cfg = config_mod.load(cfg_path)
    d = cfg.status_dir("g")
    os.makedirs(d, exist_ok=True)
    for st in (primary, backup):
        with open(os.path.join(d, f"{st['birth']:x}.json"), "w") as f:
            json.dump(st, f)
    return group_status(cfg, "g")


def test_the_primary_report_is_the_lag_shown_with_backpressure_and_a_full_log(tmp_path):
    prim = _agent(P, 1, lag_held=True,
                  backup_lag={f"{B:x}": {"entries": 7, "ms": 1234.5, "ready": True}},
                  log={"full": "the group's log reached its cap (...)"})
    back = _agent(B, 2, sync="ready", own_lag={"entries": 3, "ms": 9.0})
    st = _status(tmp_path, prim, back)
    p, b = st["members"]
    assert (p["sync"], p["lag_ms"], p["lag_held"]) == ("primary", 0.0, True)
    assert (b["sync"], b["lag_ms"], b["lag_entries"], b["lag_ready"]) == \
        ("ready", 1234.5, 7, True)
    text = render(st)
    assert "lag ms" in text and "1234" in text and "ready" in text
    assert "backpressure: the application is held" in text
    assert "log full, joins refused: the group's log reached its cap" in text


def test_the_primary_row_shows_how_full_the_log_is(tmp_path):
    log = {"input_bytes": 3 * 2**20, "order_info_bytes": 2**19, "entries": 30945,
           "cap_bytes": 256 * 2**20, "cap_entries": 1048576, "full": None}
    st = _status(tmp_path, _agent(P, 1, log=log), _agent(B, 2, sync="ready", log=log))
    text = render(st)
    assert text.count("log (what a joiner replays): 3.5 of 256 MiB, 30,945 of 1,048,576 "
                      "order-info positions") == 1


def test_a_joiner_without_a_primary_report_shows_its_own_lag(tmp_path):
    st = _status(tmp_path, _agent(P, 1),
                 _agent(B, 2, sync="catching-up", own_lag={"entries": 300, "ms": 812.0}))
    b = st["members"][1]
    assert (b["sync"], b["lag_ms"], b["lag_entries"]) == ("catching-up", 812.0, None)
    assert "catching-up" in render(st) and "backpressure" not in render(st)


def test_a_killed_agents_file_whose_pid_is_reused_is_not_a_live_agent(tmp_path):
    """A SIGKILLed agent leaves its status file; its pid is soon another process's. The
    file says when its process started (`agent_start`): a file naming a live pid with
    another start is a dead agent's (it was read as live and "joining", and `llft chaos`
    waited 120 s for a group that had settled). A file that does not say (older) still
    goes by the pid."""
    import psutil
    from llft.runtime.status import own_start
    start = own_start()
    assert start == psutil.Process().create_time()
    stale = _agent(B, 2, agent_start=start - 1)      # this pid, another process
    st = _status(tmp_path, _agent(P, 1, agent_start=start), stale)
    assert [m["birth"] for m in st["members"]] == [P, B]
    assert st["members"][1]["agent_pid"] is None        # read as gone: no status of it
    assert st["joining"] == []
    older = tmp_path / "older"
    older.mkdir()
    st = _status(older, _agent(P, 1, agent_start=start), _agent(B, 2))
    assert st["members"][1]["agent_pid"] == os.getpid()  # no start in the file: the pid
