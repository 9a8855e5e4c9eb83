// The kernels: linear (GEMV/GEMM against [out, in] weights stored F32, F16 or BF16), LayerNorm, activations,
// softmax and causal attention over a KV cache. Knows nothing about OPT. Each kernel has a plain reference in
// opt::ref (ops_ref.hpp) and a test against it.
//
// Determinism: every output element is computed by one fixed sequence of operations that depends only on the
// reduction length, never on the thread count or on which tile of the output it falls in. Work is split across
// threads by output rows.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "opt/config.hpp"
#include "opt/detail/fp16.hpp"
#include "opt/safetensors.hpp"
#include "opt/thread_pool.hpp"

OPT_NAMESPACE_BEGIN

// A read-only [rows, cols] row-major matrix (PyTorch's Linear layout: [out_features, in_features]).
struct MatrixRef {
  dtype type = dtype::F32;  // F32, F16, BF16 or I8 (with scales)
  const void* data = nullptr;
  int64_t rows = 0, cols = 0;

  const float* scale = nullptr;  // I8 only: [rows, ceil(cols / block)] per-row, per-block scales
  int64_t block = 0;             // I8 only: columns per scale

  const std::byte* row_ptr(int64_t r) const noexcept {
    return static_cast<const std::byte*>(data) + size_t(r) * size_t(cols) * dtype_size(type);
  }
  int64_t blocks_per_row() const noexcept { return block ? (cols + block - 1) / block : 0; }
  // Bytes a pass over the whole matrix reads (values and scales).
  size_t bytes() const noexcept {
    if (!data) return 0;
    return size_t(rows) * size_t(cols) * dtype_size(type) + size_t(rows) * size_t(blocks_per_row()) * 4;
  }
};

namespace ops {

// std::allocator with 64-byte (cache line, one AVX-512 vector) alignment: activation buffers whose rows are
// loaded 64 bytes at a time (a load that straddles two cache lines costs about a third more in GEMM kernels).
template <class T>
struct AlignedAllocator {
  using value_type = T;
  static constexpr std::size_t kAlign = 64;
  AlignedAllocator() = default;
  template <class U>
  AlignedAllocator(const AlignedAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(kAlign))); }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, std::align_val_t(kAlign)); }
  template <class U>
  bool operator==(const AlignedAllocator<U>&) const noexcept { return true; }
  template <class U>
  bool operator!=(const AlignedAllocator<U>&) const noexcept { return false; }
};
template <class T>
using aligned_vector = std::vector<T, AlignedAllocator<T>>;

// Row r of m, widened to float.
inline void row_to_f32(const MatrixRef& m, int64_t r, float* out) {
  const std::byte* p = m.row_ptr(r);
  const int64_t n = m.cols;
  switch (m.type) {
    case dtype::F32: std::memcpy(out, p, size_t(n) * 4); break;
    case dtype::F16: {
      const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
      for (int64_t i = 0; i < n; ++i) out[i] = detail::f16_to_f32(h[i]);
      break;
    }
    case dtype::BF16: {
      const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
      for (int64_t i = 0; i < n; ++i) out[i] = detail::bf16_to_f32(h[i]);
      break;
    }
    case dtype::I8: {
      const int8_t* q = reinterpret_cast<const int8_t*>(p);
      const float* s = m.scale + r * m.blocks_per_row();
      for (int64_t i = 0; i < n; ++i) out[i] = float(q[i]) * s[i / m.block];
      break;
    }
    default: OPT_DASSERT(false);
  }
}

