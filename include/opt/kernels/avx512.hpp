// x86-64 AVX-512 (F, BW, VL) kernels: generic.hpp with 16 f32 lanes (a panel column is one vector). Compiled in a
// target region whatever the program's -march, run only where the CPU has the instructions (dispatch.hpp).
// VNNI and AVX512-BF16 dot products are not used: they round differently from an f32 FMA chain and would break
// the same-bits-on-every-ISA promise.
#pragma once
#include "opt/kernels/prelude.hpp"

#if defined(OPT_HAVE_AVX512_KERNELS)
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
// GCC 12 reports its own _mm512_undefined_ps() inside the AVX-512 intrinsics headers as maybe-uninitialized.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

OPT_NAMESPACE_BEGIN
namespace kernels {
namespace avx512_isa {

struct Simd {
  static constexpr isa id = isa::avx512;
  static constexpr int W = 16;
  static constexpr int kMR = 8, kNP = 2;  // 8 tokens x 2 panels: 16 accumulators of the 32 registers
  static constexpr int kRegs = 32;
  // panels of a decode tile of m tokens whose weights take col_bytes a panel column. 16-bit weights (32 bytes)
  // at 1-2 tokens: 4 panels, not 8; on Zen 5 the 8-panel GEMV read 46-55 GB/s there against 52-59 with 4 (the
  // 50272 x 768 LM head, 2 threads, interleaved runs), while f32 and int8 read more with 8.
  static constexpr int np_for(int m, int col_bytes) { return m <= 2 ? (col_bytes == 32 ? 4 : 8) : m <= 4 ? 4 : 2; }
  using V = __m512;
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float v) { return _mm512_set1_ps(v); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }  // a > b ? a : b
  static V min(V a, V b) { return _mm512_min_ps(a, b); }  // a < b ? a : b
  static V select_lt(V a, V b, V t, V f) { return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), f, t); }
  static V round_even(V x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static V pow2i(V n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
  static V abs(V x) {
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff)));
  }
  static V copysign(V m, V s) {
    const __m512i mag = _mm512_and_si512(_mm512_castps_si512(m), _mm512_set1_epi32(0x7fffffff));
    const __m512i sgn = _mm512_and_si512(_mm512_castps_si512(s), _mm512_set1_epi32(int32_t(0x80000000u)));
    return _mm512_castsi512_ps(_mm512_or_si512(mag, sgn));
  }
  static void keep(V& v) { __asm__("" : "+v"(v)); }
  static V load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static V load_bf16(const uint16_t* p) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
  }
  static V load_i8(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  // one I4 panel column (8 bytes: row j in byte j's low nibble, row j + 8 in its high one, each q + 8) to one
  // vector of the integers q as f32, in three vector instructions: the 8 bytes twice, widened to 16 dwords; lanes
  // 8-15 shifted right by 4; then a lookup of q + 8 (vpermps reads only an index's low 4 bits) in the 16 floats
  // -8 .. 7. The values are exact, as cvtdq2ps's were: the same bits.
  static void load_i4(const uint8_t* p, V* out) {
    int64_t q;
    std::memcpy(&q, p, 8);
    const __m512i d = _mm512_cvtepu8_epi32(_mm_set1_epi64x(q));
    const __m512i n = _mm512_srlv_epi32(d, _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4));
    out[0] = _mm512_permutexvar_ps(n, _mm512_setr_ps(-8.f, -7.f, -6.f, -5.f, -4.f, -3.f, -2.f, -1.f, 0.f, 1.f,
                                                     2.f, 3.f, 4.f, 5.f, 6.f, 7.f));
  }
  // (l, l+8), (l, l+4), (l, l+2), (l, l+1)
  static float reduce16(const V* a) {
    const __m256 lo = _mm512_castps512_ps256(a[0]);
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[0]), 1));
    const __m256 t = _mm256_add_ps(lo, hi);
    const __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    const __m128 w = _mm_add_ps(u, _mm_movehl_ps(u, u));
    return _mm_cvtss_f32(_mm_add_ss(w, _mm_movehdup_ps(w)));
  }
  // reduce16 of four sums at once, the same additions in the same tree: r[i] = reduce16(a_i), in 15 instructions
  // where four reduce16 take 32 (the scores of prefill attention were bound by them)
  static void reduce16x4(const V* a, const V* b, const V* c, const V* d, float* r) {
    // (l, l+8): 128-bit blocks [a0 a1 b0 b1] + [a2 a3 b2 b3], the same for c, d
    const V ab = _mm512_add_ps(_mm512_shuffle_f32x4(a[0], b[0], _MM_SHUFFLE(1, 0, 1, 0)),
                               _mm512_shuffle_f32x4(a[0], b[0], _MM_SHUFFLE(3, 2, 3, 2)));
    const V cd = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], d[0], _MM_SHUFFLE(1, 0, 1, 0)),
                               _mm512_shuffle_f32x4(c[0], d[0], _MM_SHUFFLE(3, 2, 3, 2)));
    // (l, l+4): [a b c d] low halves + high halves, one block each
    const V e = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
    // (l, l+2), then (l, l+1), within each block
    const V f = _mm512_add_ps(e, _mm512_permute_ps(e, _MM_SHUFFLE(3, 2, 3, 2)));
    const V g = _mm512_add_ps(f, _mm512_movehdup_ps(f));
    const V s = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), g);
    _mm_storeu_ps(r, _mm512_castps512_ps128(s));
  }
};

#include "opt/kernels/generic.hpp"

}  // namespace avx512_isa
}  // namespace kernels
OPT_NAMESPACE_END

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif
#endif  // OPT_HAVE_AVX512_KERNELS
