"""Which CUDA runtime l2ctl is built against, and where its headers and static library come from. The one copy
of these rules, for both of the build's callers:

- the build backend (build_support/l2ctl_build_backend.py): the pip packages a build needs (``build_requires``)
  and the build directory;
- CMakeLists.txt: ``python l2ctl_cuda.py OUT.cmake STAGE_DIR`` writes the CMake settings.

One wheel serves every supported driver: it links the CUDA 12 runtime statically, which runs under drivers for
CUDA 12 (525.60.13 and newer) and for CUDA 13 (580.65.06 and newer); NVRTC and CUPTI are loaded at run time by
the driver's major (the ``[cu12]`` and ``[cu13]`` extras bring them). The CUDA 12 headers come from a system
toolkit of 12.8 or newer where one is installed (nvcc on PATH, CUDA_HOME, CUDA_PATH, /usr/local/cuda,
/usr/local/cuda-X.Y), else from NVIDIA's CUDA 12 pip packages, which an isolated build installs itself. A build
that finds neither (``--no-build-isolation`` beside a CUDA 13 toolkit only) takes CUDA 13's headers and runtime:
it runs under CUDA 13 drivers only, and says so. The pip packages are found on this interpreter's path
(sys.path), so an isolated build and ``--no-build-isolation`` with PYTHONPATH both work.
"""

from __future__ import annotations

import filecmp
import glob
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from typing import Mapping, Optional

#: The CUDA majors whose runtime the build can link, the one it prefers first (it serves both drivers).
MAJORS = (12, 13)
#: The oldest system toolkit of each major the build accepts: 12.8 brings the Blackwell targets, and the
#: runtime's versioned driver entry points (12.5) are needed by every build.
MINIMUM_TOOLKIT = {12: 12080, 13: 13000}

#: Per major: the pip packages whose headers and static runtime the build uses (12.9 is the first CUDA 12
#: runtime wheel that ships libcudart_static.a) and their directories under site-packages. The runtime's headers
#: include ``crt/host_defines.h``, which NVIDIA ships apart: in the nvcc wheel for CUDA 12 (its headers only are
#: used, never nvcc), in nvidia-cuda-crt for 13. (The run-time libraries, NVRTC and CUPTI, are pyproject.toml's
#: ``[cu12]`` and ``[cu13]`` extras.)
PIP = {
    12: {"build": ["nvidia-cuda-runtime-cu12>=12.9,<13", "nvidia-cuda-cupti-cu12>=12.9,<13",
                   "nvidia-cuda-nvcc-cu12>=12.9,<13"],
         "runtime": "nvidia.cuda_runtime", "cupti": "nvidia.cuda_cupti", "crt": "nvidia.cuda_nvcc"},
    13: {"build": ["nvidia-cuda-runtime>=13,<14", "nvidia-cuda-cupti>=13,<14", "nvidia-cuda-crt>=13,<14"],
         "runtime": "nvidia.cu13", "cupti": "nvidia.cu13", "crt": "nvidia.cu13"},
}


@dataclass
class Cuda:
    """Where the build takes CUDA from."""

    major: int
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
    return Cuda(version // 1000, f"the CUDA {version // 1000}.{version % 1000 // 10} toolkit at {root}", version,
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


def pip_cuda(major: int) -> Optional[Cuda]:
    """CUDA ``major``'s headers and static runtime from its pip packages, if this interpreter can import them."""
    runtime, cupti = _pip_dir(PIP[major]["runtime"]), _pip_dir(PIP[major]["cupti"])
    include = os.path.join(runtime, "include") if runtime else ""
    version = _header_version(include)
    cudart = os.path.join(runtime or "", "lib", "libcudart_static.a")
    crt = os.path.join(_pip_dir(PIP[major]["crt"]) or "", "include")
    if not version or version // 1000 != major or not os.path.exists(cudart) \
            or not os.path.exists(os.path.join(crt, "crt", "host_defines.h")):
        return None
    cupti_include = os.path.join(cupti, "include") if cupti else ""
    has_cupti = os.path.exists(os.path.join(cupti_include, "cupti_range_profiler.h"))
    return Cuda(major, f"the pip packages {', '.join(PIP[major]['build'])} ({runtime})", version,
                list(dict.fromkeys([include, crt])), cudart, cupti_include if has_cupti else None)


def toolkit_of(major: int, env: Mapping[str, str] = os.environ) -> Optional[Cuda]:
    """The first system toolkit of CUDA ``major`` new enough for the build."""
    return next((t for t in system_toolkits(env) if t.major == major and t.version >= MINIMUM_TOOLKIT[major]), None)


def build_requires(env: Mapping[str, str] = os.environ) -> list[str]:
    """The pip packages an isolated build installs: CUDA 12's, unless a CUDA 12 toolkit is installed."""
    return [] if toolkit_of(12, env) else list(PIP[12]["build"])


def find(env: Mapping[str, str] = os.environ) -> Cuda:
    """The CUDA the build takes, in the order of ``MAJORS``, each from a toolkit then from pip; raises with what
    to install when nothing fits."""
    for major in MAJORS:
        cuda = toolkit_of(major, env) or pip_cuda(major)
        if cuda is not None:
            return cuda
    raise LookupError(f"no CUDA headers found: `pip install {' '.join(PIP[12]['build'])}` (what an isolated build "
                      f"installs by itself), or install a CUDA toolkit ({MINIMUM_TOOLKIT[12] // 1000}."
                      f"{MINIMUM_TOOLKIT[12] % 1000 // 10} or newer)")


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
    """Writes the CMake settings of the build to ``out``: the CUDA major, the include directories, the static
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

    settings = {"L2CTL_CUDA_MAJOR": cuda.major, "L2CTL_CUDA_SOURCE": cuda.source,
                "L2CTL_CUDA_VERSION": cuda.version, "L2CTL_CUDA_INCLUDE_DIRS": ";".join(cuda.include_dirs),
                "L2CTL_CUDART_STATIC": cuda.cudart_static, "L2CTL_CUPTI_INCLUDE": cuda.cupti_include or "",
                "L2CTL_PYBIND11_INCLUDE": pybind11_include}
    with open(out, "w") as f:
        f.writelines(f"set({name} {quote(value)})\n" for name, value in settings.items())
    return cuda


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(f"usage: {sys.argv[0]} OUT.cmake STAGE_DIR")
    try:
        write_cmake(sys.argv[1], sys.argv[2])
    except (LookupError, ValueError) as error:
        sys.exit(f"l2ctl: {error}")
