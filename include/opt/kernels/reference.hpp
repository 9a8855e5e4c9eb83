// Plain references for every kernel of kernels.hpp, written with Eigen in double precision: an implementation
// independent of ours (Eigen's own GEMM, reductions and std:: functions), slow on purpose. Tests and benchmarks
// compare the kernels of every ISA against them (llm.c's matmul_forward_naive, gemma's MatMulSlow).
#pragma once
#include "opt/detail/eigen.hpp"
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "opt/detail/fp16.hpp"
#include "opt/dtype.hpp"
#include "opt/kernels/activation.hpp"

OPT_NAMESPACE_BEGIN
namespace ref {

using MatrixD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMapF = Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
using MapF = Eigen::Map<Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;

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

inline MatrixD widen(dtype t, const void* w, int64_t rows, int64_t cols) {
  MatrixD m(rows, cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < cols; ++k) m(r, k) = element(t, w, cols, r, k);
  return m;
}

inline void linear_d(const float* x, int64_t n, const MatrixD& w, const float* bias, float* y) {
  const int64_t out = w.rows(), in = w.cols();
  MatrixD r = ConstMapF(x, n, in).cast<double>() * w.transpose();
  if (bias) r.rowwise() += Eigen::Map<const Eigen::VectorXf>(bias, out).cast<double>().transpose();
  MapF(y, n, out) = r.cast<float>();
}

// y[n, out] = x[n, in] · w[out, in]ᵀ + bias[out]        (torch.nn.functional.linear)
inline void linear(const float* x, int64_t n, dtype t, const void* w, int64_t out, int64_t in, const float* bias,
                   float* y) {
  linear_d(x, n, widen(t, w, out, in), bias, y);
}

// The same with int8 weights q[out, in] and one float scale per (row, block of `block` columns):
// w[r, k] = q[r, k] * scale[r * n_blocks + k / block].
inline void linear_q8(const float* x, int64_t n, const int8_t* q, const float* scale, int64_t block, int64_t out,
                      int64_t in, const float* bias, float* y) {
  const int64_t nb = (in + block - 1) / block;
  MatrixD w(out, in);
  for (int64_t r = 0; r < out; ++r)
    for (int64_t k = 0; k < in; ++k) w(r, k) = double(q[r * in + k]) * double(scale[r * nb + k / block]);
  linear_d(x, n, w, bias, y);
}

// The same with int4 weights, row-major two a byte (row r at r * ceil(in / 2) bytes; column k in byte k / 2, the
// low nibble when k is even; each nibble q + 8) and one float scale per (row, block of `block` columns).
inline void linear_q4(const float* x, int64_t n, const uint8_t* q, const float* scale, int64_t block, int64_t out,
                      int64_t in, const float* bias, float* y) {
  const int64_t nb = (in + block - 1) / block, rb = (in + 1) / 2;
  MatrixD w(out, in);
  for (int64_t r = 0; r < out; ++r)
    for (int64_t k = 0; k < in; ++k) {
      const int nib = (q[r * rb + k / 2] >> (k % 2 == 0 ? 0 : 4)) & 15;
      w(r, k) = double(nib - 8) * double(scale[r * nb + k / block]);
    }
  linear_d(x, n, w, bias, y);
}

// The index of the first NaN of s[0, n), else of its first largest value (torch.argmax); 0 when n <= 0.
inline int64_t argmax(const float* s, int64_t n) {
  if (n <= 0) return 0;
  const Eigen::Map<const Eigen::ArrayXf> a(s, Eigen::Index(n));
  for (Eigen::Index i = 0; i < a.size(); ++i)
    if (std::isnan(a[i])) return int64_t(i);
  Eigen::Index i = 0;
  a.maxCoeff(&i);  // the first index of the maximum
  return int64_t(i);
}

// y[n, d] = (x - mean) / sqrt(var + eps) * gamma + beta       (torch.nn.LayerNorm, biased variance)
inline void layer_norm(const float* x, int64_t n, int64_t d, const float* gamma, const float* beta, float eps,
                       float* y) {
  const MatrixD X = ConstMapF(x, n, d).cast<double>();
  const Eigen::VectorXd mean = X.rowwise().mean();
  const MatrixD c = X.colwise() - mean;
  const Eigen::VectorXd var = c.array().square().rowwise().mean();
  MatrixD o = (c.array().colwise() / (var.array() + double(eps)).sqrt()).matrix();
  if (gamma) o = (o.array().rowwise() * Eigen::Map<const Eigen::VectorXf>(gamma, d).cast<double>().transpose().array()).matrix();
  if (beta) o.rowwise() += Eigen::Map<const Eigen::VectorXf>(beta, d).cast<double>().transpose();
  MapF(y, n, d) = o.cast<float>();
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

// Causal attention of n new tokens at positions [past, past + n): q [n, H] (already scaled), k/v with position t
// of head h at t * ld + h * hs, out [n, H]. softmax(q·kᵀ) · v per head, token i seeing cache rows [0, past + i].
inline void attention(const float* q, int64_t past, int64_t n, const float* k, const float* v, int64_t ld,
                      int64_t hs, int64_t n_heads, int64_t head_dim, float* out) {
  const int64_t H = n_heads * head_dim, T = past + n;
  using Strided = Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, 0,
                             Eigen::OuterStride<>>;
  for (int64_t h = 0; h < n_heads; ++h) {
    const MatrixD Q = Strided(q + h * head_dim, n, head_dim, Eigen::OuterStride<>(H)).cast<double>();
    const MatrixD K = Strided(k + h * hs, T, head_dim, Eigen::OuterStride<>(ld)).cast<double>();
    const MatrixD Vh = Strided(v + h * hs, T, head_dim, Eigen::OuterStride<>(ld)).cast<double>();
    MatrixD S = Q * K.transpose();  // [n, T]
    for (int64_t i = 0; i < n; ++i) {
      const int64_t len = past + i + 1;
      const double mx = S.row(i).head(len).maxCoeff();
      S.row(i).head(len) = (S.row(i).head(len).array() - mx).exp().matrix();
      S.row(i).head(len) /= S.row(i).head(len).sum();
      if (len < T) S.row(i).tail(T - len).setZero();
    }
    const MatrixD O = S * Vh;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t d = 0; d < head_dim; ++d) out[i * H + h * head_dim + d] = float(O(i, d));
  }
}

// The same over a cache of F32, F16 or BF16 elements: each element widened to float, then as above.
inline void attention(const float* q, int64_t past, int64_t n, dtype kv, const void* k, const void* v, int64_t ld,
                      int64_t hs, int64_t n_heads, int64_t head_dim, float* out) {
  // elements [0, extent) cover every position and head the causal pass reads
  const int64_t extent = (past + n - 1) * ld + (n_heads - 1) * hs + head_dim;
  const size_t ne = static_cast<size_t>(extent);
  std::vector<float> kf(ne), vf(ne);
  for (int64_t i = 0; i < extent; ++i) {
    kf[size_t(i)] = element(kv, k, extent, 0, i);
    vf[size_t(i)] = element(kv, v, extent, 0, i);
  }
  attention(q, past, n, kf.data(), vf.data(), ld, hs, n_heads, head_dim, out);
}

}  // namespace ref
OPT_NAMESPACE_END
