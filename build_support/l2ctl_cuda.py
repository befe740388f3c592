"""Which CUDA l2ctl is built for (its flavour: CUDA 12 or CUDA 13), and where the headers and the static CUDA
runtime of that flavour come from. The one copy of these rules, for both of the build's callers:

- scikit-build-core's dynamic metadata (pyproject.toml, ``[[tool.dynamic-metadata]]``): the wheel's version
  ``+cu12``/``+cu13``, its ``[ctk]`` extra, and the pip packages the build needs when no system toolkit of the
  flavour is present (``get_requires_for_dynamic_metadata``);
- CMakeLists.txt: ``python l2ctl_cuda.py OUT.cmake STAGE_DIR`` writes the CMake settings.

The flavour: ``L2CTL_CUDA=12|13`` when set, else the major of the first system toolkit found, else the CUDA
version of the local driver, else 13. A system toolkit of the flavour's major (12.8 or newer for 12) is used
where present: nvcc on PATH, CUDA_HOME, CUDA_PATH, /usr/local/cuda, /usr/local/cuda-X.Y; else the flavour's
pip packages, found on this interpreter's path (sys.path), so an isolated build and ``--no-build-isolation``
with PYTHONPATH both work.
"""

from __future__ import annotations

import ctypes
import filecmp
import glob
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from typing import Mapping, Optional

FLAVOURS = (12, 13)
#: The oldest system toolkit of each major the build accepts: 12.8 brings the Blackwell targets, and the
#: runtime's versioned driver entry points (12.5) are needed by every flavour.
MINIMUM_TOOLKIT = {12: 12080, 13: 13000}

#: Per flavour: the pip packages whose headers and static runtime the build uses (12.9 is the first CUDA 12
#: runtime wheel that ships libcudart_static.a), their directories under site-packages, and the run-time
#: extra ``[ctk]`` (NVRTC for the kernels, CUPTI for the counters: both loaded at run time, neither needed by
#: ``import l2ctl`` nor by the simulator). The runtime's headers include ``crt/host_defines.h``, which NVIDIA
#: ships apart: in the nvcc wheel for CUDA 12 (its headers only are used, never nvcc), in nvidia-cuda-crt for 13.
PIP = {
    12: {"build": ["nvidia-cuda-runtime-cu12>=12.9,<13", "nvidia-cuda-cupti-cu12>=12.9,<13",
                   "nvidia-cuda-nvcc-cu12>=12.9,<13"],
         "ctk": ["nvidia-cuda-nvrtc-cu12>=12.9,<13", "nvidia-cuda-cupti-cu12>=12.9,<13"],
         "runtime": "nvidia.cuda_runtime", "cupti": "nvidia.cuda_cupti", "crt": "nvidia.cuda_nvcc"},
    13: {"build": ["nvidia-cuda-runtime>=13,<14", "nvidia-cuda-cupti>=13,<14", "nvidia-cuda-crt>=13,<14"],
         "ctk": ["nvidia-cuda-nvrtc>=13,<14", "nvidia-cuda-cupti>=13,<14"],
         "runtime": "nvidia.cu13", "cupti": "nvidia.cu13", "crt": "nvidia.cu13"},
}


@dataclass
class Cuda:
    """Where the build takes CUDA from."""

    flavour: int
    why: str  # how the flavour was chosen
    source: str  # "system toolkit at ..." or "pip packages ..."
    version: int  # CUDART_VERSION of the headers, e.g. 12090
    include_dirs: list[str] = field(default_factory=list)
    cudart_static: str = ""
    cupti_include: Optional[str] = None


def _header_version(include: str) -> Optional[int]:
    try:
        with open(os.path.join(include, "cuda_runtime_api.h"), encoding="latin-1") as f:
            found = re.search(r"#define\s+CUDART_VERSION\s+(\d+)", f.read())
    except OSError:
        return None
    return int(found.group(1)) if found else None


def _first(paths: list[str]) -> Optional[str]:
    return next((p for p in paths if os.path.exists(p)), None)


def _toolkit(root: str) -> Optional[Cuda]:
    """The toolkit installed at ``root``, if it has the runtime's headers and static library."""
    targets = sorted(glob.glob(os.path.join(root, "targets", "*-linux")))
    include = _first([os.path.join(d, "include", "cuda_runtime_api.h") for d in [root, *targets]])
    cudart = _first([os.path.join(d, lib, "libcudart_static.a") for d in [root, *targets] for lib in ("lib64", "lib")])
    version = _header_version(os.path.dirname(include)) if include else None
    if not (include and cudart and version):
        return None
    cupti = _first([os.path.join(d, "cupti_range_profiler.h") for d in
                    [os.path.dirname(include), os.path.join(root, "extras", "CUPTI", "include")]])
    return Cuda(version // 1000, "", f"the CUDA {version // 1000}.{version % 1000 // 10} toolkit at {root}", version,
                [os.path.dirname(include)], cudart, os.path.dirname(cupti) if cupti else None)