namespace detail_k {

// int8 weights: one f32 scale per row and block of kQ8Block columns (a multiple of 16, so a 16-wide chunk never
// straddles two blocks).
constexpr int64_t kQ8Block = 128;

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define OPT_AVX512 1
// GCC 12 reports its own _mm512_undefined_ps() inside the AVX-512 intrinsics headers as maybe-uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
// 16 weights of a row from column k, widened to f32 (int8: times the block's scale; `s` is the row's scales).
template <dtype T>
inline __m512 load16(const void* p, const float* s, int64_t k) {
  if constexpr (T == dtype::F32) {
    return _mm512_loadu_ps(static_cast<const float*>(p) + k);
  } else if constexpr (T == dtype::F16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(p) + k)));
  } else if constexpr (T == dtype::BF16) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(p) + k));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const int8_t*>(p) + k));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), _mm512_set1_ps(s[k / kQ8Block]));
  }
}
template <dtype T>
inline __m512 load16_masked(const void* p, const float* s, int64_t k, __mmask16 m) {
  if constexpr (T == dtype::F32) {
    return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + k);
  } else if constexpr (T == dtype::F16) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + k));
  } else if constexpr (T == dtype::BF16) {
    __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + k);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    __m128i b = _mm_maskz_loadu_epi8(m, static_cast<const int8_t*>(p) + k);
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), _mm512_set1_ps(s[k / kQ8Block]));
  }
}
inline __mmask16 tail_mask(int64_t left) { return left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1u); }

// The canonical dot product: 16-wide chunk c (columns [16c, 16c + 16)) goes to accumulator c % 4, lane by lane;
// the last chunk is a masked load; the four accumulators are summed as (a0 + a1) + (a2 + a3), then across lanes
// by _mm512_reduce_add_ps. Every kernel below computes each output with exactly this sequence of operations,
// whatever its tiling, so a value does not depend on batch composition, tile position or thread count.
template <dtype T>
inline float dot(const float* x, const void* w, const float* s, int64_t K) {
  __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t k = 0;
  for (; k + 64 <= K; k += 64) {
    a[0] = _mm512_fmadd_ps(_mm512_loadu_ps(x + k), load16<T>(w, s, k), a[0]);
    a[1] = _mm512_fmadd_ps(_mm512_loadu_ps(x + k + 16), load16<T>(w, s, k + 16), a[1]);
    a[2] = _mm512_fmadd_ps(_mm512_loadu_ps(x + k + 32), load16<T>(w, s, k + 32), a[2]);
    a[3] = _mm512_fmadd_ps(_mm512_loadu_ps(x + k + 48), load16<T>(w, s, k + 48), a[3]);
  }
  for (int j = 0; k < K; k += 16, ++j) {
    const __mmask16 m = tail_mask(K - k);
    a[j] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + k), load16_masked<T>(w, s, k, m), a[j]);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])));
}

