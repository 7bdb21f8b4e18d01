"""llft/runtime/marks.py: the opt-in recorder behind `llft bench profile --marks`."""
import pytest

from llft.runtime import marks


class Path:
    """Stands for a class on the request path: methods with a payload and an arrival."""

    def read(self, data: bytes, at_us: int | None = None) -> int:
        return len(data)

    def write(self, stream: int, data: bytes) -> None:
        raise OSError("broken pipe")


@pytest.fixture
def recorder(monkeypatch):
    monkeypatch.setattr(marks, "_marks", [])
    monkeypatch.setattr(Path, "read", Path.read)        # restored after the test
    monkeypatch.setattr(Path, "write", Path.write)
    marks.install({(__name__, "Path", "read"): ("in", None, "data"),
                   (__name__, "Path", "write"): (None, "out", "data")})
    return marks._marks


def test_a_wrapped_call_records_its_size_arrival_and_order(recorder, tmp_path):
    p = Path()
    assert p.read(b"abcd", 7) == 4                  # the method still answers
    p.read(b"xy", at_us=None)
    with pytest.raises(OSError):                    # and still raises: its mark stays
        p.write(3, b"12345")
    assert [(t, size, at) for t, _, size, at in recorder] == \
        [("in", 4, 7000), ("in", 2, 0), ("out", 5, 0)]
    times = [ns for _, ns, _, _ in recorder]
    assert times == sorted(times)
    path = str(tmp_path / "agent-1.marks")
    marks.dump(path)
    assert recorder == [] and [m[0] for m in marks.read(path)] == ["in", "in", "out"]


def test_recording_stops_at_the_cap(recorder, monkeypatch):
    monkeypatch.setattr(marks, "MAX_MARKS", 2)
    p = Path()
    for _ in range(5):
        assert p.read(b"a") == 1
    assert len(recorder) == 2