def system_toolkits(env: Mapping[str, str]) -> list[Cuda]:
    """The system toolkits, in the order they are looked for (each root once)."""
    roots: list[str] = []
    nvcc = shutil.which("nvcc", path=env.get("PATH", os.defpath))
    if nvcc:
        roots.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    roots += [env[v] for v in ("CUDA_HOME", "CUDA_PATH") if env.get(v)]
    versioned = glob.glob("/usr/local/cuda-*")
    versioned.sort(key=lambda p: [int(n) for n in re.findall(r"\d+", os.path.basename(p))], reverse=True)
    roots += ["/usr/local/cuda", *versioned]
    found = (_toolkit(r) for r in dict.fromkeys(os.path.realpath(r) for r in roots))
    return [t for t in found if t]


def driver_cuda_version() -> Optional[int]:
    """The CUDA version of the installed driver (cuDriverGetVersion, e.g. 12080), or None without one."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int(0)
        return version.value if libcuda.cuDriverGetVersion(ctypes.byref(version)) == 0 and version.value else None
    except (OSError, AttributeError):
        return None


def flavour(env: Mapping[str, str] = os.environ) -> tuple[int, str]:
    """The flavour to build and why."""
    explicit = env.get("L2CTL_CUDA", "").strip()
    if explicit:
        if explicit not in {str(f) for f in FLAVOURS}:
            raise ValueError(f"L2CTL_CUDA={explicit!r}: the flavours are {', '.join(map(str, FLAVOURS))}")
        return int(explicit), "L2CTL_CUDA"
    for toolkit in system_toolkits(env):
        if toolkit.flavour in FLAVOURS:
            return toolkit.flavour, toolkit.source
    driver = driver_cuda_version()
    if driver:
        return (13 if driver >= 13000 else 12), f"the driver's CUDA {driver // 1000}.{driver % 1000 // 10}"
    return 13, "the default (no CUDA toolkit or driver found)"


def _pip_dir(module: str) -> Optional[str]:
    """The folder of NVIDIA's pip package ``module`` (``nvidia.cuda_runtime``) on this interpreter's path, the
    first in path order, as an import would find it. The path is read, nothing is imported: NVIDIA's packages
    are namespace packages, and importing them caches their locations in sys.modules (a later search, in the
    build or in a test that changes sys.path, would then see the first answer, or fail to recompute it)."""
    parts = module.split(".")
    for entry in sys.path:
        folder = os.path.join(entry or os.getcwd(), *parts)
        if os.path.isdir(folder):
            return folder
    return None


def pip_cuda(flavour: int) -> Optional[Cuda]:
    """The flavour's headers and static runtime from its pip packages, if this interpreter can import them."""
    runtime, cupti = _pip_dir(PIP[flavour]["runtime"]), _pip_dir(PIP[flavour]["cupti"])
    include = os.path.join(runtime, "include") if runtime else ""
    version = _header_version(include)
    cudart = os.path.join(runtime or "", "lib", "libcudart_static.a")
    crt = os.path.join(_pip_dir(PIP[flavour]["crt"]) or "", "include")
    if not version or version // 1000 != flavour or not os.path.exists(cudart) \
            or not os.path.exists(os.path.join(crt, "crt", "host_defines.h")):
        return None
    cupti_include = os.path.join(cupti, "include") if cupti else ""
    has_cupti = os.path.exists(os.path.join(cupti_include, "cupti_range_profiler.h"))
    return Cuda(flavour, "", f"the pip packages {', '.join(PIP[flavour]['build'])} ({runtime})", version,
                list(dict.fromkeys([include, crt])), cudart, cupti_include if has_cupti else None)


def needs_pip(flavour: int, env: Mapping[str, str] = os.environ) -> bool:
    return not any(t.flavour == flavour and t.version >= MINIMUM_TOOLKIT[flavour] for t in system_toolkits(env))