// A 4 (tokens) x 4 (weight rows) tile of canonical dot products: out[i][j] = dot(x_i, w_j). Register-tiled: per
// 16-wide chunk, 4 x loads and 4 w loads feed 16 FMAs into 16 accumulators. The canonical order needs four
// accumulators per output, so the chunks are visited in four passes (c % 4 == 0, 1, 2, 3), each with its own
// 16 accumulators; the partial sums are then combined exactly as dot() does.
template <dtype T>
inline void tile4x4_part(const float* x, int64_t ldx, const void* const* w, const float* const* s, int64_t k0,
                         int64_t k1, int64_t K, bool first, __m512 part[4][4][4]) {
  // columns [k0, k1) of the dot products (k0 a multiple of 64, so chunk c = k0 / 16 + j starts pass j), continuing
  // the partial sums in `part` (first: from zero); the masked last chunk belongs to the block that ends at K
  const int64_t nfull = K / 16, rem = K % 16, cend = std::min(nfull, k1 / 16);
  for (int j = 0; j < 4; ++j) {
    __m512 acc[4][4];
    for (int m = 0; m < 4; ++m)
      for (int n = 0; n < 4; ++n) acc[m][n] = first ? _mm512_setzero_ps() : part[j][m][n];
    for (int64_t c = k0 / 16 + j; c < cend; c += 4) {
      const int64_t k = c * 16;
      __m512 wv[4];
      for (int n = 0; n < 4; ++n) {
        wv[n] = load16<T>(w[n], s[n], k);
        asm("" : "+v"(wv[n]));  // keep it in a register: GCC would fold it into each of the 4 FMAs (4x the loads)
      }
      for (int m = 0; m < 4; ++m) {
        __m512 xv = _mm512_loadu_ps(x + m * ldx + k);
        asm("" : "+v"(xv));
        for (int n = 0; n < 4; ++n) acc[m][n] = _mm512_fmadd_ps(xv, wv[n], acc[m][n]);
      }
    }
    if (rem && k1 >= K && nfull % 4 == j) {
      const int64_t k = nfull * 16;
      const __mmask16 mk = tail_mask(rem);
      __m512 wv[4];
      for (int n = 0; n < 4; ++n) wv[n] = load16_masked<T>(w[n], s[n], k, mk);
      for (int m = 0; m < 4; ++m) {
        const __m512 xv = _mm512_maskz_loadu_ps(mk, x + m * ldx + k);
        for (int n = 0; n < 4; ++n) acc[m][n] = _mm512_fmadd_ps(xv, wv[n], acc[m][n]);
      }
    }
    for (int m = 0; m < 4; ++m)
      for (int n = 0; n < 4; ++n) part[j][m][n] = acc[m][n];
  }
}
inline void tile4x4_finish(__m512 part[4][4][4], float out[4][4]) {
  for (int m = 0; m < 4; ++m)
    for (int n = 0; n < 4; ++n)
      out[m][n] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(part[0][m][n], part[1][m][n]),
                                                     _mm512_add_ps(part[2][m][n], part[3][m][n])));
}
template <dtype T>
inline void tile4x4(const float* x, int64_t ldx, const void* const* w, const float* const* s, int64_t K,
                    float out[4][4]) {
  __m512 part[4][4][4];
  tile4x4_part<T>(x, ldx, w, s, 0, K, K, true, part);
  tile4x4_finish(part, out);
}

// MR (1..6) canonical dot products of one weight row against MR token rows, in one pass over the row: the row is
// read (and widened) once, chunk c going to accumulator [c % 4][token]. Decode batches use it: one weight row at
// a time is a single stream from memory.
template <dtype T, int MR>
inline void row_dots(const float* x, int64_t ldx, const void* w, const float* s, int64_t K, float* out) {
  __m512 a[4][MR];
  for (int j = 0; j < 4; ++j)
    for (int m = 0; m < MR; ++m) a[j][m] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 64 <= K; k += 64)
    for (int j = 0; j < 4; ++j) {
      const __m512 wv = load16<T>(w, s, k + 16 * j);
      for (int m = 0; m < MR; ++m) a[j][m] = _mm512_fmadd_ps(_mm512_loadu_ps(x + m * ldx + k + 16 * j), wv, a[j][m]);
    }
  for (int j = 0; k < K; k += 16, ++j) {
    const __mmask16 mk = tail_mask(K - k);
    const __m512 wv = load16_masked<T>(w, s, k, mk);
    for (int m = 0; m < MR; ++m) a[j][m] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, x + m * ldx + k), wv, a[j][m]);
  }
  for (int m = 0; m < MR; ++m)
    out[m] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[0][m], a[1][m]), _mm512_add_ps(a[2][m], a[3][m])));
}

