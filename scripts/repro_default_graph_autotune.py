"""Reproduces issue 42's open defect (H200, torch 2.11, 2026-11-28, commit 2a4ea0c): the bench's default-graph form
(scripts/bench_autotune_torch.py: a 134 M-update scatter captured in torch.cuda.CUDAGraph() with torch's defaults,
a twin outside any block and the app's graph inside torch_captures()) replays right on its own, but the first call
of ``l2ctl.autotune`` on it is followed by "an illegal memory access". Each piece of that first call, tried alone on
the same graph (scratch checks: torch's memory history, making the graph trees, a torch_captures() block, the CUPTI
recorder's warm-up and recorded runs, windows through the captures and a started scope), left it right; the GPU
test of the same form at 16 M updates passes. Run on a GPU:

    python scripts/repro_default_graph_autotune.py
"""

import os
import sys

import torch

import l2ctl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_autotune_torch import make_form  # noqa: E402


def main() -> None:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        form = make_form("default-graph", torch.cuda.current_device())
        form.step()
        print("the graph alone:", "right" if form.check() else "WRONG", flush=True)
        tuned = l2ctl.autotune(form.step)
        for call in range(1, 201):
            tuned()
            if call in (1, 4, 10, 40, 80, 200):
                print(f"after autotune's call {call} ({tuned.report()[0].phase}):",
                      "right" if form.check() else "WRONG", flush=True)
        tuned.stop()


if __name__ == "__main__":
    main()
