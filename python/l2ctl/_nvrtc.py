"""Where l2ctl looks for NVRTC, which compiles its kernels at run time, and where it keeps what NVRTC made.

The C++ core loads the first acceptable candidate (``_core.load_kernels``); these rules only name the places.
Nothing here touches a device or opens a library.
"""

from __future__ import annotations

import glob
import os
import pwd
import sys
from collections.abc import Mapping, Sequence
from typing import Optional

__all__ = ["search_paths", "cache_location", "toolkits", "LIBRARY_DIRS"]

LIBRARY_DIRS = ("lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib")


def toolkits(env: Mapping[str, str]) -> list[str]:
    """CUDA toolkit roots, NVRTC's and CUPTI's: $CUDA_HOME, $CUDA_PATH, /usr/local/cuda, versioned installs newest
    first, /opt/cuda."""
    versioned = sorted(glob.glob("/usr/local/cuda-*"), key=lambda p: [int(x) for x in p.rsplit("-", 1)[1].split(".")
                                                                       if x.isdigit()], reverse=True)
    return [r for r in (env.get("CUDA_HOME"), env.get("CUDA_PATH"), "/usr/local/cuda", *versioned, "/opt/cuda") if r]


def search_paths(built_major: int, driver_version: int, environ: Optional[Mapping[str, str]] = None,
                 sys_path: Optional[Sequence[str]] = None) -> list[str]:
    """Candidates for libnvrtc, most preferred first. ``$L2CTL_NVRTC`` alone when set (a path the user chose is
    never silently replaced). Else for the CUDA major l2ctl was built for (``built_major``), then for each newer
    one the driver supports (``driver_version``, e.g. 12080): the pip wheels on ``sys.path``
    (``nvidia/cu13/lib`` for CUDA 13, ``nvidia/cuda_nvrtc/lib`` for CUDA 12), the system toolkit
    (``$CUDA_HOME``, ``$CUDA_PATH``, ``/usr/local/cuda``, ...), then the loader's own search
    (``libnvrtc.so.<major>``: ``LD_LIBRARY_PATH``, ldconfig)."""
    env = os.environ if environ is None else environ
    if env.get("L2CTL_NVRTC"):
        return [env["L2CTL_NVRTC"]]
    entries = sys.path if sys_path is None else sys_path
    majors = [built_major, *range(built_major + 1, driver_version // 1000 + 1)]
    found: list[str] = []
    for major in majors:
        name = f"libnvrtc.so.{major}"
        for entry in filter(None, entries):
            found += [os.path.join(entry, "nvidia", f"cu{major}", "lib", name),
                      os.path.join(entry, "nvidia", "cuda_nvrtc", "lib", name)]
        for root in toolkits(env):
            found += [os.path.join(root, sub, name) for sub in LIBRARY_DIRS]
        found.append(name)
    return list(dict.fromkeys(found))  # once each, in order


def cache_location(environ: Optional[Mapping[str, str]] = None) -> tuple[str, str]:
    """Where compiled kernels are kept, and why there is no cache when that is "": ``$L2CTL_CACHE_DIR`` (empty: no
    cache), else ``$XDG_CACHE_HOME/l2ctl``, else ``$HOME/.cache/l2ctl`` (the passwd entry's home when ``$HOME`` is
    unset or relative). Only absolute paths: a relative one names another directory in every working directory, so
    a relative ``$XDG_CACHE_HOME`` is ignored (as the XDG spec says) and a relative ``$L2CTL_CACHE_DIR`` or no
    absolute home means no cache."""
    env = os.environ if environ is None else environ
    if "L2CTL_CACHE_DIR" in env:
        chosen = env["L2CTL_CACHE_DIR"]
        return (chosen, "") if os.path.isabs(chosen) else (
            "", f"L2CTL_CACHE_DIR={chosen!r} is not an absolute path" if chosen else "L2CTL_CACHE_DIR is empty")
    if os.path.isabs(env.get("XDG_CACHE_HOME", "")):
        return os.path.join(env["XDG_CACHE_HOME"], "l2ctl"), ""
    home = env.get("HOME", "")
    if not os.path.isabs(home):
        try:
            home = pwd.getpwuid(os.geteuid()).pw_dir
        except KeyError:  # a uid without a passwd entry (containers)
            home = ""
    if os.path.isabs(home):
        return os.path.join(home, ".cache", "l2ctl"), ""
    return "", f"no absolute home directory (HOME={env.get('HOME')!r}, none in uid {os.geteuid()}'s passwd entry)"
