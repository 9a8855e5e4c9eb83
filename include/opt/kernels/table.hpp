// The interface every instruction set implements: the arguments of the kernels and one table of function
// pointers per ISA (filled by scalar.hpp, avx2.hpp, avx512.hpp, neon.hpp; chosen by dispatch.hpp).
#pragma once
#include <cstdint>

#include "opt/kernels/activation.hpp"
#include "opt/kernels/isa.hpp"
#include "opt/kernels/matrix.hpp"

OPT_NAMESPACE_BEGIN
namespace ops {

// Query tokens of one head that the attention kernel takes together; its scratch holds that many rows of scores.
constexpr int64_t kAttentionScratch = 16;

// What happens to each output value v = x·w before it is stored (fused into the linear kernel, the same
// operations in the same order as the separate torch ops): v += bias; v *= scale; v = act(v); y = old y + v.
struct Epilogue {
  float scale = 1.0f;
  bool has_scale = false;  // q_proj(h) * head_dim^-0.5
  bool has_act = false;    // fc1 -> activation_fn
  activation act = activation::relu;
  bool residual = false;   // y = residual (the old y) + v
};

// One output of a (possibly fused) linear layer: rows of weight w, written to y[i * ldy + r].
struct LinearSeg {
  PackedMatrix w;                // [out, in] in panels
  const float* bias = nullptr;   // [out] or null
  float* y = nullptr;            // [n, ldy]
  int64_t ldy = 0;
  Epilogue ep{};
  // I8 weights, one token: the ISA's int8 dot products over x quantized to int8 per block of columns (AVX-512
  // VNNI), where it has them. Opt-in and not exact: a result within the inputs' quantization error of the exact
  // one, and not the same bits on every ISA (a drafter's choice, see LoadOptions::approximate_int8).
  bool approximate = false;
};

}  // namespace ops

namespace kernels {

// One ISA's kernels. Every entry computes each output with the same operations in the same order on every ISA
// (see kernels.hpp), so the tables differ in speed only.
struct Table {
  isa id = isa::scalar;
  // Panels [p0, p1) of segment g for n tokens x [n, g.w.cols].
  void (*linear)(const float* x, int64_t n, const ops::LinearSeg& g, int64_t p0, int64_t p1) = nullptr;
  // y[n, d] = LayerNorm(x) * gamma + beta (gamma/beta may be null).
  void (*layer_norm)(const float* x, int64_t n, int64_t d, const float* gamma, const float* beta, float eps,
                     float* y) = nullptr;
  // Causal attention of tokens [i0, i1) x heads [h0, h1) over a cache of element type kv: F32, F16 or BF16
  // (see ops::attention_rows).
  void (*attention)(const float* q, int64_t past, dtype kv, const void* k, const void* v, int64_t ld, int64_t hs,
                    int64_t n_heads, int64_t head_dim, float* out, int64_t ld_out, float* scores, int64_t i0,
                    int64_t i1, int64_t h0, int64_t h1) = nullptr;
  // x[i] = act(x[i]) and one value.
  void (*activate)(activation a, float* x, int64_t n) = nullptr;
  float (*activate1)(activation a, float v) = nullptr;
  // s[t] = exp(s[t] - mx) for t < n; returns their sum (softmax's denominator).
  float (*exp_sub_sum)(float* s, int64_t n, float mx) = nullptr;
  // The index of the first largest of s[0, n), the first NaN if there is one (torch.argmax); 0 when n <= 0.
  int64_t (*argmax)(const float* s, int64_t n) = nullptr;
  // int8 quantization of rows [r0, r1) of a row-major f32 matrix [rows, cols]: q = round(w / s) per block of
  // `block` columns, s = max|w| / 127 (1 for an all-zero block).
  void (*quantize_rows)(const float* w, int64_t cols, int64_t block, int64_t r0, int64_t r1, int8_t* q,
                        float* scale) = nullptr;
  // int4 quantization of the same: q = round(w / s) in [-8, 7] per block, s = -(the block's extreme) / 8 (1 for an
  // all-zero block); q row-major, two a byte as q + 8 (MatrixRef's I4 rows).
  void (*quantize_rows_i4)(const float* w, int64_t cols, int64_t block, int64_t r0, int64_t r1, uint8_t* q,
                           float* scale) = nullptr;
};

}  // namespace kernels
OPT_NAMESPACE_END
