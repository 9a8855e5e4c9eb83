// x86-64 AVX-512 (F, BW, VL) kernels: generic.hpp with 16 f32 lanes (a panel column is one vector). Compiled in a
// target region whatever the program's -march, run only where the CPU has the instructions (dispatch.hpp).
// VNNI and AVX512-BF16 dot products are not used by the exact kernels: they round differently from an f32 FMA
// chain and would break the same-bits-on-every-ISA promise. The one opt-in exception, LinearSeg::approximate
// (LoadOptions::approximate_int8, for drafters), is at the end of this file.
#pragma once
#include "opt/kernels/prelude.hpp"

#include <vector>

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
  // panels of a decode tile of m tokens (weights of col_bytes a panel column): 4 streams of weights at up to 4
  // tokens. On Zen 5 (2 threads, opt-125m's shape, 200-300 paired rounds) a whole decode token with 4 panels took
  // 0.96-0.975x (int8), 0.97x (int4), 0.98x (f32) the time it took with 8; 16-bit weights already read more with
  // 4 (the LM head's GEMV 52-59 GB/s against 46-55). 16-bit weights keep 4 panels to 6 tokens (6 x 4 + 4 + 1
  // registers): on the Intel machine (2 threads, passes over a 40-token cache, alternating runs) opt-1.3b bf16
  // 5 / 6 rows took 87-89 / 92-94 ms against 99-104 / 104-107 with 2 panels (1 row: 85-88), opt-125m f16 5 / 6
  // rows 9.6-10.5 / 9.9-10.2 against 11.3 / 11.4-11.6; at 7 and 8 rows (the weights one panel at a time) 4 panels
  // were no faster.
  static constexpr int np_for(int m, int col_bytes) { return m <= 4 || (m <= 6 && col_bytes == 32) ? 4 : 2; }
  // Panels of a one-token tile of integer weights where the CPU is Intel's (generic.hpp decode_np): 8, two streams
  // of 4-panel groups, where np_for's 4 read one. On the Intel machine (2 threads, opt-1.3b, one-row passes over
  // a 40-token cache, 3 x 4 alternating runs) int8 took 48-54 ms against 52-57 (int4 38-43 against 39-45; 16
  // panels, whose weights no longer fit the registers, 57-59); an out-of-cache int8 GEMV (8192 x 2048, 2 threads)
  // read 29-30 GB/s against 27-28. On Zen 5, 4 panels took 0.96-0.975x the time of 8 (above): 4 there.
  static constexpr int kIntDecodeNp = 8;
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
  // bf16 weights a 2-panel group column at a time (64 bytes: rows 0-15 of panel A, then of panel B), one
  // instruction a vector where load_bf16 takes two (vpmovzxwd + vpslld): each dword holds rows 2i and 2i + 1,
  // the low half shifted up is row 2i as f32, the high half masked is row 2i + 1. So even = rows 0, 2, .., 14 of
  // A then of B, odd = rows 1, 3, .., 15 of A then of B; the same values, in other lanes (generic.hpp tile()).
  static constexpr int kBf16PairPanels = 2;
  static void load_bf16_pair(const uint16_t* p, V& even, V& odd) {
    const __m512i d = _mm512_loadu_si512(p);
    even = _mm512_castsi512_ps(_mm512_slli_epi32(d, 16));
    odd = _mm512_castsi512_ps(_mm512_and_si512(d, _mm512_set1_epi32(int32_t(0xffff0000u))));
  }
  // (even, odd) of load_bf16_pair's order to rows 0-15 of A, rows 0-15 of B; rows_to_bf16_pair the inverse
  static void bf16_pair_to_rows(V& a, V& b) {
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    const V r0 = _mm512_permutex2var_ps(a, lo, b), r1 = _mm512_permutex2var_ps(a, hi, b);
    a = r0, b = r1;
  }
  static void rows_to_bf16_pair(V& a, V& b) {
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    const V e = _mm512_permutex2var_ps(a, ev, b), o = _mm512_permutex2var_ps(a, od, b);
    a = e, b = o;
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

inline bool linear_i8_approx(const float* x, int64_t n, const ops::LinearSeg& g, int64_t p0, int64_t p1);

#include "opt/kernels/generic.hpp"

// ---- opt-in approximate int8: VNNI dot products (LinearSeg::approximate) ------------------------------------------
// x is quantized per block of the weights' columns to u = round(x / s) + 128 (s = max|x| / 127), so output row r
// of a block is s * scale(r, block) * (sum u q - 128 sum q), both sums by vpdpbusd over 4 columns a lane (integer
// sums: exact in any order). A panel's 4-column group (64 bytes: 4 columns of 16 rows) becomes 16 (row, 4
// columns) lanes by one vpermb (with interleaved panels, PackedMatrix::group, the 4 columns are gathered first;
// a whole group of 4 panels goes through i8_approx_group instead).
// Not the exact FMA chain: the result moves by the quantization of x.
// out[j]: row j of panel p0 before the epilogue, for one token's u / sx. The panel is read in column order, its
// 4-column groups going round robin to 4 pairs of accumulators.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi"), noinline)) inline void i8_approx_panel(
    const uint8_t* u, const float* sx, const PackedMatrix& w, int64_t p0, float* out) {
  alignas(64) static constexpr uint8_t kT[64] = {  // byte 4r + j <- byte 16j + r
      0, 16, 32, 48, 1, 17, 33, 49, 2, 18, 34, 50, 3, 19, 35, 51, 4, 20, 36, 52, 5, 21, 37, 53,
      6, 22, 38, 54, 7, 23, 39, 55, 8, 24, 40, 56, 9, 25, 41, 57, 10, 26, 42, 58, 11, 27, 43, 59,
      12, 28, 44, 60, 13, 29, 45, 61, 14, 30, 46, 62, 15, 31, 47, 63};
  const __m512i tr = _mm512_load_si512(kT), ones = _mm512_set1_epi8(1);
  const int64_t K = w.cols, B = w.block, nb = w.blocks();
  const int8_t* pp = reinterpret_cast<const int8_t*>(w.panel(p0));
  const int64_t cs = int64_t(w.column_stride(p0));  // 16 (panel after panel) or the group's interleave
  constexpr int64_t kAheadCols = prefetch_distance(dtype::I8) / 16;
  // columns k .. k + 3 of the panel (16 bytes each) as one 64-byte vector, in the byte order vpermb expects
  const auto load4 = [&](int64_t k) {
    const int8_t* c = pp + k * cs;
    if (cs == 16) return _mm512_loadu_si512(c);
    const __m512i lo = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c)));
    const __m512i a = _mm512_inserti32x4(lo, _mm_loadu_si128(reinterpret_cast<const __m128i*>(c + cs)), 1);
    const __m512i b = _mm512_inserti32x4(a, _mm_loadu_si128(reinterpret_cast<const __m128i*>(c + 2 * cs)), 2);
    return _mm512_inserti32x4(b, _mm_loadu_si128(reinterpret_cast<const __m128i*>(c + 3 * cs)), 3);
  };
  // a cache line ahead of the panel's columns k .. k + 3 (four lines when they are interleaved with a group's)
  const auto ahead = [&](int64_t k) {
    const std::byte* c = reinterpret_cast<const std::byte*>(pp + (k + kAheadCols) * cs);
    prefetch_l2(c);
    if (cs != 16)
      for (int j = 1; j < 4; ++j) prefetch_l2(c + j * cs);
  };
  __m512 res = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t kb = b * B, ke = std::min(K, kb + B);
    __m512i acc[4], ws[4];
    _Pragma("GCC unroll 4") for (int a = 0; a < 4; ++a) acc[a] = ws[a] = _mm512_setzero_si512();
    int64_t k = kb;
    for (; k + 16 <= ke; k += 16) {
      _Pragma("GCC unroll 4") for (int a = 0; a < 4; ++a) {
        ahead(k + 4 * a);
        int32_t x4;
        std::memcpy(&x4, u + k + 4 * a, 4);
        const __m512i q = _mm512_permutexvar_epi8(tr, load4(k + 4 * a));
        acc[a] = _mm512_dpbusd_epi32(acc[a], _mm512_set1_epi32(x4), q);
        ws[a] = _mm512_dpbusd_epi32(ws[a], ones, q);
      }
    }
    for (; k < ke; k += 4) {
      int32_t x4;
      std::memcpy(&x4, u + k, 4);
      const __m512i q = _mm512_permutexvar_epi8(tr, load4(k));
      acc[0] = _mm512_dpbusd_epi32(acc[0], _mm512_set1_epi32(x4), q);
      ws[0] = _mm512_dpbusd_epi32(ws[0], ones, q);
    }
    const __m512i at = _mm512_add_epi32(_mm512_add_epi32(acc[0], acc[1]), _mm512_add_epi32(acc[2], acc[3]));
    const __m512i wt = _mm512_add_epi32(_mm512_add_epi32(ws[0], ws[1]), _mm512_add_epi32(ws[2], ws[3]));
    const __m512 d = _mm512_cvtepi32_ps(_mm512_sub_epi32(at, _mm512_slli_epi32(wt, 7)));
    const __m512 sc = _mm512_mul_ps(_mm512_set1_ps(sx[b]), _mm512_loadu_ps(w.panel_scales(p0) + b * ops::kPanel));
    res = _mm512_fmadd_ps(d, sc, res);
  }
  _mm512_storeu_ps(out, res);
}

