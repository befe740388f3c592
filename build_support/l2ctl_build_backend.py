"""l2ctl's PEP 517 backend: scikit-build-core's, with two changes: an isolated build installs the CUDA 12
headers it needs (build_support/l2ctl_cuda.py, ``build_requires``), and the README's second `pip install`
compiles nothing.

scikit-build-core keeps `build-dir` between builds, but when a build runs from another isolated environment
(pip makes a new one at a random path for every install) it deletes the CMake cache and `CMakeFiles/`, the
compiled objects with them, because the cache may point into the old environment. l2ctl's configure
depends on nothing there that is not set again at every configure: scikit-build-core re-sets its module
and prefix paths, find_package searches again when a cached package directory has gone, and the headers
the build takes from the environment (pybind11's; CUDA's, from pip) are staged under the build directory
(build_support/l2ctl_cuda.py). So before a build the record of the environment is updated to this one.
A build against each CUDA major has its own directory, build/cu12-<wheel tag> (the wheel's) or build/cu13-<wheel
tag> (a source build beside a CUDA 13 toolkit only), so switching between them recompiles neither."""

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
from scikit_build_core.build import get_requires_for_build_editable as _requires_editable
from scikit_build_core.build import get_requires_for_build_wheel as _requires_wheel


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
    try:
        major = l2ctl_cuda.find().major
    except LookupError:  # CMake's configure says what to install
        major = l2ctl_cuda.MAJORS[0]
    return {"build-dir": f"build/cu{major}-{{wheel_tag}}", **(config_settings or {})}


def get_requires_for_build_wheel(config_settings: Optional[dict[str, Any]] = None) -> list[str]:
    return [*_requires_wheel(config_settings), *l2ctl_cuda.build_requires()]


def get_requires_for_build_editable(config_settings: Optional[dict[str, Any]] = None) -> list[str]:
    return [*_requires_editable(config_settings), *l2ctl_cuda.build_requires()]


def build_wheel(wheel_directory: str, config_settings: Optional[dict[str, Any]] = None,
                metadata_directory: Optional[str] = None) -> str:
    return _build_wheel(wheel_directory, _settings(config_settings), metadata_directory)


def build_editable(wheel_directory: str, config_settings: Optional[dict[str, Any]] = None,
                   metadata_directory: Optional[str] = None) -> str:
    return _build_editable(wheel_directory, _settings(config_settings), metadata_directory)
