// Instruction sets the kernels are built for, which of them this build holds and which this CPU runs.
//   scalar  portable C++ (std::fma), every machine
//   avx2    x86-64 AVX2 + FMA + F16C
//   avx512  x86-64 AVX-512 F/BW/VL (+ the above)
//   neon    aarch64 Advanced SIMD
// Every program holds the x86 or ARM kernels whatever its -march; the CPU is asked at run time (GCC/Clang's
// __builtin_cpu_supports, which also checks that the OS saves the vector registers).
#pragma once
#include <optional>
#include <string_view>

#include "opt/version.hpp"

// Define before including any opt header to leave ISAs out of a build (each costs compile time in every
// translation unit that runs the kernels): OPT_NO_SIMD (scalar only), OPT_DISABLE_AVX2, OPT_DISABLE_AVX512,
// OPT_DISABLE_NEON. The scalar kernels are always there.
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__)) && !defined(OPT_NO_SIMD)
#define OPT_HAVE_X86_KERNELS 1
#include <cpuid.h>
#if !defined(OPT_DISABLE_AVX2)
#define OPT_HAVE_AVX2_KERNELS 1
#endif
#if !defined(OPT_DISABLE_AVX512)
#define OPT_HAVE_AVX512_KERNELS 1
#endif
#endif
#if defined(__aarch64__) && defined(__ARM_NEON) && !defined(OPT_NO_SIMD) && !defined(OPT_DISABLE_NEON)
#define OPT_HAVE_NEON_KERNELS 1
#endif

OPT_NAMESPACE_BEGIN
namespace kernels {

enum class isa { scalar, avx2, avx512, neon };

inline const char* to_string(isa i) noexcept {
  switch (i) {
    case isa::scalar: return "scalar";
    case isa::avx2: return "avx2";
    case isa::avx512: return "avx512";
    case isa::neon: return "neon";
  }
  return "?";
}

inline std::optional<isa> isa_from_string(std::string_view s) noexcept {
  for (isa i : {isa::scalar, isa::avx2, isa::avx512, isa::neon})
    if (s == to_string(i)) return i;
  return std::nullopt;
}

// Whether this build holds the kernels of `i` (the instruction set belongs to the target architecture and was
// not left out).
inline bool compiled(isa i) noexcept {
  switch (i) {
    case isa::scalar: return true;
#if defined(OPT_HAVE_AVX2_KERNELS)
    case isa::avx2: return true;
#endif
#if defined(OPT_HAVE_AVX512_KERNELS)
    case isa::avx512: return true;
#endif
#if defined(OPT_HAVE_NEON_KERNELS)
    case isa::neon: return true;
#endif
    default: return false;
  }
}

#if defined(OPT_HAVE_X86_KERNELS)
namespace detail {
// F16C (CPUID.1:ECX bit 29); Clang's __builtin_cpu_supports does not know the name
inline bool cpu_has_f16c() noexcept {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && ((c >> 29) & 1u);
}
}  // namespace detail
#endif

// Whether this CPU (and OS) runs `i`'s kernels.
inline bool cpu_supports(isa i) noexcept {
  if (!compiled(i)) return false;
  switch (i) {
    case isa::scalar: return true;
#if defined(OPT_HAVE_X86_KERNELS)
    case isa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && detail::cpu_has_f16c();
    case isa::avx512:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && detail::cpu_has_f16c() &&
             __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl");
#endif
#if defined(OPT_HAVE_NEON_KERNELS)
    case isa::neon: return true;  // Advanced SIMD is part of ARMv8-A
#endif
    default: return false;
  }
}

// Whether this CPU has the int8 dot products (AVX-512 VNNI) and byte permutes (VBMI) of the opt-in approximate
// int8 kernel (ops::LinearSeg::approximate); false off x86.
inline bool cpu_has_int8_dot() noexcept {
#if defined(OPT_HAVE_X86_KERNELS)
  static const bool ok = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi");
  return ok;
#else
  return false;
#endif
}

// Whether the CPU is Intel's (CPUID vendor "GenuineIntel"); false off x86. A tuning fact (prelude.hpp
// f32_prefetch), never a correctness one: every ISA gives the same bits on every vendor.
inline bool cpu_is_intel() noexcept {
#if defined(OPT_HAVE_X86_KERNELS)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
  return b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu;  // "Genu" "ineI" "ntel"
#else
  return false;
#endif
}

// The fastest ISA this CPU runs.
inline isa best_isa() noexcept {
  for (isa i : {isa::avx512, isa::avx2, isa::neon})
    if (cpu_supports(i)) return i;
  return isa::scalar;
}

}  // namespace kernels
OPT_NAMESPACE_END
