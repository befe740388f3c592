// l2ctl/cache_hints.cuh: typed global-memory loads and stores with explicit cache operators, and L2
// eviction-priority policies. Header-only; include it from any CUDA C++ translation unit
// (python -c "import l2ctl; print(l2ctl.get_include())" gives the include directory).
//
//   #include <l2ctl/cache_hints.cuh>
//   float4 v = l2ctl::hints::load<l2ctl::hints::load_op::cs>(p);        // ld.global.cs.v4.f32
//   l2ctl::hints::store<l2ctl::hints::store_op::cs>(q, v);               // st.global.cs.v4.f32
//   auto policy = l2ctl::hints::make_policy<l2ctl::hints::evict::last>(); // createpolicy (sm_80+)
//   int x = l2ctl::hints::load_with_policy(lut + i, policy);            // ld.global.L2::cache_hint
//
// Load operators (PTX ISA "cache operators"): ca (cache at all levels), cg (L2 only), cs (streaming,
// evict first), lu (last use), cv (do not cache, fetch again). Store operators: wb (write back),
// cg (L2 only), cs (streaming), wt (write through).
// Types: int, unsigned, float and their 2- and 4-wide vectors; long long, unsigned long long, double
// and their 2-wide vectors. A thread moves at most 16 bytes per access before sm_100, so 4-wide
// 64-bit vectors are not offered.
// L2 eviction policies need sm_80; on older targets make_policy returns 0 and the *_with_policy
// functions compile to plain accesses, so code using them builds for every architecture.
// Needs no other header (policies are unsigned long long, 64 bits), so NVRTC compiles it too.
#pragma once

#if !defined(__CUDACC__)
#error "l2ctl/cache_hints.cuh is CUDA C++: compile it with nvcc (or clang in CUDA mode)"
#endif

