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

}  // namespace kernels
OPT_NAMESPACE_END
