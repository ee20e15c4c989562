"""The load / prewarm progress callback -> tqdm bars (CPU only: the adapter is called directly)."""
import io

import pytest

from pyprefill._progress import StageBars, byte_bar


class FakeBar:
    """Records what StageBars does to a bar."""

    def __init__(self, log, total, desc):
        self.log, self.total, self.desc, self.n, self.closed = log, total, desc, 0, False
        log.append(("open", desc, total))

    def update(self, k):
        self.n += k
        self.log.append(("update", self.desc, k))

    def close(self):
        self.closed = True
        self.log.append(("close", self.desc, self.n))


def fake_stage_bars(enabled=True):
    log = []
    return StageBars(enabled, make_bar=lambda total, desc: FakeBar(log, total, desc)), log


def test_one_bar_per_stage_advanced_to_done_and_closed_at_total():
    bars, log = fake_stage_bars()
    for report in [("load", 0, 1000), ("load", 400, 1000), ("load", 1000, 1000),
                   ("prewarm", 0, 64), ("prewarm", 64, 64)]:
        bars(*report)
    assert log == [("open", "load", 1000), ("update", "load", 0), ("update", "load", 400),
                   ("update", "load", 600), ("close", "load", 1000),
                   ("open", "prewarm", 64), ("update", "prewarm", 0), ("update", "prewarm", 64),
                   ("close", "prewarm", 64)]


def test_a_stage_reported_again_gets_a_new_bar():
    bars, log = fake_stage_bars()
    for report in [("prewarm", 0, 8), ("prewarm", 8, 8), ("prewarm", 0, 8), ("prewarm", 8, 8)]:
        bars(*report)
    assert [e for e in log if e[0] == "open"] == [("open", "prewarm", 8)] * 2
    assert [e for e in log if e[0] == "close"] == [("close", "prewarm", 8)] * 2


def test_a_new_stage_closes_an_unfinished_bar_and_close_is_idempotent():
    bars, log = fake_stage_bars()
    bars("load", 10, 100)
    bars("prewarm", 0, 5)
    assert ("close", "load", 10) in log and log[-1] == ("update", "prewarm", 0)
    bars.close()
    bars.close()
    assert log[-1] == ("close", "prewarm", 0)


def test_disabled_creates_no_bar():
    bars, log = fake_stage_bars(enabled=False)
    bars("load", 0, 10)
    bars("load", 10, 10)
    assert log == []


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


def test_real_bars_on_a_terminal_show_stage_bytes_and_completion(monkeypatch):
    err = FakeTTY()
    monkeypatch.setattr("sys.stderr", err)
    bars = StageBars(True)
    for report in [("load", 0, 3 * 2**20), ("load", 3 * 2**20, 3 * 2**20),
                   ("prewarm", 0, 2048), ("prewarm", 2048, 2048)]:
        bars(*report)
    out = err.getvalue()
    # bytes in units of 1024: 3 MiB reads 3.00M, 2 KiB 2.00k; each stage ends at 100%
    assert "load: 100%" in out and "3.00M/3.00M" in out
    assert "prewarm: 100%" in out and "2.00k/2.00k" in out and "B/s" in out


@pytest.mark.parametrize("enabled, stream, disabled", [
    (True, FakeTTY(), False),       # a terminal: the bar shows
    (True, io.StringIO(), True),    # stderr redirected: tqdm turns itself off (disable=None)
    (False, FakeTTY(), True),       # progress=False
], ids=["tty", "not-a-tty", "progress-false"])
def test_byte_bar_shows_only_when_enabled_on_a_terminal(monkeypatch, enabled, stream, disabled):
    monkeypatch.setattr("sys.stderr", stream)
    bar = byte_bar(100, "load", enabled)
    assert bool(bar.disable) is disabled
    if not disabled:
        assert (bar.unit, bar.unit_scale, bar.unit_divisor) == ("B", True, 1024)
    bar.close()