// a · b over n floats (attention's q·k): one accumulator, masked tail.
inline float dot_f32(const float* a, const float* b, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t k = 0; k < n; k += 16) {
    const __mmask16 m = tail_mask(n - k);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + k), _mm512_maskz_loadu_ps(m, b + k), acc);
  }
  return _mm512_reduce_add_ps(acc);
}
// exp(x) for 16 lanes (Cephes expf: range reduction by ln 2, degree-6 polynomial, 2^n by scalef); within 2 ulp of
// std::exp for x in [-87, 88]; lanes below -87 give 0 (as exp underflows there anyway).
inline __m512 exp16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.3f);
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.3f)), lo);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_mov_ps(__mmask16(~tiny), _mm512_scalef_ps(p, n));
}
// s[t] = exp(s[t] - mx) for t < n; returns the sum (16 lanes, then reduce_add).
inline float exp_sub_sum(float* s, int64_t n, float mx) {
  const __m512 m = _mm512_set1_ps(mx);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t t = 0; t < n; t += 16) {
    const __mmask16 k = tail_mask(n - t);
    const __m512 e = _mm512_maskz_mov_ps(k, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + t), m)));
    _mm512_mask_storeu_ps(s + t, k, e);
    acc = _mm512_add_ps(acc, e);
  }
  return _mm512_reduce_add_ps(acc);
}
// o[0, NC*16) = sum_t p[t] * inv * v[t * ld + (0, NC*16)], accumulated in registers.
template <int NC>
inline void pv_regs(const float* p, float inv, int64_t len, const float* v, int64_t ld, float* o) {
  __m512 acc[NC];
  for (int c = 0; c < NC; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t t = 0; t < len; ++t) {
    const __m512 pt = _mm512_set1_ps(p[t] * inv);
    for (int c = 0; c < NC; ++c) acc[c] = _mm512_fmadd_ps(pt, _mm512_loadu_ps(v + t * ld + 16 * c), acc[c]);
  }
  for (int c = 0; c < NC; ++c) _mm512_storeu_ps(o + 16 * c, acc[c]);
}
// y[0, n) += p * v[0, n)
inline void axpy_f32(float p, const float* v, float* y, int64_t n) {
  const __m512 pv = _mm512_set1_ps(p);
  for (int64_t k = 0; k < n; k += 16) {
    const __mmask16 m = tail_mask(n - k);
    _mm512_mask_storeu_ps(y + k, m, _mm512_fmadd_ps(pv, _mm512_maskz_loadu_ps(m, v + k), _mm512_maskz_loadu_ps(m, y + k)));
  }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#else
template <dtype T>
inline float load1(const void* p, const float* s, int64_t k) {
  if constexpr (T == dtype::F32) return static_cast<const float*>(p)[k];
  else if constexpr (T == dtype::F16) return opt::detail::f16_to_f32(static_cast<const uint16_t*>(p)[k]);
  else if constexpr (T == dtype::BF16) return opt::detail::bf16_to_f32(static_cast<const uint16_t*>(p)[k]);
  else return float(static_cast<const int8_t*>(p)[k]) * s[k / kQ8Block];
}
// Portable build: the same accumulation pattern in plain arrays (the compiler may vectorize it).
template <dtype T>
inline float dot(const float* x, const void* w, const float* s, int64_t K) {
  float a[4][16] = {};
  for (int64_t k = 0; k < K; ++k) a[(k / 16) % 4][k % 16] += x[k] * load1<T>(w, s, k);
  float r[4];
  for (int j = 0; j < 4; ++j) {
    float t = 0;
    for (int l = 0; l < 16; ++l) t += a[j][l];
    r[j] = t;
  }
  return (r[0] + r[1]) + (r[2] + r[3]);
}
inline float dot_f32(const float* a, const float* b, int64_t n) {
  float s = 0;
  for (int64_t k = 0; k < n; ++k) s += a[k] * b[k];
  return s;
}
inline void axpy_f32(float p, const float* v, float* y, int64_t n) {
  for (int64_t k = 0; k < n; ++k) y[k] += p * v[k];
}
inline float exp_sub_sum(float* s, int64_t n, float mx) {
  float sum = 0;
  for (int64_t t = 0; t < n; ++t) sum += (s[t] = std::exp(s[t] - mx));
  return sum;
}
#endif

}  // namespace detail_k

// What happens to each output value v = x·w + bias before it is stored (fused into the linear kernel, so the
// result is the same as the separate torch ops, in the same order): v *= scale; v = act(v); y = y + v.
struct Epilogue {
  float scale = 1.0f;
  bool has_scale = false;     // q_proj(h) * head_dim^-0.5
  bool has_act = false;       // fc1 -> activation_fn
  activation act = activation::relu;
  bool residual = false;      // y = residual (the old y) + v
};

inline float activate(activation a, float v);

// One output of a (possibly fused) linear layer: rows of weight w, written to y[i * ldy + r].
struct LinearSeg {
  MatrixRef w;                   // [out, in]
  const float* bias = nullptr;   // [out] or null
  float* y = nullptr;            // [n, ldy]
  int64_t ldy = 0;
  Epilogue ep{};
};

