// What generic.hpp needs before an ISA header includes it inside its namespace (it includes nothing itself).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "opt/detail/fp16.hpp"
#include "opt/kernels/table.hpp"

// Each ISA's table() is an inline function, compiled in every translation unit that runs a kernel; in the one
// that includes compiled.hpp (OPT_KERNELS_IMPLEMENTATION) it is an ordinary one, for the others of its program
// to call (OPT_KERNELS_EXTERN, dispatch.hpp).
#if defined(OPT_KERNELS_IMPLEMENTATION)
#define OPT_KERNEL_TABLE_LINKAGE
#else
#define OPT_KERNEL_TABLE_LINKAGE inline
#endif

OPT_NAMESPACE_BEGIN
namespace kernels {

// A float the compiler must treat as unknown: stops it fusing the product that made it into a later addition
// (GCC contracts a * b + c by default where FMA exists, across statements too).
inline float opaque(float v) noexcept {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  __asm__("" : "+x"(v));
#elif defined(__GNUC__) && defined(__aarch64__)
  __asm__("" : "+w"(v));
#else
  volatile float t = v;
  v = t;
#endif
  return v;
}

// __builtin_prefetch (for reading, with temporal locality `Locality`) that the compiler keeps: GCC 12 deleted
// loops whose body was only __builtin_prefetch (the tiles' prefetching of a group column and their warm-up went,
// and with them the prefetching of the 5-8 token and prefill tiles: a 9-token pass of opt-125m took 1.4x as long;
// the benchmark floors' prefetched read variants read exactly as the plain one). The empty asm that uses the
// address is a side effect the optimizer must keep; it emits nothing.
template <int Locality>
inline __attribute__((always_inline)) void prefetch_kept(const void* a) {
  __builtin_prefetch(a, 0, Locality);
  __asm__ volatile("" : : "r"(a));
}

}  // namespace kernels
OPT_NAMESPACE_END
