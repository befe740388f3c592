"""``l2ctl info``: the devices, their L2 properties, the current set-aside and whether persistence works."""

from __future__ import annotations

import argparse

from .exitcodes import EXIT_OK, EXIT_UNSUPPORTED
from .options import DEVICE, Option
from .output import fmt_bytes, note
from .parsing import Command

__all__ = ["cmd_info", "INFO"]


def cmd_info(args: argparse.Namespace) -> int:
    import l2ctl

    from .. import _backend

    count = l2ctl.device_count()
    if count == 0:
        note(f"no CUDA device: {_backend.current().device_count_error() or 'none visible'}")
        return EXIT_UNSUPPORTED
    v = l2ctl.versions()
    print(f"l2ctl {l2ctl.__version__}, CUDA driver {v['driver'] // 1000}.{v['driver'] % 1000 // 10}, "
          f"runtime {v['runtime'] // 1000}.{v['runtime'] % 1000 // 10}, {count} device(s)")
    for d in range(count) if args.device is None else [args.device]:
        info = l2ctl.device_info(d)
        probe = info.supports_persistence and args.probe
        gran = l2ctl.set_aside_granularity(d) if probe else info.set_aside_granularity
        print(f"\ndevice {info.index}: {info.name} (cc {info.compute_capability[0]}.{info.compute_capability[1]}, "
              f"{info.multiprocessor_count} SMs, {info.pci_bus_id})")
        for label, size in (("l2CacheSize", info.l2_cache_size),
                            ("persistingL2CacheMaxSize", info.persisting_l2_cache_max_size),
                            ("accessPolicyMaxWindowSize", info.access_policy_max_window_size),
                            ("current set-aside limit", info.persisting_l2_cache_size)):
            print(f"  {label:<31}{size:>13,} B  ({fmt_bytes(size)})")
        if gran:
            rounding = l2ctl.set_aside_rounding(d)
            print(f"  set-aside granularity          {gran:>13,} B  (requests are rounded {rounding} to multiples)")
        print(f"  persistence supported          "
              f"{'yes' if info.supports_persistence else 'no: ' + str(info.unsupported_reason)}")
    return EXIT_OK


INFO = Command("info", "devices, L2 properties, current set-aside, support",
               (DEVICE.but(help="show only this device", shown_default="every device"),
                Option("--probe", "measure the set-aside granularity (sets the limit, then restores it)", False,
                       "off: the granularity known for the device, if any", switch=True)), cmd_info)
