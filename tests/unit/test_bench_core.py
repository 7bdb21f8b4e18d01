"""`llft bench core`: the two cores carry every byte, and the table has a row per size
(timings are not judged here)."""
import csv

from llft.bench.core import SIZE, Pair
from llft.cli import main


def test_a_round_trip_delivers_the_request_and_the_reply():
    pair = Pair()
    for i in range(1, 51):
        pair.round_trip()
        assert pair.delivered == i * 2 * SIZE
    # the connection stays steady: nothing piles up in either core's sent list
    assert pair.gw.in_flight(pair.conn) <= 2 and pair.srv.in_flight(pair.srv_conn) <= 2


def test_bench_core_writes_its_table(tmp_path):
    assert main(["bench", "core", "--quick", "--evict-mib", "0,1", "--rounds", "20",
                 "--results", str(tmp_path)]) == 0
    rows = list(csv.DictReader(open(tmp_path / "core.csv")))
    assert [r["evicted_mib"] for r in rows] == ["0", "1"]
    assert all(float(r["round_trip_us"]) > 0 for r in rows)
    assert (tmp_path / "core.md").exists()


def test_bench_core_says_what_is_wrong_with_its_sizes(tmp_path, capsys):
    assert main(["bench", "core", "--evict-mib", "x", "--results", str(tmp_path)]) == 2
    assert "--evict-mib" in capsys.readouterr().out
