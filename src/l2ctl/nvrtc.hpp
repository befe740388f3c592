// NVRTC, loaded at run time (dlopen: never linked, so the module imports where it is missing), and the image of
// l2ctl's kernels it makes for an arch: compiled once, then read from a cache on disk.
#pragma once

#include <string>
#include <vector>

namespace l2ctl {

struct KernelImage {
  std::string data;         // CUBIN, or PTX text (NUL-terminated either way, as the driver wants PTX)
  int arch = 0;             // the arch it is for (sm_<arch> CUBIN, or compute_<arch> PTX)
  bool cubin = false;
  bool from_cache = false;
  double seconds = 0;       // compiling, or reading the cache entry
  std::string cache_file;   // the entry read or written; "" without a cache directory
  std::string cache_note;   // why the cache was not used ("" when it was)
  std::string nvrtc_path;
  int nvrtc_major = 0;
  int nvrtc_minor = 0;
};

// l2ctl's kernels for a GPU of compute capability `arch` (e.g. 90): CUBIN for that arch when NVRTC knows it, else
// PTX for the highest arch it knows below `arch` (the driver JIT-compiles it); `ptx` asks for PTX in any case.
// Read from `cache_dir` when an intact entry is there (key: the embedded source, NVRTC's version, the arch, the options,
// l2ctl's version), else compiled and written there atomically; an unreadable or corrupt entry is compiled
// again, an unwritable directory only costs the cache (cache_note says why). "" disables the cache. Only what the
// effective user alone can have written is used: an absolute `cache_dir` it owns, not writable by group or others
// (missing directories are made 0700), holding entries alike that are regular files of at most 64 MiB; anything
// else is compiled instead, writes nothing in a refused directory, and cache_note says why.
KernelImage kernel_image(int arch, bool ptx, const std::vector<std::string>& nvrtc, const std::string& cache_dir);

}  // namespace l2ctl