namespace l2ctl {
namespace hints {

enum class load_op { ca, cg, cs, lu, cv };
enum class store_op { wb, cg, cs, wt };
enum class evict { first, last, normal };

template <load_op Op, class T>
__device__ T load(const T* address);
template <store_op Op, class T>
__device__ void store(T* address, T value);

#define L2CTL_HINTS_LOAD1(OP, T, PTX, C)                                                   \
  template <>                                                                              \
  __device__ __forceinline__ T load<load_op::OP, T>(const T* address) {                    \
    T v;                                                                                   \
    asm volatile("ld.global." #OP "." PTX " %0, [%1];" : "=" C(v) : "l"(address) : "memory"); \
    return v;                                                                              \
  }
#define L2CTL_HINTS_LOAD2(OP, T, PTX, C)                                                                   \
  template <>                                                                                              \
  __device__ __forceinline__ T load<load_op::OP, T>(const T* address) {                                    \
    T v;                                                                                                   \
    asm volatile("ld.global." #OP ".v2." PTX " {%0, %1}, [%2];" : "=" C(v.x), "=" C(v.y) : "l"(address) : "memory"); \
    return v;                                                                                              \
  }
#define L2CTL_HINTS_LOAD4(OP, T, PTX, C)                                                         \
  template <>                                                                                    \
  __device__ __forceinline__ T load<load_op::OP, T>(const T* address) {                          \
    T v;                                                                                         \
    asm volatile("ld.global." #OP ".v4." PTX " {%0, %1, %2, %3}, [%4];"                          \
                 : "=" C(v.x), "=" C(v.y), "=" C(v.z), "=" C(v.w)                                \
                 : "l"(address)                                                                  \
                 : "memory");                                                                    \
    return v;                                                                                    \
  }
#define L2CTL_HINTS_STORE1(OP, T, PTX, C)                                                  \
  template <>                                                                              \
  __device__ __forceinline__ void store<store_op::OP, T>(T * address, T v) {               \
    asm volatile("st.global." #OP "." PTX " [%0], %1;" ::"l"(address), C(v) : "memory");   \
  }
#define L2CTL_HINTS_STORE2(OP, T, PTX, C)                                                             \
  template <>                                                                                         \
  __device__ __forceinline__ void store<store_op::OP, T>(T * address, T v) {                          \
    asm volatile("st.global." #OP ".v2." PTX " [%0], {%1, %2};" ::"l"(address), C(v.x), C(v.y) : "memory"); \
  }
#define L2CTL_HINTS_STORE4(OP, T, PTX, C)                                                       \
  template <>                                                                                   \
  __device__ __forceinline__ void store<store_op::OP, T>(T * address, T v) {                    \
    asm volatile("st.global." #OP ".v4." PTX " [%0], {%1, %2, %3, %4};" ::"l"(address), C(v.x), \
                 C(v.y), C(v.z), C(v.w)                                                         \
                 : "memory");                                                                   \
  }

#define L2CTL_HINTS_ALL_LOADS(W, T, PTX, C) \
  L2CTL_HINTS_LOAD##W(ca, T, PTX, C) L2CTL_HINTS_LOAD##W(cg, T, PTX, C) L2CTL_HINTS_LOAD##W(cs, T, PTX, C) \
  L2CTL_HINTS_LOAD##W(lu, T, PTX, C) L2CTL_HINTS_LOAD##W(cv, T, PTX, C)
#define L2CTL_HINTS_ALL_STORES(W, T, PTX, C) \
  L2CTL_HINTS_STORE##W(wb, T, PTX, C) L2CTL_HINTS_STORE##W(cg, T, PTX, C) \
  L2CTL_HINTS_STORE##W(cs, T, PTX, C) L2CTL_HINTS_STORE##W(wt, T, PTX, C)
#define L2CTL_HINTS_TYPE(W, T, PTX, C) L2CTL_HINTS_ALL_LOADS(W, T, PTX, C) L2CTL_HINTS_ALL_STORES(W, T, PTX, C)

// Every type offered: (vector width, type, PTX type, asm constraint), for the hinted and the policy accesses.
#define L2CTL_HINTS_EACH_TYPE(X)                                                                               \
  X(1, int, "s32", "r")                                                                                        \
  X(1, unsigned int, "u32", "r")                                                                               \
  X(1, float, "f32", "f")                                                                                      \
  X(2, int2, "s32", "r")                                                                                       \
  X(2, uint2, "u32", "r")                                                                                      \
  X(2, float2, "f32", "f")                                                                                     \
  X(4, int4, "s32", "r")                                                                                       \
  X(4, uint4, "u32", "r")                                                                                      \
  X(4, float4, "f32", "f")                                                                                     \
  X(1, long long, "s64", "l")                                                                                  \
  X(1, unsigned long long, "u64", "l")                                                                         \
  X(1, double, "f64", "d")                                                                                     \
  X(2, longlong2, "s64", "l")                                                                                  \
  X(2, ulonglong2, "u64", "l")                                                                                 \
  X(2, double2, "f64", "d")
L2CTL_HINTS_EACH_TYPE(L2CTL_HINTS_TYPE)

#undef L2CTL_HINTS_TYPE
#undef L2CTL_HINTS_ALL_STORES
#undef L2CTL_HINTS_ALL_LOADS
#undef L2CTL_HINTS_STORE4
#undef L2CTL_HINTS_STORE2
#undef L2CTL_HINTS_STORE1
#undef L2CTL_HINTS_LOAD4
#undef L2CTL_HINTS_LOAD2
#undef L2CTL_HINTS_LOAD1

// True where the L2 eviction-priority policy instructions (createpolicy, .L2::cache_hint) exist.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define L2CTL_HINTS_HAVE_L2_POLICY 1
#else
#define L2CTL_HINTS_HAVE_L2_POLICY 0
#endif

// A 64-bit L2 cache policy: lines touched with it get priority E for the given fraction of accesses
// (the rest evict_unchanged). Build it once per thread, outside loops.
template <evict E>
__device__ __forceinline__ unsigned long long make_policy(float fraction = 1.0f) {
  unsigned long long policy = 0;
#if L2CTL_HINTS_HAVE_L2_POLICY
  if constexpr (E == evict::last) {
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, %1;" : "=l"(policy) : "f"(fraction));
  } else if constexpr (E == evict::first) {
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, %1;" : "=l"(policy) : "f"(fraction));
  } else {
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, %1;" : "=l"(policy) : "f"(fraction));
  }
#else
  (void)fraction;
#endif
  return policy;
}

template <class T>
__device__ T load_with_policy(const T* address, unsigned long long policy);
template <class T>
__device__ void store_with_policy(T* address, T value, unsigned long long policy);

#if L2CTL_HINTS_HAVE_L2_POLICY
#define L2CTL_HINTS_PLOAD1(T, PTX, C)                                                                    \
  template <>                                                                                            \
  __device__ __forceinline__ T load_with_policy<T>(const T* a, unsigned long long p) {                        \
    T v;                                                                                                 \
    asm volatile("ld.global.L2::cache_hint." PTX " %0, [%1], %2;" : "=" C(v) : "l"(a), "l"(p) : "memory"); \
    return v;                                                                                            \
  }                                                                                                      \
  template <>                                                                                            \
  __device__ __forceinline__ void store_with_policy<T>(T * a, T v, unsigned long long p) {                    \
    asm volatile("st.global.L2::cache_hint." PTX " [%0], %1, %2;" ::"l"(a), C(v), "l"(p) : "memory");    \
  }
#define L2CTL_HINTS_PLOAD2(T, PTX, C)                                                                      \
  template <>                                                                                              \
  __device__ __forceinline__ T load_with_policy<T>(const T* a, unsigned long long p) {                          \
    T v;                                                                                                   \
    asm volatile("ld.global.L2::cache_hint.v2." PTX " {%0, %1}, [%2], %3;"                                 \
                 : "=" C(v.x), "=" C(v.y) : "l"(a), "l"(p) : "memory");                                    \
    return v;                                                                                              \
  }                                                                                                        \
  template <>                                                                                              \
  __device__ __forceinline__ void store_with_policy<T>(T * a, T v, unsigned long long p) {                      \
    asm volatile("st.global.L2::cache_hint.v2." PTX " [%0], {%1, %2}, %3;" ::"l"(a), C(v.x), C(v.y), "l"(p) \
                 : "memory");                                                                              \
  }
#define L2CTL_HINTS_PLOAD4(T, PTX, C)                                                                   \
  template <>                                                                                           \
  __device__ __forceinline__ T load_with_policy<T>(const T* a, unsigned long long p) {                       \
    T v;                                                                                                \
    asm volatile("ld.global.L2::cache_hint.v4." PTX " {%0, %1, %2, %3}, [%4], %5;"                      \
                 : "=" C(v.x), "=" C(v.y), "=" C(v.z), "=" C(v.w) : "l"(a), "l"(p) : "memory");         \
    return v;                                                                                           \
  }                                                                                                     \
  template <>                                                                                           \
  __device__ __forceinline__ void store_with_policy<T>(T * a, T v, unsigned long long p) {                   \
    asm volatile("st.global.L2::cache_hint.v4." PTX " [%0], {%1, %2, %3, %4}, %5;" ::"l"(a), C(v.x),    \
                 C(v.y), C(v.z), C(v.w), "l"(p)                                                         \
                 : "memory");                                                                           \
  }
#else
#define L2CTL_HINTS_PLAIN(T)                                                                                   \
  template <>                                                                                                  \
  __device__ __forceinline__ T load_with_policy<T>(const T* a, unsigned long long) { return *a; }                  \
  template <>                                                                                                  \
  __device__ __forceinline__ void store_with_policy<T>(T * a, T v, unsigned long long) { *a = v; }
#define L2CTL_HINTS_PLOAD1(T, PTX, C) L2CTL_HINTS_PLAIN(T)
#define L2CTL_HINTS_PLOAD2(T, PTX, C) L2CTL_HINTS_PLAIN(T)
#define L2CTL_HINTS_PLOAD4(T, PTX, C) L2CTL_HINTS_PLAIN(T)
#endif

#define L2CTL_HINTS_PLOAD(W, T, PTX, C) L2CTL_HINTS_PLOAD##W(T, PTX, C)
L2CTL_HINTS_EACH_TYPE(L2CTL_HINTS_PLOAD)

#undef L2CTL_HINTS_EACH_TYPE
#undef L2CTL_HINTS_PLOAD
#undef L2CTL_HINTS_PLOAD1
#undef L2CTL_HINTS_PLOAD2
#undef L2CTL_HINTS_PLOAD4
#ifdef L2CTL_HINTS_PLAIN
#undef L2CTL_HINTS_PLAIN
#endif

}  // namespace hints
}  // namespace l2ctl
