"""`llft bench transport`: both transports carry every connection of both sides, and
the table has a row per side (timings are not judged here)."""
import csv

from llft.cli import main


def test_bench_transport_writes_its_table(tmp_path):
    assert main(["bench", "transport", "--connections", "30", "--blocks", "2",
                 "--results", str(tmp_path)]) == 0
    rows = list(csv.DictReader(open(tmp_path / "transport.csv")))
    assert [r["side"] for r in rows] == ["connect", "accept"]
    assert all(float(r["asyncio_us"]) > 0 and float(r["lean_us"]) > 0 for r in rows)
    assert (tmp_path / "transport.md").exists()
