// What generic.hpp needs before an ISA header includes it inside its namespace (it includes nothing itself).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "opt/detail/fp16.hpp"
#include "opt/error.hpp"
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

// Software prefetch of f32 weights, a tuning choice by CPU (prefetches never change a result). decode: whether
// decode tiles prefetch f32 weights (the other types always do); stream_bytes: how far ahead in each stream of
// a panel group the f32 tiles ask (0: the default distance of generic.hpp, prefetch_distance). Measured with 2
// threads on opt-125m, whole decode tokens in alternating runs:
// - AMD Zen 5: prefetching f32 made a token 1.05x as long: off.
// - Intel Xeon with AVX-512 and AMX (Sapphire Rapids generation), AVX-512 kernels: prefetching at the default
//   distance (4 KiB a stream: 32 columns of a 2-panel group) made a token 0.96-0.98x as long (5 of 5 pairs),
//   512 bytes ahead 0.85-0.91x (17.1-17.5 -> 14.8-15.6 ms) and a batch-4 step 0.82-0.85x; a 512-token prefill
//   did not change. A GEMV of 512 MiB on 2 threads there read 27-28 GB/s with 512-bit loads and no prefetch,
//   35-36 with it 512 bytes ahead, 28 with it 4 KiB ahead. The 16-bit and integer types keep their distances
//   (shorter ones made them slower there).
// OPT_PREFETCH_F32=off|BYTES (1 .. 1048576) overrides the choice (for measuring); any other value is an
// opt::config_error, raised where the kernels are chosen (dispatch.hpp table_for), as OPT_ISA's are.
struct F32Prefetch {
  bool decode = false;
  int64_t stream_bytes = 0;
};

// The choice for a CPU (intel: cpu_is_intel()) and an OPT_PREFETCH_F32 value (null: unset).
inline F32Prefetch parse_f32_prefetch(const char* value, bool intel) {
  F32Prefetch r;
  if (intel) r.decode = true, r.stream_bytes = 512;
  if (!value) return r;
  if (std::strcmp(value, "off") == 0) return F32Prefetch{};
  char* end = nullptr;
  const long long v = std::strtoll(value, &end, 10);
  if (end == value || *end != 0 || v < 1 || v > (1 << 20))
    throw config_error(std::string("OPT_PREFETCH_F32=") + value +
                       ": expected off or a number of bytes from 1 to 1048576");
  r.decode = true, r.stream_bytes = v;
  return r;
}

// cpu_is_intel(), asked once.
inline bool on_intel() {
  static const bool intel = cpu_is_intel();
  return intel;
}

// This process's choice, made once (a config_error, on every call, while OPT_PREFETCH_F32 is bad).
inline const F32Prefetch& f32_prefetch() {
  static const F32Prefetch p = parse_f32_prefetch(std::getenv("OPT_PREFETCH_F32"), on_intel());
  return p;
}

}  // namespace kernels
OPT_NAMESPACE_END