def find(env: Mapping[str, str] = os.environ) -> Cuda:
    """The flavour and where its CUDA comes from; raises with what to install when nothing fits."""
    major, why = flavour(env)
    toolkit = next((t for t in system_toolkits(env) if t.flavour == major and t.version >= MINIMUM_TOOLKIT[major]), None)
    cuda = toolkit or pip_cuda(major)
    if cuda is None:
        raise LookupError(f"no CUDA {major} headers found (flavour chosen by {why}): install the CUDA {major} toolkit "
                          f"({MINIMUM_TOOLKIT[major] // 1000}.{MINIMUM_TOOLKIT[major] % 1000 // 10} or newer) or "
                          f"`pip install {' '.join(PIP[major]['build'])}`, or pick the other flavour with L2CTL_CUDA")
    cuda.why = why
    return cuda


def stage(source: str, destination: str) -> str:
    """Copies the tree ``source`` to ``destination``, rewriting only files whose content changed, and returns
    ``destination``. pip's isolated build environments live at a new random path each time: compiling against
    the copy keeps every compile command, and so the build directory's objects, valid from one build to the
    next."""
    for directory, _, files in os.walk(source):
        target = os.path.join(destination, os.path.relpath(directory, source))
        os.makedirs(target, exist_ok=True)
        for name in files:
            src, dst = os.path.join(directory, name), os.path.join(target, name)
            if not (os.path.exists(dst) and filecmp.cmp(src, dst, shallow=False)):
                shutil.copyfile(src, dst)
    return destination


def write_cmake(out: str, stage_dir: str) -> Cuda:
    """Writes the CMake settings of the build to ``out``: the flavour, the include directories, the static
    runtime and CUPTI's headers, staged under ``stage_dir`` when they come from the build environment."""
    cuda = find()
    if cuda.source.startswith("the pip packages"):
        # one folder for them all (the runtime's headers and crt/), as a toolkit's include/ holds them
        cuda.include_dirs = list(dict.fromkeys(stage(d, os.path.join(stage_dir, "cuda-include"))
                                               for d in cuda.include_dirs))
        if cuda.cupti_include:
            cuda.cupti_include = stage(cuda.cupti_include, os.path.join(stage_dir, "cupti-include"))
        os.makedirs(os.path.join(stage_dir, "lib"), exist_ok=True)
        cudart = os.path.join(stage_dir, "lib", "libcudart_static.a")
        if not (os.path.exists(cudart) and filecmp.cmp(cuda.cudart_static, cudart, shallow=False)):
            shutil.copyfile(cuda.cudart_static, cudart)
        cuda.cudart_static = cudart
    try:
        import pybind11  # the build requirement; staged for the same reason
        pybind11_include = stage(pybind11.get_include(), os.path.join(stage_dir, "pybind11-include"))
    except ImportError:
        pybind11_include = ""

    def quote(value: object) -> str:
        return '"' + str(value).replace("\\", "/").replace('"', '\\"') + '"'

    settings = {"L2CTL_CUDA_FLAVOUR": cuda.flavour, "L2CTL_CUDA_WHY": cuda.why, "L2CTL_CUDA_SOURCE": cuda.source,
                "L2CTL_CUDA_VERSION": cuda.version, "L2CTL_CUDA_INCLUDE_DIRS": ";".join(cuda.include_dirs),
                "L2CTL_CUDART_STATIC": cuda.cudart_static, "L2CTL_CUPTI_INCLUDE": cuda.cupti_include or "",
                "L2CTL_PYBIND11_INCLUDE": pybind11_include}
    with open(out, "w") as f:
        f.writelines(f"set({name} {quote(value)})\n" for name, value in settings.items())
    return cuda


# ---- scikit-build-core's dynamic-metadata hooks ----------------------------------------------------------


def dynamic_metadata(settings: Mapping[str, object], project: Mapping[str, object]) -> dict[str, object]:
    """The version gets the flavour as a local label (``0.1.0+cu12``, as torch names its wheels) and the
    ``[ctk]`` extra the flavour's NVRTC and CUPTI packages."""
    major, _ = flavour()
    return {"version": f"{settings['base-version']}+cu{major}", "optional-dependencies": {"ctk": PIP[major]["ctk"]}}


def get_requires_for_dynamic_metadata(settings: Mapping[str, object]) -> list[str]:
    """The flavour's pip packages when no system toolkit of its major is present."""
    major, _ = flavour()
    return PIP[major]["build"] if needs_pip(major) else []


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(f"usage: {sys.argv[0]} OUT.cmake STAGE_DIR")
    try:
        write_cmake(sys.argv[1], sys.argv[2])
    except (LookupError, ValueError) as error:
        sys.exit(f"l2ctl: {error}")
