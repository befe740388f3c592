"""The command line without a GPU: argument parsing, exit codes, messages (never a traceback)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from l2ctl import _core, cli

NO_GPU = _core.device_count() == 0


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "l2ctl", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(not NO_GPU, reason="checks the no-GPU behaviour; this machine has a GPU")
@pytest.mark.parametrize("args", [["info"], ["bench"], ["bench", "reset-data"], ["bench", "stride"],
                                  ["bench", "cache-streaming"], ["bench", "graph"], ["bench", "concurrent"]])
def test_no_gpu_gives_a_message_and_exit_3(args):
    r = run(*args)
    assert r.returncode == cli.EXIT_UNSUPPORTED
    assert "Traceback" not in r.stderr and "no CUDA device" in r.stderr


def test_bad_arguments_exit_2():
    r = run("bench", "--lut-sizes", "4x")
    assert r.returncode == 2 and "not a size" in r.stderr
    assert run("frobnicate").returncode == 2
    assert run().returncode == 2


def test_help_lists_commands_and_exit_codes():
    r = run("--help")
    assert r.returncode == 0
    for word in ("info", "bench", "exit codes"):
        assert word in r.stdout


@pytest.mark.parametrize("text,value", [("4096", 4096), ("4K", 4096), ("8M", 8 << 20), ("1.5MiB", 3 << 19),
                                        ("1G", 1 << 30), ("2mb", 2 << 20)])
def test_sizes(text, value):
    assert cli._size(text) == value


def test_parser_defaults():
    args = cli.build_parser().parse_args(["bench"])
    assert args.func is cli.cmd_bench_reset and args.repeat == 15 and args.out_bytes == 1 << 30
    args = cli.build_parser().parse_args(["bench", "stride", "--strides", "4,8", "--json", "x.json"])
    assert args.strides == [4, 8] and args.json == "x.json"
