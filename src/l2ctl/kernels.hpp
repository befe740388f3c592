// Kernels that show the hardware. Every launcher takes the device and stream explicitly, checks the
// launch, and never synchronizes (timing stays with the caller). The device code (kernels.cu) is compiled by
// NVRTC: load_kernels(device, ...) makes it ready on a device, once per process, before any launch there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "l2ctl/nvrtc.hpp"

namespace l2ctl {

// Threads per block of the grid-stride kernels (their __launch_bounds__, set through NVRTC's options).
constexpr unsigned kBlockThreads = 256;

// Compiles (or reads from `cache_dir`) the kernels for `device`'s arch with the first acceptable NVRTC of
// `nvrtc` and loads them into its primary context; a second call for the device returns what the first did.
// An image the driver cannot load (PTX newer than the driver) throws KernelsUnavailable naming the versions.
KernelImage load_kernels(int device, const std::vector<std::string>& nvrtc, const std::string& cache_dir);

// Reset-data variants: out[i] = lut[i % lut_len] over 32-bit words.
enum class ResetVariant : int {
  plain = 0,       // plain loads and stores, roofline-shaped grid
  streaming = 1,   // st.global.cs stores (evict-first) for the output
  evict_last = 2,  // LUT loads with an L2 evict_last policy (createpolicy + .L2::cache_hint)
  hinted = 3,      // evict_last LUT loads and .cs stores together
  annotated = 4,   // LUT read through cuda::annotated_ptr<..., access_property::persisting>
  seed = 5,        // the source blog's shape: 32 blocks x 1024 threads, 64-bit i % n per element
  scalar = 6,      // plain, but 4-byte accesses only (the shape of the reference H100 measurements)
};

struct LaunchShape {
  unsigned blocks = 0;
  unsigned threads = 0;
  bool vector_out = false;  // 16-byte stores
  bool vector_lut = false;  // 16-byte LUT loads
};

LaunchShape reset_data(int device, std::uintptr_t stream, std::uintptr_t out, std::size_t out_len, std::uintptr_t lut,
                       std::size_t lut_len, ResetVariant variant, unsigned blocks_per_sm);
// Mismatches between out and lut repeated; runs and waits on `stream`.
unsigned long long reset_data_verify(int device, std::uintptr_t stream, std::uintptr_t out, std::size_t out_len,
                                     std::uintptr_t lut, std::size_t lut_len);

// Fills words with their own index (buf[i] = i as uint32), 16-byte stores where aligned: also the
// write-only ceiling kernel.
void write_index(int device, std::uintptr_t stream, std::uintptr_t buf, std::size_t len);
unsigned long long count_index_mismatches(int device, std::uintptr_t stream, std::uintptr_t buf, std::size_t len);
// 16-byte copy of len words (the copy ceiling kernel).
void copy_words(int device, std::uintptr_t stream, std::uintptr_t dst, std::uintptr_t src, std::size_t len);
unsigned long long count_mismatches(int device, std::uintptr_t stream, std::uintptr_t a, std::uintptr_t b,
                                    std::size_t len);
// Sums len words into one partial per block (the read ceiling kernel); returns the number of
// partials written to `partials` (which must hold max_read_partials(device) uint64 values).
unsigned read_sum(int device, std::uintptr_t stream, std::uintptr_t buf, std::size_t len, std::uintptr_t partials);
unsigned max_read_partials(int device);

// Thread t loads word t * stride_words (one 4-byte load per thread); each block writes the sum of
// its loads to partials[block]. Returns the number of blocks (partials written).
unsigned stride_read(int device, std::uintptr_t stream, std::uintptr_t buf, std::size_t threads,
                     unsigned stride_words, std::uintptr_t partials, unsigned block_threads);
unsigned long long sum_u64(int device, std::uintptr_t stream, std::uintptr_t values, std::size_t count);

// The cache-streaming document's two scenarios; `streaming` selects ld.global.cs for the data
// read once.
void sparse_vector(int device, std::uintptr_t stream, std::uintptr_t values, std::uintptr_t indices,
                   std::uintptr_t dense, std::size_t dense_len, std::uintptr_t result, std::size_t len, bool streaming);
void stream_analysis(int device, std::uintptr_t stream, std::uintptr_t data, std::uintptr_t categories,
                     std::uintptr_t weights, std::size_t weights_len, std::uintptr_t results, std::size_t len,
                     bool streaming);

}  // namespace l2ctl
