"""Progress on stderr: one total known up front; tqdm's bar on a terminal where tqdm is installed, otherwise a
bounded number of plain lines; the tuner plans its total before it measures. Run with and without tqdm: a
stand-in tqdm module checks what l2ctl asks of it, and the real one, where installed, draws the bar."""

from __future__ import annotations

import io
import re
import sys
import types
from typing import Any

import pytest

import l2ctl
from l2ctl.bench import Progress
from l2ctl.workloads import ResetDataWorkload

MiB = 1 << 20
LINE = re.compile(r"^(\w+) (\d+)/(\d+) \((\d+)%, ")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class StandInTqdm:
    """What Progress asks of tqdm: made once with the total, advanced by update, closed."""

    made: list["StandInTqdm"] = []

    def __init__(self, total: int, **options: Any) -> None:
        self.total, self.options, self.updates, self.closed = total, options, [], False
        StandInTqdm.made.append(self)

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        pass

    def update(self, n: int) -> None:
        self.updates.append(n)

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def stand_in_tqdm(monkeypatch) -> type[StandInTqdm]:
    StandInTqdm.made = []
    monkeypatch.setitem(sys.modules, "tqdm", types.SimpleNamespace(tqdm=StandInTqdm))
    return StandInTqdm


@pytest.fixture
def no_tqdm(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm raises ImportError


def _lines(err: str) -> list[tuple[str, int, int]]:
    found = [LINE.match(line) for line in err.splitlines()]
    assert all(found), err
    return [(m[1], int(m[2]), int(m[3])) for m in found if m]


def test_without_tqdm_a_long_run_prints_at_most_ten_lines_with_the_time_left(no_tqdm, capsys):
    with Progress(4000, "tune") as bar:
        for _ in range(4000):
            bar.step("a point")
    err = capsys.readouterr().err
    lines = _lines(err)
    assert len(lines) == Progress.LINES and {total for _, _, total in lines} == {4000}
    assert [done for _, done, _ in lines] == [400 * k for k in range(1, 11)]
    assert err.count(" left)") == Progress.LINES - 1  # every line but the last says how long is left


def test_not_a_terminal_gets_plain_lines_even_with_tqdm(stand_in_tqdm, capsys):
    with Progress(3, "sweep") as bar:
        for _ in range(3):
            bar.step()
    assert not stand_in_tqdm.made and [d for _, d, _ in _lines(capsys.readouterr().err)] == [1, 2, 3]


def test_on_a_terminal_tqdm_gets_the_whole_total_up_front(stand_in_tqdm, monkeypatch):
    monkeypatch.setattr(sys, "stderr", Terminal())
    with Progress(40, "tune") as bar:
        for _ in range(15):
            bar.step()
        bar.skip(20)
        for _ in range(10):  # 5 more than planned: never past the total
            bar.step()
    (made,) = stand_in_tqdm.made
    assert made.total == 40 and sum(made.updates) == 40 and made.closed
    assert sys.stderr.getvalue() == ""  # the bar is tqdm's: no plain line beside it


def test_the_real_tqdm_draws_a_bar_with_the_time_left(monkeypatch):
    pytest.importorskip("tqdm", reason="tqdm is optional ([test] installs it)")
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with Progress(4, "tune") as bar:
        for _ in range(4):
            bar.step("point")
    assert "tune" in terminal.getvalue() and "4/4" in terminal.getvalue() and "<" in terminal.getvalue()


def test_disabled_is_silent(stand_in_tqdm, monkeypatch):
    monkeypatch.setattr(sys, "stderr", Terminal())
    with Progress(5, "x", enabled=False) as bar:
        bar.step()
    assert not stand_in_tqdm.made and sys.stderr.getvalue() == ""


@pytest.mark.parametrize("names", [("lut", "out"), ("out",)], ids=["refined and confirmed", "nothing pays"])
def test_tune_plans_its_total_before_it_measures(fake, stand_in_tqdm, monkeypatch, names):
    monkeypatch.setattr(sys, "stderr", Terminal())
    with l2ctl.Stream() as s, ResetDataWorkload(4 * MiB, 64 * MiB) as w:
        buffers = {"lut": w.buf, "out": w.out}
        tuned = l2ctl.tune(w, s, {n: buffers[n] for n in names}, rounds=3, progress=True)
    assert tuned.persists == ("lut" in names)  # both ends: refined and confirmed, or neither stage needed
    (made,) = stand_in_tqdm.made
    assert sum(made.updates) == made.total and made.closed  # the total was right from the start: never grown


def test_tune_without_tqdm_prints_one_total(fake, no_tqdm, capsys):
    with l2ctl.Stream() as s, ResetDataWorkload(4 * MiB, 64 * MiB) as w:
        l2ctl.tune(w, s, {"lut": w.buf}, rounds=3, progress=True)
    lines = _lines(capsys.readouterr().err)
    assert len({total for _, _, total in lines}) == 1 and lines[-1][1] == lines[-1][2]
    assert len(lines) <= Progress.LINES