namespace detail_k {

inline float finish(const LinearSeg& g, int64_t r, float v, float old) {
  if (g.bias) v = v + g.bias[r];
  if (g.ep.has_scale) v = v * g.ep.scale;
  if (g.ep.has_act) v = opt::ops::activate(g.ep.act, v);
  if (g.ep.residual) v = old + v;
  return v;
}

inline const float* row_scales(const MatrixRef& w, int64_t r) {
  return w.scale ? w.scale + r * w.blocks_per_row() : nullptr;
}

// Rows [r0, r1) of one segment for n tokens x [n, K].
template <dtype T>
inline void linear_rows(const float* x, int64_t n, const LinearSeg& g, int64_t r0, int64_t r1) {
  const MatrixRef& w = g.w;
  const int64_t K = w.cols;
  auto store = [&](int64_t i, int64_t r, float v) {
    float& y = g.y[i * g.ldy + r];
    y = finish(g, r, v, y);
  };
#if defined(OPT_AVX512)
  if (n >= 8) {
    // Prefill: blocks of weight rows that fit in L2 (read from memory once) and 4x4 tiles inside. Long rows are cut
    // into column blocks of kKB so that a tile's 4 x rows and 4 w rows stay in L1; the tiles' partial sums wait in
    // `parts` between column blocks (the same operations in the same order: bitwise the canonical dot).
    constexpr int64_t kKB = 1024, kMaxTiles = 16;
    const int64_t wsz = int64_t(dtype_size(w.type));
    const int64_t rb = std::min<int64_t>(4 * kMaxTiles,
                                         std::max<int64_t>(4, ((int64_t(1) << 19) / std::max<int64_t>(1, K * wsz)) / 4 * 4));
    alignas(64) __m512 parts[kMaxTiles][4][4][4];
    for (int64_t b0 = r0; b0 < r1; b0 += rb) {
      const int64_t b1 = std::min(r1, b0 + rb);
      const int64_t b4 = b0 + (b1 - b0) / 4 * 4;
      int64_t i = 0;
      for (; i + 4 <= n; i += 4) {
        for (int64_t k0 = 0; k0 < K; k0 += kKB) {
          const int64_t k1 = std::min(K, k0 + kKB);
          for (int64_t r = b0; r < b4; r += 4) {
            const void* wr[4] = {w.row_ptr(r), w.row_ptr(r + 1), w.row_ptr(r + 2), w.row_ptr(r + 3)};
            const float* sr[4] = {row_scales(w, r), row_scales(w, r + 1), row_scales(w, r + 2), row_scales(w, r + 3)};
            tile4x4_part<T>(x + i * K, K, wr, sr, k0, k1, K, k0 == 0, parts[(r - b0) / 4]);
          }
        }
        for (int64_t r = b0; r < b4; r += 4) {
          float out[4][4];
          tile4x4_finish(parts[(r - b0) / 4], out);
          for (int m = 0; m < 4; ++m)
            for (int q = 0; q < 4; ++q) store(i + m, r + q, out[m][q]);
        }
        for (int64_t r = b4; r < b1; ++r)
          for (int m = 0; m < 4; ++m) store(i + m, r, dot<T>(x + (i + m) * K, w.row_ptr(r), row_scales(w, r), K));
      }
      for (; i < n; ++i)
        for (int64_t r = b0; r < b1; ++r) store(i, r, dot<T>(x + i * K, w.row_ptr(r), row_scales(w, r), K));
    }
    return;
  }
#endif
  // Decode: one weight row at a time (a single stream from memory), up to 4 tokens against it per pass.
#if defined(OPT_AVX512)
  for (int64_t r = r0; r < r1; ++r) {
    const void* wr = w.row_ptr(r);
    const float* sr = row_scales(w, r);
    for (int64_t i = 0; i < n; i += 6) {  // up to 6 tokens per pass: 24 accumulators + w + x in 32 registers
      float o[6];
      switch (std::min<int64_t>(6, n - i)) {
        case 1: o[0] = dot<T>(x + i * K, wr, sr, K); break;
        case 2: row_dots<T, 2>(x + i * K, K, wr, sr, K, o); break;
        case 3: row_dots<T, 3>(x + i * K, K, wr, sr, K, o); break;
        case 4: row_dots<T, 4>(x + i * K, K, wr, sr, K, o); break;
        case 5: row_dots<T, 5>(x + i * K, K, wr, sr, K, o); break;
        default: row_dots<T, 6>(x + i * K, K, wr, sr, K, o); break;
      }
      for (int64_t m = 0; m < std::min<int64_t>(6, n - i); ++m) store(i + m, r, o[m]);
    }
  }
  return;
#endif
  for (int64_t r = r0; r < r1; ++r) {
    const void* wr = w.row_ptr(r);
    const float* sr = row_scales(w, r);
    for (int64_t i = 0; i < n; ++i) store(i, r, dot<T>(x + i * K, wr, sr, K));
  }
}

inline void linear_seg_rows(const float* x, int64_t n, const LinearSeg& g, int64_t r0, int64_t r1) {
  switch (g.w.type) {
    case dtype::F32: linear_rows<dtype::F32>(x, n, g, r0, r1); break;
    case dtype::F16: linear_rows<dtype::F16>(x, n, g, r0, r1); break;
    case dtype::BF16: linear_rows<dtype::BF16>(x, n, g, r0, r1); break;
    case dtype::I8: linear_rows<dtype::I8>(x, n, g, r0, r1); break;
    default: OPT_DASSERT(false);
  }
}

}  // namespace detail_k

