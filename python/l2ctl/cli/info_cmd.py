"""``l2ctl info``: the devices, their L2 properties, the current set-aside and whether persistence works."""

from __future__ import annotations

import argparse
from typing import Any

import l2ctl

from .. import _backend
from .exitcodes import EXIT_OK, EXIT_UNSUPPORTED
from .options import CSV, DEVICE, JSON, QUIET, SIMULATE, Option
from .output import NO_GPU_HINT, format_bytes, note, simulated_line, write_table
from .parsing import Command

__all__ = ["cmd_info", "INFO"]


def cmd_info(args: argparse.Namespace) -> int:
    count = l2ctl.device_count()
    if count == 0:
        note(f"no CUDA device: {_backend.current().device_count_error() or 'none visible'}; {NO_GPU_HINT}")
        return EXIT_UNSUPPORTED
    v = l2ctl.versions()
    simulated = _backend.simulated()
    print(f"l2ctl {l2ctl.__version__} (for drivers {l2ctl.minimum_driver(v['runtime'])} and newer), "
          f"CUDA driver {v['driver'] // 1000}.{v['driver'] % 1000 // 10}, "
          f"runtime {v['runtime'] // 1000}.{v['runtime'] % 1000 // 10}, {count} device(s)"
          f"{simulated_line(simulated)}")
    rows: list[dict[str, Any]] = []
    for d in range(count) if args.device is None else [args.device]:
        info = l2ctl.device_info(d)
        probe = info.supports_persistence and args.probe
        gran = l2ctl.set_aside_granularity(d) if probe else info.set_aside_granularity
        rounding = l2ctl.set_aside_rounding(d) if gran else None
        print(f"\ndevice {info.index}: {info.name} (cc {info.compute_capability[0]}.{info.compute_capability[1]}, "
              f"{info.multiprocessor_count} SMs, {info.pci_bus_id})")
        sizes = {"l2CacheSize": info.l2_cache_size, "persistingL2CacheMaxSize": info.persisting_l2_cache_max_size,
                 "accessPolicyMaxWindowSize": info.access_policy_max_window_size,
                 "current set-aside limit": info.persisting_l2_cache_size}
        for label, size in sizes.items():
            print(f"  {label:<31}{size:>13,} B  ({format_bytes(size)})")
        if gran:
            print(f"  set-aside granularity          {gran:>13,} B  (requests are rounded {rounding} to multiples)")
        print(f"  persistence supported          "
              f"{'yes' if info.supports_persistence else 'no: ' + str(info.unsupported_reason)}")
        rows.append({"index": info.index, "name": info.name, "simulated": simulated,
                     "compute_capability": f"{info.compute_capability[0]}.{info.compute_capability[1]}",
                     "multiprocessor_count": info.multiprocessor_count, "pci_bus_id": info.pci_bus_id,
                     "l2_cache_size": info.l2_cache_size,
                     "persisting_l2_cache_max_size": info.persisting_l2_cache_max_size,
                     "access_policy_max_window_size": info.access_policy_max_window_size,
                     "set_aside_limit": info.persisting_l2_cache_size, "set_aside_granularity": gran or None,
                     "set_aside_rounding": rounding, "supports_persistence": info.supports_persistence,
                     "unsupported_reason": info.unsupported_reason})
    write_table(args.json, args.csv, {"l2ctl_version": l2ctl.__version__,
                                      "minimum_driver": l2ctl.minimum_driver(v["runtime"]),
                                      "driver_version": v["driver"],
                                      "runtime_version": v["runtime"], "simulated": simulated, "devices": rows}, rows)
    return EXIT_OK


INFO = Command("info", "devices, L2 properties, current set-aside, support",
               (DEVICE.but(help="show only this device", shown_default="every device"),
                Option("--probe", "measure the set-aside granularity (sets the limit, then restores it)", False,
                       "off: the granularity known for the device, if any", switch=True),
                JSON.but(help="write the devices and versions as JSON"),
                CSV.but(help="write one CSV row per device"),
                QUIET.but(help="accepted as by every command; info shows no progress"), SIMULATE), cmd_info)
