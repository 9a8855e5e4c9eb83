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
    default: OPT_DASSERT(false);
  }
}

namespace detail_k {

#if defined(__AVX512F__)
// GCC 12 reports its own _mm512_undefined_ps() inside the AVX-512 intrinsics headers as maybe-uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
template <dtype T>
inline __m512 load16(const void* p, int64_t k) {
  if constexpr (T == dtype::F32) {
    return _mm512_loadu_ps(static_cast<const float*>(p) + k);
  } else if constexpr (T == dtype::F16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(p) + k)));
  } else {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(p) + k));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}
template <dtype T>
inline __m512 load16_masked(const void* p, int64_t k, __mmask16 m) {
  if constexpr (T == dtype::F32) {
    return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + k);
  } else if constexpr (T == dtype::F16) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + k));
  } else {
    __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + k);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// The canonical dot product: element k goes to accumulator (k / 16) % 4, lane k % 16; the tail is a masked
// load into the next accumulator in turn; the four accumulators are summed as (a0 + a1) + (a2 + a3).
template <dtype T>
inline float dot(const float* x, const void* w, int64_t K) {
  __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t k = 0;
  for (; k + 64 <= K; k += 64) {
    a[0] = _mm512_fmadd_ps(_mm512_loadu_ps(x + k), load16<T>(w, k), a[0]);
    a[1] = _mm512_fmadd_ps(_mm512_loadu_ps(x + k + 16), load16<T>(w, k + 16), a[1]);
    a[2] = _mm512_fmadd_ps(_mm512_loadu_ps(x + k + 32), load16<T>(w, k + 32), a[2]);
    a[3] = _mm512_fmadd_ps(_mm512_loadu_ps(x + k + 48), load16<T>(w, k + 48), a[3]);
  }
  for (int j = 0; k < K; k += 16, ++j) {
    int64_t left = K - k;
    __mmask16 m = left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1u);
    a[j] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + k), load16_masked<T>(w, k, m), a[j]);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])));
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#else
template <dtype T>
inline float load1(const void* p, int64_t k) {
  if constexpr (T == dtype::F32) return static_cast<const float*>(p)[k];
  else if constexpr (T == dtype::F16) return opt::detail::f16_to_f32(static_cast<const uint16_t*>(p)[k]);
  else return opt::detail::bf16_to_f32(static_cast<const uint16_t*>(p)[k]);
}
// Portable build: the same accumulation pattern in plain arrays (the compiler may vectorize it).
template <dtype T>
inline float dot(const float* x, const void* w, int64_t K) {
  float a[4][16] = {};
  for (int64_t k = 0; k < K; ++k) a[(k / 16) % 4][k % 16] += x[k] * load1<T>(w, k);
  float s[4];
  for (int j = 0; j < 4; ++j) {
    float t = 0;
    for (int l = 0; l < 16; ++l) t += a[j][l];
    s[j] = t;
  }
  return (s[0] + s[1]) + (s[2] + s[3]);
}
#endif

template <dtype T>
inline void linear_rows(const float* x, int64_t n, const MatrixRef& w, const float* bias, float* y, int64_t r0,
                        int64_t r1) {
  const int64_t K = w.cols, N = w.rows;
  for (int64_t r = r0; r < r1; ++r) {
    const void* wr = w.row_ptr(r);
    const float b = bias ? bias[r] : 0.0f;
    for (int64_t i = 0; i < n; ++i) y[i * N + r] = dot<T>(x + i * K, wr, K) + b;
  }
}

}  // namespace detail_k

// y[n, out] = x[n, in] · w[out, in]ᵀ + bias[out]   (torch.nn.functional.linear)
inline void linear(ThreadPool& pool, const float* x, int64_t n, const MatrixRef& w, const float* bias, float* y) {
  auto body = [&](size_t r0, size_t r1) {
    switch (w.type) {
      case dtype::F32: detail_k::linear_rows<dtype::F32>(x, n, w, bias, y, int64_t(r0), int64_t(r1)); break;
      case dtype::F16: detail_k::linear_rows<dtype::F16>(x, n, w, bias, y, int64_t(r0), int64_t(r1)); break;
      case dtype::BF16: detail_k::linear_rows<dtype::BF16>(x, n, w, bias, y, int64_t(r0), int64_t(r1)); break;
      default: OPT_DASSERT(false);
    }
  };
  pool.parallel_for(size_t(w.rows), 16, body);
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
        const float* kt = k + t * ld + h * head_dim;
        float s = 0;
        for (int64_t d = 0; d < head_dim; ++d) s += qi[d] * kt[d];
        scores[t] = s;
        mx = std::max(mx, s);
      }
      float sum = 0;
      for (int64_t t = 0; t < len; ++t) {
        scores[t] = std::exp(scores[t] - mx);
        sum += scores[t];
      }
      const float inv = 1.0f / sum;
      float* oi = out + i * ld_out + h * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) oi[d] = 0;
      for (int64_t t = 0; t < len; ++t) {
        const float p = scores[t] * inv;
        const float* vt = v + t * ld + h * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) oi[d] += p * vt[d];
      }
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