// Several linear layers over the same input x [n, in] in one parallel pass (q/k/v: one dispatch, not three).
// The concatenated output rows are split into one contiguous range per thread.
inline void linear_multi(ThreadPool& pool, const float* x, int64_t n, const LinearSeg* segs, size_t n_segs) {
  int64_t total = 0;
  for (size_t s = 0; s < n_segs; ++s) total += segs[s].w.rows;
  pool.parallel_for(size_t(total), 16, [&](size_t b, size_t e) {
    int64_t base = 0;
    for (size_t s = 0; s < n_segs; ++s) {
      const int64_t rows = segs[s].w.rows;
      const int64_t r0 = std::max<int64_t>(int64_t(b) - base, 0), r1 = std::min<int64_t>(int64_t(e) - base, rows);
      if (r0 < r1) detail_k::linear_seg_rows(x, n, segs[s], r0, r1);
      base += rows;
    }
  });
}

// y[n, out] = x[n, in] · w[out, in]ᵀ + bias[out]   (torch.nn.functional.linear), with an optional fused epilogue.
inline void linear(ThreadPool& pool, const float* x, int64_t n, const MatrixRef& w, const float* bias, float* y,
                   const Epilogue& ep = {}) {
  LinearSeg g{w, bias, y, w.rows, ep};
  linear_multi(pool, x, n, &g, 1);
}

// y[n, d] = LayerNorm(x) * gamma + beta over the last dimension (gamma/beta may be null: no affine).
inline void layer_norm(const float* x, int64_t n, int64_t d, const float* gamma, const float* beta, float eps,
                       float* y) {
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * d;
    float* yi = y + i * d;
    double mean = 0;
    for (int64_t k = 0; k < d; ++k) mean += xi[k];
    mean /= double(d);
    double var = 0;
    for (int64_t k = 0; k < d; ++k) {
      double t = xi[k] - mean;
      var += t * t;
    }
    var /= double(d);
    const float rstd = float(1.0 / std::sqrt(var + double(eps)));
    const float m = float(mean);
    for (int64_t k = 0; k < d; ++k) {
      float v = (xi[k] - m) * rstd;
      if (gamma) v = v * gamma[k];
      if (beta) v = v + beta[k];
      yi[k] = v;
    }
  }
}

