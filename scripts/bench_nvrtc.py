"""What compiling l2ctl's kernels at run time costs: the first use (NVRTC compiles the whole kernel set, in a
fresh process with an empty cache) against a later start (the entry read from the disk cache), each in its own
process so NVRTC's loading counts. On a GPU the process makes the kernels ready on the device as l2ctl.kernels
does on first use (compile or read, then cuLibraryLoadData); without one it makes the image for ``--arch``.

    python scripts/bench_nvrtc.py [--arch 90] [--repeats 3] [--json nvrtc.json]

Writes a JSON record: host, NVRTC (path, version), arch and image, and per repeat the seconds of the first use
and of the cached start (the call itself, and the whole process from interpreter start).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

# Run in a fresh interpreter: one kernel set made ready (on device 0 when there is a GPU), its info printed.
_CHILD = """
import json, sys, time
started = time.perf_counter()
from l2ctl import _core, _nvrtc
arch = int(sys.argv[1])
paths = _nvrtc.search_paths(_core.runtime_version() // 1000, _core.driver_version())
call = time.perf_counter()
if _core.device_count() > 0:
    info = _core.load_kernels(0, paths, _nvrtc.cache_location()[0])
else:
    info = _core.kernel_image(arch, False, paths, _nvrtc.cache_location()[0])[1]
done = time.perf_counter()
print(json.dumps({**info, "call_seconds": done - call, "process_seconds": done - started,
                  "device": _core.device_properties(0)["name"] if _core.device_count() > 0 else ""}))
"""


def _run(arch: int, cache: str) -> dict[str, Any]:
    env = {**os.environ, "L2CTL_CACHE_DIR": cache}
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _CHILD, str(arch)], capture_output=True, text=True, env=env,
                         timeout=600, check=True)
    info: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    info["wall_seconds"] = time.perf_counter() - started
    return info


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, default=90, help="the arch to compile for without a GPU (default 90)")
    parser.add_argument("--repeats", type=int, default=3, help="first uses and cached starts, each (default 3)")
    parser.add_argument("--json", default="", help="write the record here")
    args = parser.parse_args()
    first, cached = [], []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="l2ctl-cache-") as cache:
            first.append(_run(args.arch, cache))
            cached.append(_run(args.arch, cache))
    assert all(r["source"] == "compiled" for r in first) and all(r["source"] == "cache" for r in cached)
    last = first[-1]

    def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
        return {key: {"median": statistics.median(r[key] for r in runs), "runs": [r[key] for r in runs]}
                for key in ("seconds", "call_seconds", "process_seconds")}

    record = {"benchmark": "nvrtc_kernels", "host": platform.node(), "cpus": os.cpu_count(),
              "device": last["device"], "nvrtc": last["nvrtc"], "nvrtc_version": last["nvrtc_version"],
              "arch": last["arch"], "image": last["image"], "first_use": summary(first), "cached": summary(cached),
              "method": "each run a fresh process with L2CTL_CACHE_DIR in a new temporary directory (first use), "
                        "then again with that directory (cached); seconds: compiling or reading the entry; "
                        "call_seconds: load_kernels (GPU: with cuLibraryLoadData) or kernel_image; "
                        "process_seconds: from interpreter start, imports included"}
    for name in ("first_use", "cached"):
        s = record[name]
        print(f"{name:>9}: {s['seconds']['median']:.3f} s ({s['call_seconds']['median']:.3f} s the call, "
              f"{s['process_seconds']['median']:.3f} s the process) over {args.repeats}")
    print(f"NVRTC {record['nvrtc_version']} ({record['nvrtc']}), {record['image']} for arch {record['arch']}"
          f"{', ' + record['device'] if record['device'] else ''}, host {record['host']} ({record['cpus']} CPUs)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
