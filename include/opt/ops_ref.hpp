// Plain scalar references for every kernel of ops.hpp and quantize.hpp: the textbook loop, accumulated in
// double. Slow on purpose; tests and benchmarks compare the fast kernels against them (llm.c's
// matmul_forward_naive, gemma's MatMulSlow).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "opt/config.hpp"
#include "opt/detail/fp16.hpp"
#include "opt/safetensors.hpp"

OPT_NAMESPACE_BEGIN
namespace ref {

// Element (r, k) of a [rows, cols] matrix stored as F32, F16 or BF16, as float.
inline float element(dtype t, const void* data, int64_t cols, int64_t r, int64_t k) {
  const size_t i = size_t(r) * size_t(cols) + size_t(k);
  switch (t) {
    case dtype::F32: return static_cast<const float*>(data)[i];
    case dtype::F16: return opt::detail::f16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case dtype::BF16: return opt::detail::bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    default: return std::numeric_limits<float>::quiet_NaN();
  }
}

// y[n, out] = x[n, in] · w[out, in]ᵀ + bias[out]        (torch.nn.functional.linear)
inline void linear(const float* x, int64_t n, dtype t, const void* w, int64_t out, int64_t in, const float* bias,
                   float* y) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t r = 0; r < out; ++r) {
      double s = bias ? bias[r] : 0.0;
      for (int64_t k = 0; k < in; ++k) s += double(x[i * in + k]) * double(element(t, w, in, r, k));
      y[i * out + r] = float(s);
    }
}

// The same with int8 weights q[out, in] and one float scale per (row, block of `block` columns):
// w[r, k] = q[r, k] * scale[r * n_blocks + k / block].
inline void linear_q8(const float* x, int64_t n, const int8_t* q, const float* scale, int64_t block, int64_t out,
                      int64_t in, const float* bias, float* y) {
  const int64_t nb = (in + block - 1) / block;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t r = 0; r < out; ++r) {
      double s = bias ? bias[r] : 0.0;
      for (int64_t k = 0; k < in; ++k)
        s += double(x[i * in + k]) * double(q[r * in + k]) * double(scale[r * nb + k / block]);
      y[i * out + r] = float(s);
    }
}

// y[n, d] = (x - mean) / sqrt(var + eps) * gamma + beta       (torch.nn.LayerNorm, biased variance)
inline void layer_norm(const float* x, int64_t n, int64_t d, const float* gamma, const float* beta, float eps,
                       float* y) {
  for (int64_t i = 0; i < n; ++i) {
    double m = 0, v = 0;
    for (int64_t k = 0; k < d; ++k) m += x[i * d + k];
    m /= double(d);
    for (int64_t k = 0; k < d; ++k) v += (x[i * d + k] - m) * (x[i * d + k] - m);
    v /= double(d);
    for (int64_t k = 0; k < d; ++k) {
      double o = (x[i * d + k] - m) / std::sqrt(v + double(eps));
      if (gamma) o *= gamma[k];
      if (beta) o += beta[k];
      y[i * d + k] = float(o);
    }
  }
}

inline double activate(activation a, double v) {
  switch (a) {
    case activation::relu: return v > 0 ? v : 0;
    case activation::gelu: return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
    case activation::gelu_new: return 0.5 * v * (1 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
    case activation::silu: return v / (1 + std::exp(-v));
    case activation::quick_gelu: return v / (1 + std::exp(-1.702 * v));
    case activation::tanh: return std::tanh(v);
    case activation::sigmoid: return 1 / (1 + std::exp(-v));
  }
  return v;
}

// Causal attention of n new tokens at positions [past, past + n): q [n, H] (already scaled), k/v [past + n, H]
// with row stride ld, out [n, H]. softmax(q·kᵀ) · v per head, token i seeing cache rows [0, past + i].
inline void attention(const float* q, int64_t past, int64_t n, const float* k, const float* v, int64_t ld,
                      int64_t n_heads, int64_t head_dim, float* out) {
  const int64_t H = n_heads * head_dim;
  std::vector<double> s;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < n_heads; ++h) {
      const int64_t len = past + i + 1;
      s.assign(size_t(len), 0.0);
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t t = 0; t < len; ++t) {
        for (int64_t d = 0; d < head_dim; ++d) s[t] += double(q[i * H + h * head_dim + d]) * k[t * ld + h * head_dim + d];
        mx = std::max(mx, s[t]);
      }
      double sum = 0;
      for (int64_t t = 0; t < len; ++t) sum += (s[t] = std::exp(s[t] - mx));
      for (int64_t d = 0; d < head_dim; ++d) {
        double o = 0;
        for (int64_t t = 0; t < len; ++t) o += s[t] / sum * v[t * ld + h * head_dim + d];
        out[i * H + h * head_dim + d] = float(o);
      }
    }
}

}  // namespace ref
OPT_NAMESPACE_END