// The same for a whole group of 4 interleaved panels (PackedMatrix::group 4, every panel present), read as one
// stream: 4 group columns (256 bytes: column k + c of panel L at byte 64c + 16L) become by 8 in-lane unpacks 4
// vectors R_i whose lane L holds rows 4i .. 4i + 3 of panel L, each a dword of the 4 columns' bytes. Here the
// weights are the unsigned side of vpdpbusd (q + 128: q ^ 0x80) and the quantized x the signed one (u ^ 0x80), so
// a row's sum is sum q x + 128 sum x, and sum x (xs, per block) is the same for every row: the same integer as
// i8_approx_panel's, then the same float operations per row, so the same bits. out[16 L + r]: row r of panel
// p0 + L.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"), noinline)) inline void i8_approx_group(
    const uint8_t* u, const float* sx, const int32_t* xs, const PackedMatrix& w, int64_t p0, float* out) {
  const int64_t K = w.cols, B = w.block, nb = w.blocks();
  const __m512i* pp = reinterpret_cast<const __m512i*>(w.panel(p0));  // group column k at pp[k]
  const __m512i flip = _mm512_set1_epi8(char(0x80));
  constexpr int64_t kAheadCols = prefetch_distance(dtype::I8) / 16;
  __m512 res[4];
  _Pragma("GCC unroll 4") for (int i = 0; i < 4; ++i) res[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t kb = b * B, ke = std::min(K, kb + B);
    __m512i acc[4];
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; ++i) acc[i] = _mm512_setzero_si512();
    for (int64_t k = kb; k < ke; k += 4) {
      const std::byte* ahead = reinterpret_cast<const std::byte*>(pp + k + kAheadCols);
      _Pragma("GCC unroll 4") for (int c = 0; c < 4; ++c) prefetch_l2(ahead + 64 * c);
      const __m512i c0 = _mm512_xor_si512(_mm512_load_si512(pp + k), flip);
      const __m512i c1 = _mm512_xor_si512(_mm512_load_si512(pp + k + 1), flip);
      const __m512i c2 = _mm512_xor_si512(_mm512_load_si512(pp + k + 2), flip);
      const __m512i c3 = _mm512_xor_si512(_mm512_load_si512(pp + k + 3), flip);
      const __m512i a_lo = _mm512_unpacklo_epi8(c0, c1), a_hi = _mm512_unpackhi_epi8(c0, c1);  // rows 0-7, 8-15
      const __m512i b_lo = _mm512_unpacklo_epi8(c2, c3), b_hi = _mm512_unpackhi_epi8(c2, c3);
      int32_t x4;
      std::memcpy(&x4, u + k, 4);
      const __m512i xb = _mm512_set1_epi32(int32_t(uint32_t(x4) ^ 0x80808080u));
      acc[0] = _mm512_dpbusd_epi32(acc[0], _mm512_unpacklo_epi16(a_lo, b_lo), xb);  // rows 0-3
      acc[1] = _mm512_dpbusd_epi32(acc[1], _mm512_unpackhi_epi16(a_lo, b_lo), xb);  // rows 4-7
      acc[2] = _mm512_dpbusd_epi32(acc[2], _mm512_unpacklo_epi16(a_hi, b_hi), xb);  // rows 8-11
      acc[3] = _mm512_dpbusd_epi32(acc[3], _mm512_unpackhi_epi16(a_hi, b_hi), xb);  // rows 12-15
    }
    const __m512i corr = _mm512_set1_epi32(xs[b] * 128);
    const __m512 sxb = _mm512_set1_ps(sx[b]);
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; ++i) {
      __m512 sc = _mm512_castps128_ps512(_mm_loadu_ps(w.panel_scales(p0) + b * ops::kPanel + 4 * i));
      sc = _mm512_insertf32x4(sc, _mm_loadu_ps(w.panel_scales(p0 + 1) + b * ops::kPanel + 4 * i), 1);
      sc = _mm512_insertf32x4(sc, _mm_loadu_ps(w.panel_scales(p0 + 2) + b * ops::kPanel + 4 * i), 2);
      sc = _mm512_insertf32x4(sc, _mm_loadu_ps(w.panel_scales(p0 + 3) + b * ops::kPanel + 4 * i), 3);
      const __m512 d = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[i], corr));
      res[i] = _mm512_fmadd_ps(d, _mm512_mul_ps(sxb, sc), res[i]);
    }
  }
  _Pragma("GCC unroll 4") for (int i = 0; i < 4; ++i) {
    _mm_storeu_ps(out + 4 * i, _mm512_castps512_ps128(res[i]));
    _mm_storeu_ps(out + 16 + 4 * i, _mm512_extractf32x4_ps(res[i], 1));
    _mm_storeu_ps(out + 32 + 4 * i, _mm512_extractf32x4_ps(res[i], 2));
    _mm_storeu_ps(out + 48 + 4 * i, _mm512_extractf32x4_ps(res[i], 3));
  }
}

