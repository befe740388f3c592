"""l2ctl's PEP 517 backend: scikit-build-core's, with one change so that the README's second `pip install`
compiles nothing.

scikit-build-core keeps `build-dir` between builds, but when a build runs from another isolated environment
(pip makes a new one at a random path for every install) it deletes the CMake cache and `CMakeFiles/`, the
compiled objects with them, because the cache may point into the old environment. l2ctl's configure
depends on nothing there that is not set again at every configure: scikit-build-core re-sets its module
and prefix paths, find_package searches again when a cached package directory has gone, and the headers
the build takes from the environment (pybind11's; CUDA's, from pip) are staged under the build directory
(build_support/l2ctl_cuda.py). So before a build the record of the environment is updated to this one.
Each CUDA flavour builds in its own directory, build/cu12-<wheel tag> or build/cu13-<wheel tag>, so switching
flavours recompiles neither."""

from __future__ import annotations

import glob
import json
import os
from typing import Any, Optional

import l2ctl_cuda
import scikit_build_core.cmake
from scikit_build_core.build import *  # noqa: F403 - every hook, as scikit-build-core defines them
from scikit_build_core.build import build_editable as _build_editable
from scikit_build_core.build import build_wheel as _build_wheel


def _keep_build_dirs() -> None:
    here = os.fspath(scikit_build_core.cmake.DIR)
    for path in glob.glob(os.path.join("build", "*", ".skbuild-info.json")):
        try:
            with open(path, encoding="utf-8") as f:
                info = json.load(f)
            if isinstance(info, dict) and info.get("skbuild_path") not in (None, here):
                info["skbuild_path"] = here
                with open(path, "w", encoding="utf-8") as f:
                    json.dump(info, f, indent=2)
        except (OSError, ValueError):
            pass  # scikit-build-core clears what it cannot read


def _settings(config_settings: Optional[dict[str, Any]]) -> dict[str, Any]:
    _keep_build_dirs()
    major, _ = l2ctl_cuda.flavour()
    return {"build-dir": f"build/cu{major}-{{wheel_tag}}", **(config_settings or {})}


def build_wheel(wheel_directory: str, config_settings: Optional[dict[str, Any]] = None,
                metadata_directory: Optional[str] = None) -> str:
    return _build_wheel(wheel_directory, _settings(config_settings), metadata_directory)


def build_editable(wheel_directory: str, config_settings: Optional[dict[str, Any]] = None,
                   metadata_directory: Optional[str] = None) -> str:
    return _build_editable(wheel_directory, _settings(config_settings), metadata_directory)
