// Scalar IEEE half (F16) and bfloat16 (BF16) <-> float conversions, round-to-nearest-even like torch. Internal.
#pragma once
#include <cstdint>
#include <cstring>

#include "opt/version.hpp"

OPT_NAMESPACE_BEGIN
namespace detail {

inline uint32_t f32_bits(float f) noexcept {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_f32(uint32_t u) noexcept {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float bf16_to_f32(uint16_t h) noexcept { return bits_f32(uint32_t(h) << 16); }

inline uint16_t f32_to_bf16(float f) noexcept {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // NaN stays a (quiet) NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                         // round to nearest even
  return uint16_t(u >> 16);
}

inline float f16_to_f32(uint16_t h) noexcept {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (man << 13));  // Inf / NaN
  if (exp == 0) {
    if (man == 0) return bits_f32(sign);
    // subnormal: value = man * 2^-24
    float v = float(man) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

inline uint16_t f32_to_f16(float f) noexcept {
  uint32_t u = f32_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // overflow (>= 65520 rounds to Inf) or Inf
  if (a < 0x38800000u) {                                  // below the smallest normal half: subnormal or zero
    // value in units of 2^-24, rounded to nearest even
    float v = bits_f32(a) * 16777216.0f;
    uint32_t q = uint32_t(v);
    float rem = v - float(q);
    if (rem > 0.5f || (rem == 0.5f && (q & 1u))) ++q;
    return uint16_t(sign | q);
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - (112u << 23);  // rebias and round to nearest even
  return uint16_t(sign | (r >> 13));
}

}  // namespace detail
OPT_NAMESPACE_END
