// aarch64 Advanced SIMD kernels: generic.hpp with 4 f32 lanes (a panel column is 4 vectors). NEON is part of
// ARMv8-A, so no target region is needed. The fp16-arithmetic and dot-product extensions are not used: f16 and
// int8 weights are widened to f32 exactly (vcvt / vmovl) and go through the same FMA chains as everywhere else.
#pragma once
#include "opt/kernels/prelude.hpp"

#if defined(OPT_HAVE_NEON_KERNELS)
#include <arm_neon.h>

OPT_NAMESPACE_BEGIN
namespace kernels {
namespace neon_isa {

struct Simd {
  static constexpr isa id = isa::neon;
  static constexpr int W = 4;
  static constexpr int kMR = 6, kNP = 1;  // 6 tokens x 1 panel: 24 accumulators of the 32 registers
  static constexpr int kRegs = 32;
  static constexpr int kBf16PairPanels = 0;  // bf16 weights widened one vector at a time (load_bf16)
  static constexpr int np_for(int m, int /*col_bytes*/) { return m <= 2 ? 2 : 1; }
  static constexpr int kIntDecodeNp = 0;  // (np_for for every decode tile: see avx512.hpp)
  using V = float32x4_t;
  static V zero() { return vdupq_n_f32(0.0f); }
  static V set1(float v) { return vdupq_n_f32(v); }
  static V load(const float* p) { return vld1q_f32(p); }
  static void store(float* p, V v) { vst1q_f32(p, v); }
  static V mul(V a, V b) { return vmulq_f32(a, b); }
  static V add(V a, V b) { return vaddq_f32(a, b); }
  static V sub(V a, V b) { return vsubq_f32(a, b); }
  static V div(V a, V b) { return vdivq_f32(a, b); }
  static V fma(V a, V b, V c) { return vfmaq_f32(c, a, b); }
  static V max(V a, V b) { return vbslq_f32(vcgtq_f32(a, b), a, b); }  // a > b ? a : b (as x86, not vmaxq's NaN rule)
  static V min(V a, V b) { return vbslq_f32(vcltq_f32(a, b), a, b); }  // a < b ? a : b
  static V select_lt(V a, V b, V t, V f) { return vbslq_f32(vcltq_f32(a, b), t, f); }
  static V round_even(V x) { return vrndnq_f32(x); }
  static V pow2i(V n) {
    return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23));
  }
  static V abs(V x) { return vabsq_f32(x); }
  static V copysign(V m, V s) { return vbslq_f32(vdupq_n_u32(0x80000000u), s, m); }
  static void keep(V& v) { __asm__("" : "+w"(v)); }
  static V load_f16(const uint16_t* p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
  static V load_bf16(const uint16_t* p) { return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16)); }
  static V load_i8(const int8_t* p) {
    int32_t four;
    std::memcpy(&four, p, 4);
    const int16x8_t h = vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(four)));
    return vcvtq_f32_s32(vmovl_s16(vget_low_s16(h)));
  }
  // one I4 panel column (8 bytes: row j in byte j's low nibble, row j + 8 in its high one, each q + 8): the 16
  // bytes [low nibbles | high nibbles] - 8, widened to four vectors of the integers q as f32 (rows 0-3 .. 12-15)
  static void load_i4(const uint8_t* p, V* out) {
    const uint8x8_t b = vld1_u8(p);
    const int8x16_t q =
        vsubq_s8(vreinterpretq_s8_u8(vcombine_u8(vand_u8(b, vdup_n_u8(15)), vshr_n_u8(b, 4))), vdupq_n_s8(8));
    const int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_s8(vget_high_s8(q));
    out[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo)));
    out[1] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo)));
    out[2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi)));
    out[3] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi)));
  }
  // lanes 0-3, 4-7, 8-11, 12-15 in a[0..3]: (l, l+8), (l, l+4), (l, l+2), (l, l+1)
  static float reduce16(const V* a) {
    const V b = vaddq_f32(vaddq_f32(a[0], a[2]), vaddq_f32(a[1], a[3]));
    const float32x2_t c = vadd_f32(vget_low_f32(b), vget_high_f32(b));
    return vget_lane_f32(c, 0) + vget_lane_f32(c, 1);
  }
  static void reduce16x4(const V* a, const V* b, const V* c, const V* d, float* r) {
    r[0] = reduce16(a), r[1] = reduce16(b), r[2] = reduce16(c), r[3] = reduce16(d);
  }
};

// No approximate int8 kernel here: LinearSeg::approximate runs the exact one.
inline bool linear_i8_approx(const float*, int64_t, const ops::LinearSeg&, int64_t, int64_t) { return false; }

#include "opt/kernels/generic.hpp"

}  // namespace neon_isa
}  // namespace kernels
OPT_NAMESPACE_END
#endif  // OPT_HAVE_NEON_KERNELS
