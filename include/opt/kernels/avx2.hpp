// x86-64 AVX2 + FMA + F16C kernels: generic.hpp with 8 f32 lanes (a panel column is 2 vectors). Compiled in a
// target region whatever the program's -march, run only where the CPU has the instructions (dispatch.hpp).
#pragma once
#include "opt/kernels/prelude.hpp"

#if defined(OPT_HAVE_AVX2_KERNELS)
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

OPT_NAMESPACE_BEGIN
namespace kernels {
namespace avx2_isa {

struct Simd {
  static constexpr isa id = isa::avx2;
  static constexpr int W = 8;
  static constexpr int kMR = 6, kNP = 1;  // 6 tokens x 1 panel: 12 accumulators of the 16 registers
  static constexpr int kRegs = 16;
  static constexpr int np_for(int m, int /*col_bytes*/) { return m == 1 ? 4 : m == 2 ? 2 : 1; }
  static constexpr int kIntDecodeNp = 0;  // (np_for for every decode tile: see avx512.hpp)
  using V = __m256;
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float v) { return _mm256_set1_ps(v); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }  // a > b ? a : b
  static V min(V a, V b) { return _mm256_min_ps(a, b); }  // a < b ? a : b
  static V select_lt(V a, V b, V t, V f) { return _mm256_blendv_ps(f, t, _mm256_cmp_ps(a, b, _CMP_LT_OQ)); }
  static V round_even(V x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static V pow2i(V n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  static V abs(V x) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x); }
  static V copysign(V m, V s) {
    const V sign = _mm256_set1_ps(-0.0f);
    return _mm256_or_ps(_mm256_andnot_ps(sign, m), _mm256_and_ps(sign, s));
  }
  static void keep(V& v) { __asm__("" : "+x"(v)); }
  static V load_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static V load_bf16(const uint16_t* p) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
  }
  static V load_i8(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  // bf16 weights a panel column at a time (32 bytes, rows 0-15), one instruction a vector where load_bf16 takes
  // two: each dword holds rows 2i and 2i + 1, the low half shifted up is row 2i as f32, the high half masked is row
  // 2i + 1. So even = rows 0, 2, .., 14, odd = rows 1, 3, .., 15: the same values, in other lanes (generic.hpp).
  static constexpr int kBf16PairPanels = 1;
  static void load_bf16_pair(const uint16_t* p, V& even, V& odd) {
    const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    even = _mm256_castsi256_ps(_mm256_slli_epi32(d, 16));
    odd = _mm256_castsi256_ps(_mm256_and_si256(d, _mm256_set1_epi32(int32_t(0xffff0000u))));
  }
  // (even, odd) to rows 0-7, rows 8-15; rows_to_bf16_pair the inverse
  static void bf16_pair_to_rows(V& a, V& b) {
    const V lo = _mm256_unpacklo_ps(a, b);  // rows 0-3 | 8-11
    const V hi = _mm256_unpackhi_ps(a, b);  // rows 4-7 | 12-15
    a = _mm256_permute2f128_ps(lo, hi, 0x20), b = _mm256_permute2f128_ps(lo, hi, 0x31);
  }
  static void rows_to_bf16_pair(V& a, V& b) {
    const V lo = _mm256_permute2f128_ps(a, b, 0x20);  // rows 0-3 | 8-11
    const V hi = _mm256_permute2f128_ps(a, b, 0x31);  // rows 4-7 | 12-15
    a = _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0)), b = _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1));
  }
  // one I4 panel column (8 bytes: row j in byte j's low nibble, row j + 8 in its high one, each q + 8): rows 0-7
  // in out[0], 8-15 in out[1], each lane the integer q as f32. Six instructions and no conversion (the GEMV is
  // bound by them): with z = the byte zero-extended and b = z | 0x4B000000,
  //   low nibble l:   b & 0x4B00000F is the float 2^23 + l (mantissa unit 1),          minus (2^23 + 8) = l - 8
  //   high nibble h:  b & 0x490000F0 is the float 2^19 + 16 h / 16 (mantissa unit 1/16), minus (2^19 + 8) = h - 8
  // every step exact (the results are small integers). b is kept opaque, or GCC rewrites (z | e) & m as
  // (z & m) | e (one instruction more); the two subtrahends come from memory (folded into the subtractions), so
  // the GEMV tile's 8 accumulators, the broadcast input and the 3 masks fit the 16 registers.
  static void load_i4(const uint8_t* p, V* out) {
    alignas(32) static const float sub[2][8] = {{8388616.0f, 8388616.0f, 8388616.0f, 8388616.0f, 8388616.0f,
                                                 8388616.0f, 8388616.0f, 8388616.0f},
                                                {524296.0f, 524296.0f, 524296.0f, 524296.0f, 524296.0f, 524296.0f,
                                                 524296.0f, 524296.0f}};
    const float* s = &sub[0][0];
    __asm__("" : "+r"(s));  // not hoisted into registers
    __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    b = _mm256_or_si256(b, _mm256_set1_epi32(0x4B000000));
    __asm__("" : "+x"(b));
    const V lo = _mm256_castsi256_ps(_mm256_and_si256(b, _mm256_set1_epi32(0x4B00000F)));
    const V hi = _mm256_castsi256_ps(_mm256_and_si256(b, _mm256_set1_epi32(0x490000F0)));
    out[0] = _mm256_sub_ps(lo, _mm256_load_ps(s));
    out[1] = _mm256_sub_ps(hi, _mm256_load_ps(s + 8));
  }
  // lanes 0-7 in a[0], 8-15 in a[1]: (l, l+8), (l, l+4), (l, l+2), (l, l+1)
  static float reduce16(const V* a) {
    const __m256 t = _mm256_add_ps(a[0], a[1]);
    const __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    const __m128 w = _mm_add_ps(u, _mm_movehl_ps(u, u));
    return _mm_cvtss_f32(_mm_add_ss(w, _mm_movehdup_ps(w)));
  }
  // reduce16 of four sums at once, the same additions in the same tree: r[i] = reduce16(a_i)
  static void reduce16x4(const V* a, const V* b, const V* c, const V* d, float* r) {
    const __m256 ta = _mm256_add_ps(a[0], a[1]), tb = _mm256_add_ps(b[0], b[1]);
    const __m256 tc = _mm256_add_ps(c[0], c[1]), td = _mm256_add_ps(d[0], d[1]);
    // (l, l+4): [a 0-3 | b 0-3] + [a 4-7 | b 4-7], the same for c, d
    const __m256 ab = _mm256_add_ps(_mm256_permute2f128_ps(ta, tb, 0x20), _mm256_permute2f128_ps(ta, tb, 0x31));
    const __m256 cd = _mm256_add_ps(_mm256_permute2f128_ps(tc, td, 0x20), _mm256_permute2f128_ps(tc, td, 0x31));
    // (l, l+2): [a0 a1 c0 c1 | b0 b1 d0 d1] + [a2 a3 c2 c3 | b2 b3 d2 d3]
    const __m256 e = _mm256_add_ps(_mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
    // (l, l+1): [a c a c | b d b d]
    const __m256 f = _mm256_add_ps(_mm256_shuffle_ps(e, e, _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm256_shuffle_ps(e, e, _MM_SHUFFLE(3, 1, 3, 1)));
    _mm_storeu_ps(r, _mm_unpacklo_ps(_mm256_castps256_ps128(f), _mm256_extractf128_ps(f, 1)));  // [a b c d]
  }
};

// No approximate int8 kernel here: LinearSeg::approximate runs the exact one.
inline bool linear_i8_approx(const float*, int64_t, const ops::LinearSeg&, int64_t, int64_t) { return false; }

#include "opt/kernels/generic.hpp"

}  // namespace avx2_isa
}  // namespace kernels
OPT_NAMESPACE_END

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif  // OPT_HAVE_AVX2_KERNELS