// Panels [p0, p1) of g for one token with VNNI; false (nothing done) where this CPU lacks VNNI or VBMI, for more
// tokens, or where the columns or the block are not a multiple of 4.
inline bool linear_i8_approx(const float* x, int64_t n, const ops::LinearSeg& g, int64_t p0, int64_t p1) {
  const PackedMatrix& w = g.w;
  const int64_t K = w.cols, B = w.block, nb = w.blocks();
  if (n != 1 || K % 4 != 0 || B <= 0 || B % 4 != 0 || !cpu_has_int8_dot()) return false;
  // x quantized as the int8 weight quantizer does (quantize_rows: s = max|x| / 127 per block, round to nearest
  // even), here with vector rounding: quantize_rows rounds through a libm call per element, which cost this
  // per-token path ~5% of an opt-1.3b draft step; stored as q + 128, the unsigned bytes vpdpbusd takes
  thread_local std::vector<uint8_t> u;
  thread_local std::vector<float> sx;
  thread_local std::vector<int32_t> xs;  // per block: the sum of the quantized x (u - 128)
  u.resize(size_t(K));
  sx.resize(size_t(nb));
  xs.resize(size_t(nb));
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t kb = b * B, ke = std::min(K, kb + B);
    V m = Simd::zero();
    int64_t k = kb;
    for (; k + 16 <= ke; k += 16) m = Simd::max(m, Simd::abs(Simd::load(x + k)));
    float mx = _mm512_reduce_max_ps(m);
    for (; k < ke; ++k) mx = std::max(mx, std::fabs(x[k]));
    const float inv = mx > 0.0f ? 127.0f / mx : 0.0f;
    sx[size_t(b)] = mx / 127.0f;
    const V iv = Simd::set1(inv);
    const __m512i off = _mm512_set1_epi32(128);
    for (k = kb; k + 16 <= ke; k += 16)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(u.data() + k),
                       _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvtps_epi32(Simd::mul(Simd::load(x + k), iv)), off)));
    for (; k < ke; ++k) u[size_t(k)] = uint8_t(int(std::nearbyint(x[k] * inv)) + 128);
    int32_t sum = 0;
    for (k = kb; k < ke; ++k) sum += int32_t(u[size_t(k)]) - 128;
    xs[size_t(b)] = sum;
  }
  alignas(64) float out[4 * ops::kPanel];
  for (int64_t p = p0; p < p1;) {
    if (w.group == 4 && p % 4 == 0 && p + 4 <= p1 && w.group_panels(p) == 4) {
      i8_approx_group(u.data(), sx.data(), xs.data(), w, p, out);
      finish_panels(g, p, 4, out, ops::kPanel, g.y);
      p += 4;
    } else {
      i8_approx_panel(u.data(), sx.data(), w, p, out);
      finish_panels(g, p, 1, out, ops::kPanel, g.y);
      p += 1;
    }
  }
  return true;
}

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
