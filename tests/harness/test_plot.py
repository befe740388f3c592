"""Plots say what they show: a simulated result's title names the simulator, a measured one's the GPU."""

from __future__ import annotations

import dataclasses

import pytest

from l2ctl import bench, plot
from l2ctl.bench.records import simulated_label

pytest.importorskip("matplotlib")


@pytest.fixture
def stride_report(fake) -> bench.Report:
    return bench.bench_stride([4, 8], threads=1024, repeat=1, warmup=0, progress=False)


def test_a_simulated_plot_says_so_in_its_title(stride_report, fake, tmp_path):
    ax = plot.stride(stride_report)
    name = fake.device(0).name.removesuffix(" (simulated)")
    assert ax.get_title().startswith(f"simulated ({name}): ")
    assert plot.save(ax, str(tmp_path / "s.png")) == str(tmp_path / "s.png")


def test_a_measured_plot_names_the_gpu(stride_report):
    env = {**stride_report.environment, "simulated": "", "device": {**stride_report.environment["device"],
                                                                   "name": "NVIDIA H100 80GB HBM3"}}
    measured = dataclasses.replace(stride_report, environment=env)
    assert simulated_label(env) == ""
    assert plot.stride(measured).get_title().startswith("NVIDIA H100 80GB HBM3: ")
