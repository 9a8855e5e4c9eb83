// The portable scalar kernels: generic.hpp with one f32 lane per "vector" (std::fma for every FMA). Runs
// everywhere; the reference for what every other ISA must reproduce bit for bit.
#pragma once
#include "opt/kernels/prelude.hpp"

OPT_NAMESPACE_BEGIN
namespace kernels {
namespace scalar_isa {

struct Simd {
  static constexpr isa id = isa::scalar;
  static constexpr int W = 1;
  static constexpr int kMR = 1, kNP = 1;  // tile: 1 token x 1 panel (16 lanes unrolled; taller tiles cost compile time, not speed that matters here)
  static constexpr int kRegs = 1 << 20;   // not register-bound: no reordering needed
  static constexpr int kBf16PairPanels = 0;  // bf16 weights widened one vector at a time (load_bf16)
  static constexpr int np_for(int, int) { return 1; }
  static constexpr int kIntDecodeNp = 0;  // (np_for for every decode tile: see avx512.hpp)
  using V = float;
  static V zero() { return 0.0f; }
  static V set1(float v) { return v; }
  static V load(const float* p) { return *p; }
  static void store(float* p, V v) { *p = v; }
  static V mul(V a, V b) { return a * b; }
  static V add(V a, V b) { return a + b; }
  static V sub(V a, V b) { return a - b; }
  static V div(V a, V b) { return a / b; }
  static V fma(V a, V b, V c) { return std::fma(a, b, c); }
  static V max(V a, V b) { return a > b ? a : b; }
  static V min(V a, V b) { return a < b ? a : b; }
  static V select_lt(V a, V b, V t, V f) { return a < b ? t : f; }
  static V round_even(V x) { return std::nearbyint(x); }
  static V pow2i(V n) {
    const uint32_t u = uint32_t(int32_t(n) + 127) << 23;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  static V abs(V x) { return std::fabs(x); }
  static V copysign(V m, V s) { return std::copysign(m, s); }
  static void keep(V& v) { v = opaque(v); }
  static V load_f16(const uint16_t* p) { return opt::detail::f16_to_f32(*p); }
  static V load_bf16(const uint16_t* p) { return opt::detail::bf16_to_f32(*p); }
  static V load_i8(const int8_t* p) { return float(*p); }
  // one I4 panel column (8 bytes: row j in byte j's low nibble, row j + 8 in its high one, each q + 8) -> 16 q
  static void load_i4(const uint8_t* p, V* out) {
    for (int j = 0; j < 8; ++j) out[j] = float(int(p[j] & 15) - 8), out[j + 8] = float(int(p[j] >> 4) - 8);
  }
  static float reduce16(const V* a) {
    float b[8], c[4];
    for (int l = 0; l < 8; ++l) b[l] = a[l] + a[l + 8];
    for (int l = 0; l < 4; ++l) c[l] = b[l] + b[l + 4];
    return (c[0] + c[2]) + (c[1] + c[3]);
  }
  static void reduce16x4(const V* a, const V* b, const V* c, const V* d, float* r) {
    r[0] = reduce16(a), r[1] = reduce16(b), r[2] = reduce16(c), r[3] = reduce16(d);
  }
};

// No approximate int8 kernel here: LinearSeg::approximate runs the exact one.
inline bool linear_i8_approx(const float*, int64_t, const ops::LinearSeg&, int64_t, int64_t) { return false; }

#define OPT_K_NO_UNROLL 1
#include "opt/kernels/generic.hpp"
#undef OPT_K_NO_UNROLL

}  // namespace scalar_isa
}  // namespace kernels
OPT_NAMESPACE_END