inline float activate(activation a, float v) {
  switch (a) {
    case activation::relu: return v > 0.0f ? v : 0.0f;
    case activation::gelu: return 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f));
    case activation::gelu_new:
      return 0.5f * v * (1.0f + std::tanh(0.79788456080286536f * (v + 0.044715f * v * v * v)));
    case activation::silu: return v / (1.0f + std::exp(-v));
    case activation::quick_gelu: return v / (1.0f + std::exp(-1.702f * v));
    case activation::tanh: return std::tanh(v);
    case activation::sigmoid: return 1.0f / (1.0f + std::exp(-v));
  }
  return v;
}

inline void activate(activation a, float* x, int64_t n) {
  if (a == activation::relu) {
    for (int64_t i = 0; i < n; ++i) x[i] = x[i] > 0.0f ? x[i] : 0.0f;
    return;
  }
  for (int64_t i = 0; i < n; ++i) x[i] = activate(a, x[i]);
}

// Causal multi-head attention of n new tokens of one sequence at positions [past, past + n).
//   q   [n, H]            already scaled by head_dim^-0.5 (OPT scales q before QKᵀ)
//   k,v [past + n, H]     the sequence's cache rows, row stride `ld` floats
//   out [n, H]
//   scores: scratch of at least (past + n) floats per thread
// Token i attends to cache rows [0, past + i].
inline void attention_rows(const float* q, int64_t past, const float* k, const float* v, int64_t ld,
                           int64_t n_heads, int64_t head_dim, float* out, int64_t ld_out, float* scores, int64_t i0,
                           int64_t i1, int64_t h0, int64_t h1) {
  const int64_t H = n_heads * head_dim;
  for (int64_t i = i0; i < i1; ++i) {
    const int64_t len = past + i + 1;
    for (int64_t h = h0; h < h1; ++h) {
      const float* qi = q + i * H + h * head_dim;
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t t = 0; t < len; ++t) {
        const float s = detail_k::dot_f32(qi, k + t * ld + h * head_dim, head_dim);
        scores[t] = s;
        mx = std::max(mx, s);
      }
      const float inv = 1.0f / detail_k::exp_sub_sum(scores, len, mx);
      float* oi = out + i * ld_out + h * head_dim;
#if defined(OPT_AVX512)
      switch (head_dim) {
        case 16: detail_k::pv_regs<1>(scores, inv, len, v + h * head_dim, ld, oi); continue;
        case 32: detail_k::pv_regs<2>(scores, inv, len, v + h * head_dim, ld, oi); continue;
        case 64: detail_k::pv_regs<4>(scores, inv, len, v + h * head_dim, ld, oi); continue;
        case 80: detail_k::pv_regs<5>(scores, inv, len, v + h * head_dim, ld, oi); continue;
        case 128: detail_k::pv_regs<8>(scores, inv, len, v + h * head_dim, ld, oi); continue;
        default: break;
      }
#endif
      for (int64_t d = 0; d < head_dim; ++d) oi[d] = 0;
      for (int64_t t = 0; t < len; ++t) detail_k::axpy_f32(scores[t] * inv, v + t * ld + h * head_dim, oi, head_dim);
    }
  }
}

// Causal attention of n new tokens of one sequence (see attention_rows), split over (token, head) pairs: each
// pair is computed whole by one thread. scores: (past + n) floats per pool thread.
inline void attention(ThreadPool& pool, const float* q, int64_t past, int64_t n, const float* k, const float* v,
                      int64_t ld, int64_t n_heads, int64_t head_dim, float* out, float* scores) {
  const int64_t H = n_heads * head_dim, len_max = past + n;
  pool.parallel_for_t(size_t(n * n_heads), 1, [&](size_t t, size_t b, size_t e) {
    float* sc = scores + t * size_t(len_max);
    for (size_t p = b; p < e; ++p) {
      const int64_t i = int64_t(p) / n_heads, hh = int64_t(p) % n_heads;
      attention_rows(q, past, k, v, ld, n_heads, head_dim, out, H, sc, i, i + 1, hh, hh + 1);
    }
  });
}

}  // namespace ops
OPT_NAMESPACE_END
