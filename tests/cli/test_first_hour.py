"""A new user's first hour on the command line (issue 34): what used to end in a traceback or pass a simulated
or meaningless figure for a measurement now ends with one line and a non-zero exit, or does what was asked.
Most run `python -m l2ctl` in a subprocess: the start-up, the environment and stdout are what they test."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import os
import signal
import subprocess
import sys
import time
from typing import Iterator

import pytest

from l2ctl import _backend, cli
from l2ctl.testing import FakeDevice

H100, H200 = FakeDevice.h100().name, FakeDevice.h200().name
QUICK = ["--repeat", "1", "--warmup", "0", "--quiet"]
STRIDE = ["--simulate", "bench", "stride", "--strides", "4,8", "--threads", "1024", *QUICK]


def environ(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "L2CTL_SIMULATE"}
    env.update(values)
    return env


def run(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "l2ctl", *args], capture_output=True, text=True, timeout=120,
                          env=environ(**env))


def one_line(stderr: str) -> str:
    assert "Traceback" not in stderr and stderr.count("\n") == 1, stderr
    return stderr


@pytest.fixture
def restored() -> Iterator[None]:
    """The backend in use put back after a test that runs the command line with --simulate."""
    with _backend.use(_backend.current()):
        yield


# ------------------------------------------------------------------------------------------ tracebacks


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="checks the run without PyTorch; torch "
                    "is installed here")
def test_bench_collectives_without_torch_says_what_it_needs():
    r = run("--simulate", "bench", "collectives")
    assert r.returncode == cli.EXIT_UNSUPPORTED
    assert "needs PyTorch (pip install torch)" in one_line(r.stderr)


def test_a_bad_l2ctl_simulate_never_fails_the_import():
    # the first device call says what is wrong, device_count() included (issue 43: it answered 0, silently)
    code = ("import l2ctl\nfor call in (l2ctl.device_count, l2ctl.device_info):\n    try:\n        call()\n"
            "    except l2ctl.NoDeviceError as e:\n        print(e)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=environ(L2CTL_SIMULATE="garbage"))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    for message in r.stdout.splitlines():
        assert "L2CTL_SIMULATE='garbage'" in message and "choose from h100" in message
    assert len(r.stdout.splitlines()) == 2


def test_a_bad_l2ctl_simulate_is_one_line_on_the_command_line_and_the_command_line_wins():
    r = run("info", L2CTL_SIMULATE="garbage")
    assert r.returncode == cli.EXIT_UNSUPPORTED and "L2CTL_SIMULATE='garbage'" in one_line(r.stderr)
    r = run("--simulate", "h100", "info", L2CTL_SIMULATE="garbage")
    assert r.returncode == 0 and r.stderr == "" and f"device 0: {H100}" in r.stdout, r.stderr


def test_the_command_line_names_the_gpu_it_simulates():
    """--simulate wins over L2CTL_SIMULATE, and nothing names the GPU it replaced."""
    r = run("--simulate", "h200", "info", L2CTL_SIMULATE="h100")
    assert r.returncode == 0 and f"device 0: {H200}" in r.stdout, r.stderr
    assert "H100" not in r.stdout + r.stderr
    r = run("info", L2CTL_SIMULATE="h200")  # the variable alone: said once on stderr, naming the H200
    assert r.returncode == 0 and r.stderr.count("L2CTL_SIMULATE is set") == 1 and H200 in r.stderr


def test_stdout_closed_early_is_a_quiet_exit():
    """`l2ctl ... | head -1`: the reader goes away before the tables are written."""
    p = subprocess.Popen([sys.executable, "-m", "l2ctl", *STRIDE], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=environ())
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()
    with p.stderr:
        err = p.stderr.read().decode()
    assert p.wait(timeout=120) == cli.EXIT_BROKEN_PIPE, err
    assert err == "", err


def _has_loaded(pid: int, name: str) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as f:
            return name in f.read()
    except OSError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="finds the moment the imports run through /proc")
@pytest.mark.parametrize("loaded", ["numpy", "_core"], ids=["while numpy loads", "while l2ctl's core loads"])
def test_ctrl_c_while_the_imports_run_exits_130_without_a_traceback(loaded):
    p = subprocess.Popen([sys.executable, "-m", "l2ctl", "--simulate", "bench", *QUICK], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=environ())
    deadline = time.monotonic() + 60
    while not _has_loaded(p.pid, loaded) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == cli.EXIT_INTERRUPTED, err.decode()
    assert err.decode().startswith("l2ctl: interrupted") and "Traceback" not in err.decode(), err.decode()


# ------------------------------------------------------------------------------------------ outputs


def test_json_and_csv_to_stdout():
    r = run(*STRIDE, "--json", "-")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)  # stdout holds the document alone: the table went to stderr
    assert doc["environment"]["device"]["name"] == H100 and "strided 4-byte loads" in r.stderr
    r = run(*STRIDE, "--csv", "-")
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert r.returncode == 0 and [row["variant"] for row in rows] == ["4B", "8B"], r.stderr
    assert not os.path.exists("-")


def test_a_simulated_csv_names_the_device_and_says_it_is_simulated(tmp_path):
    r = run(*STRIDE, "--csv", f"{tmp_path}/s.csv")
    assert r.returncode == 0, r.stderr
    with open(tmp_path / "s.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(row["device"] == H100 and row["simulated"].startswith("simulated by l2ctl.testing")
                        for row in rows)


@pytest.mark.parametrize("argv,message", [
    (["--json", "{tmp}/x", "--csv", "{tmp}/x"], "--json and --csv both write to the same file"),
    (["--json", "{tmp}/x", "--csv", "{tmp}/../{name}/x"], "--json and --csv both write to the same file"),
    (["--json", "-", "--csv", "-"], "--json and --csv both write to stdout"),
    (["--plot", "{tmp}/x.png", "--json", "{tmp}/x.png"], "both write to the same file"),
    (["--plot", "-"], "a plot cannot go to stdout")])
def test_two_outputs_in_one_place_are_refused(restored, capsys, tmp_path, argv, message):
    pytest.importorskip("matplotlib")
    argv = [a.format(tmp=tmp_path, name=tmp_path.name) for a in argv]
    assert cli.main(["--simulate", "bench", "stride", *argv]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert message in one_line(err)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("size", ["4", "1M", "49M"])
def test_an_output_smaller_than_the_l2_is_refused(restored, capsys, size):
    with pytest.raises(SystemExit) as exit_:
        cli.parse_args(["--simulate", "bench", "--out-bytes", size])
    assert exit_.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "smaller than the L2" in one_line(err) and "give at least 50M" in err


@pytest.mark.parametrize("argv", [["--simulate", "bench", "--out-bytes", "50M"],
                                  ["--simulate", "h200", "sweep", "hit-ratio", "--out-bytes", "60M"],
                                  ["--simulate", "tune", "--out-bytes", "64M"]])
def test_an_output_as_large_as_the_l2_is_taken(restored, argv):
    assert cli.parse_args(argv).out_bytes >= 50 << 20


def test_a_warning_is_said_once_per_run_under_quiet_too():
    """A LUT larger than the largest window: every point of the sweep clips it, and the line says so once."""
    r = run("--simulate", "sweep", "hit-ratio", "--lut-bytes", "200M", *QUICK)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("WindowClippedWarning: window of 209715200 bytes clipped") == 1, r.stderr


@pytest.mark.parametrize("argv,flag", [(["bench", "--lut-sizes", "4M,100M", "--out-bytes", "64M"], "--lut-sizes"),
                                       (["sweep", "hit-ratio", "--lut-bytes", "200M"], None),
                                       (["sweep", "hit-ratio", "--lut-bytes", "200M", "--out-bytes", "100M"],
                                        "--lut-bytes"),
                                       (["tune", "--lut-sizes", "128M", "--out-bytes", "100M"], "--lut-sizes")])
def test_a_lut_larger_than_the_output_is_refused(restored, capsys, argv, flag):
    if flag is None:  # the default output (1 GiB) holds it
        assert cli.parse_args(["--simulate", *argv]).out_bytes == 1 << 30
        return
    with pytest.raises(SystemExit) as exit_:
        cli.parse_args(["--simulate", *argv])
    assert exit_.value.code == cli.EXIT_USAGE
    assert f"is smaller than {flag} " in one_line(capsys.readouterr().err)


# ------------------------------------------------------------------------------------------ issue 43


TUNE_TWO_SIZES = ["--simulate", "tune", "--lut-sizes", "4M,16M", "--rounds", "3", *QUICK]


def test_tune_of_several_sizes_writes_one_json_document_to_stdout():
    """One document a reader of stdout can parse (an array, one report per size), not one per size in a row."""
    r = run(*TUNE_TWO_SIZES, "--json", "-")
    assert r.returncode == 0, r.stderr
    reports = json.loads(r.stdout)
    assert [d["records"][0]["config"]["lut_bytes"] for d in reports] == [4 << 20, 16 << 20]


def test_tune_of_several_sizes_writes_one_csv_header_to_stdout():
    r = run(*TUNE_TWO_SIZES, "--csv", "-")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines.count(lines[0]) == 1, "the header is repeated"
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert {int(row["config.lut_bytes"]) for row in rows} == {4 << 20, 16 << 20}


def test_tune_of_several_sizes_still_writes_a_file_per_size(tmp_path):
    r = run(*TUNE_TWO_SIZES, "--json", f"{tmp_path}/t.json")
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path)) == sorted([f"t_{4 << 20}.json", f"t_{16 << 20}.json"])


@pytest.mark.parametrize("argv,said,not_said", [
    (["--bogus", "info"], "unknown option --bogus", "did you mean"),
    (["--bogus"], "unknown option --bogus", "did you mean"),
    (["--simulat", "info"], "unknown option --simulat; did you mean --simulate?", ""),
    (["--lut-size", "4M", "bench"], "unknown option --lut-size; did you mean --lut-sizes?", ""),
    (["info", "--prob"], "unknown option --prob; did you mean --probe?", ""),
])
def test_an_unknown_option_is_matched_only_against_what_that_command_takes(capsys, argv, said, not_said):
    """A global option is matched against the options every command takes, or the command named; never
    against some other command's (--bogus was once answered "did you mean --rounds?", which info does not take)."""
    assert cli.main(argv) == cli.EXIT_USAGE
    err = one_line(capsys.readouterr().err)
    assert said in err and (not not_said or not_said not in err), err


@pytest.mark.parametrize("nbytes,text", [(0, "0 B"), (1000, "1000 B"), (1023, "1023 B"), (1024, "1.0 KiB"),
                                         (1536, "1.5 KiB"), (MiB := 1 << 20, "1.00 MiB"), (4 * MiB, "4.00 MiB")])
def test_sizes_are_written_in_a_unit_that_fits(nbytes, text):
    from l2ctl._units import format_bytes

    assert format_bytes(nbytes) == text


def test_the_reset_data_verdict_names_a_small_size_in_bytes():
    r = run("--simulate", "bench", "--lut-sizes", "1000,2000", "--out-bytes", "64M", "--columns",
            "baseline,right_sized", *QUICK)
    assert r.returncode == 0, r.stderr
    verdict = next(line for line in r.stdout.splitlines() if line.startswith("Verdict:"))
    assert " MiB)" not in verdict and ("at 1000 B)" in verdict or "at 2000 B)" in verdict), verdict


def test_the_graph_table_keeps_its_times_in_one_column():
    r = run("--simulate", "bench", "graph", *QUICK)
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if line.startswith("  replay")]
    assert len(rows) == 3 and len({line.index(" ms") for line in rows}) == 1, "\n".join(rows)
