// The kernel API: linear layers over packed weights (F32 / F16 / BF16 / I8 / I4), LayerNorm, activations,
// softmax and causal attention over a KV cache (F32 / F16 / BF16 elements), the int8 and int4 quantizers. Knows
// nothing of OPT or of file formats. Each call runs the ISA chosen by dispatch.hpp; each kernel has a plain Eigen
// reference in reference.hpp and a test.
//
// Determinism: every output is computed by one fixed sequence of IEEE operations that depends only on the
// problem's sizes: not on the thread count, the batch it is in, the tile it falls in, nor the instruction set
// (the order is spelled out in generic.hpp). So scalar, AVX2, AVX-512 and NEON give the same bits. Work is split
// across threads by panels of output rows (linear), (token, head) pairs (attention) or rows (LayerNorm).
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>

#include "opt/error.hpp"
#include "opt/kernels/dispatch.hpp"
#include "opt/kernels/matrix.hpp"
#include "opt/kernels/table.hpp"
#include "opt/thread_pool.hpp"

OPT_NAMESPACE_BEGIN
namespace ops {

// Several linear layers over the same input x [n, in] in one parallel pass (q/k/v: one dispatch, not three):
// y_s[n, out_s] = x · w_sᵀ + bias_s with each segment's epilogue. The concatenated panels are split over threads.
inline void linear_multi(ThreadPool& pool, const float* x, int64_t n, const LinearSeg* segs, size_t n_segs) {
  const kernels::Table& k = kernels::active();
  int64_t total = 0;
  for (size_t s = 0; s < n_segs; ++s) total += segs[s].w.panels();
  // a chunk is a few panels: a whole decode tile (4 panels on AVX-512 and AVX2), small enough to balance: the
  // thread that finishes first waits for at most one chunk of the other's. (Decode chunks of 4 panels rather than
  // 8: opt-125m tokens 0.98x (f32, int8) and 0.99x (bf16) as long in 200-300 paired rounds on Zen 5, 2 threads;
  // of 2, with single-panel tiles at the ends, 1.06x.)
  const size_t grain = n <= 8 ? 4 : 2;
  pool.parallel_for(size_t(total), grain, [&](size_t b, size_t e) {
    int64_t base = 0;
    for (size_t s = 0; s < n_segs; ++s) {
      const int64_t np = segs[s].w.panels();
      const int64_t p0 = std::max<int64_t>(int64_t(b) - base, 0), p1 = std::min<int64_t>(int64_t(e) - base, np);
      if (p0 < p1) k.linear(x, n, segs[s], p0, p1);
      base += np;
    }
  });
}

// y[n, out] = x[n, in] · w[out, in]ᵀ + bias[out]   (torch.nn.functional.linear), with an optional fused epilogue.
// approximate: LinearSeg::approximate.
inline void linear(ThreadPool& pool, const float* x, int64_t n, const PackedMatrix& w, const float* bias, float* y,
                   const Epilogue& ep = {}, bool approximate = false) {
  LinearSeg g{w, bias, y, w.rows, ep, approximate};
  linear_multi(pool, x, n, &g, 1);
}

// y[n, d] = LayerNorm(x) * gamma + beta over the last dimension (gamma/beta may be null: no affine).
inline void layer_norm(const float* x, int64_t n, int64_t d, const float* gamma, const float* beta, float eps,
                       float* y) {
  kernels::active().layer_norm(x, n, d, gamma, beta, eps, y);
}

inline float activate(activation a, float v) { return kernels::active().activate1(a, v); }
inline void activate(activation a, float* x, int64_t n) { kernels::active().activate(a, x, n); }

// s[t] = exp(s[t] - mx) for t < n; returns the sum.
inline float exp_sub_sum(float* s, int64_t n, float mx) { return kernels::active().exp_sub_sum(s, n, mx); }

// The index of the first largest of s[0, n), the first NaN if there is one (torch.argmax); 0 when n <= 0.
inline int64_t argmax(const float* s, int64_t n) { return kernels::active().argmax(s, n); }

// The element types an attention cache may hold: F32 (exact), F16 and BF16 (half the bytes; the kernels widen
// each element exactly to f32 and compute as for F32).
inline bool attention_cache_type(dtype t) noexcept { return t == dtype::F32 || t == dtype::F16 || t == dtype::BF16; }

namespace detail {
inline void check_attention_cache_type(dtype t) {
  if (!attention_cache_type(t))
    throw input_error(std::string("attention: a cache of ") + to_string(t) + " elements (expected F32, F16 or BF16)");
}
}  // namespace detail

// Causal multi-head attention of n new tokens of one sequence at positions [past, past + n).
//   q   [n, H]            already scaled by head_dim^-0.5 (OPT scales q before QKᵀ)
//   kv                    the element type of k and v: F32, F16 or BF16 (an input_error otherwise)
//   k,v                   the sequence's cache: position t of head h at element t * ld + h * hs (ld = H,
//                         hs = head_dim: rows of all heads; ld = head_dim, hs = capacity * head_dim: one block per
//                         head)
//   out [n, H]            row stride ld_out
//   scores: scratch of at least kAttentionScratch * (past + i1) floats
// Tokens [i0, i1) x heads [h0, h1); token i attends to cache rows [0, past + i].
inline void attention_rows(const float* q, int64_t past, dtype kv, const void* k, const void* v, int64_t ld,
                           int64_t hs, int64_t n_heads, int64_t head_dim, float* out, int64_t ld_out, float* scores,
                           int64_t i0, int64_t i1, int64_t h0, int64_t h1) {
  detail::check_attention_cache_type(kv);
  kernels::active().attention(q, past, kv, k, v, ld, hs, n_heads, head_dim, out, ld_out, scores, i0, i1, h0, h1);
}
// The same over an F32 cache.
inline void attention_rows(const float* q, int64_t past, const float* k, const float* v, int64_t ld, int64_t hs,
                           int64_t n_heads, int64_t head_dim, float* out, int64_t ld_out, float* scores, int64_t i0,
                           int64_t i1, int64_t h0, int64_t h1) {
  attention_rows(q, past, dtype::F32, k, v, ld, hs, n_heads, head_dim, out, ld_out, scores, i0, i1, h0, h1);
}

// The same for all n tokens and heads, split over (head, block of kAttentionScratch tokens) units: each unit is
// computed whole by one thread, a thread walking the tokens of one head (whose key/value columns stay in its cache).
// scores: kAttentionScratch * (past + n) floats per pool thread.
inline void attention(ThreadPool& pool, const float* q, int64_t past, int64_t n, dtype kv, const void* k,
                      const void* v, int64_t ld, int64_t hs, int64_t n_heads, int64_t head_dim, float* out,
                      float* scores) {
  detail::check_attention_cache_type(kv);
  const kernels::Table& kt = kernels::active();
  constexpr int64_t B = kAttentionScratch;
  const int64_t H = n_heads * head_dim, len_max = past + n, blocks = (n + B - 1) / B;
  pool.parallel_for_t(size_t(blocks * n_heads), 1, [&](size_t t, size_t b, size_t e) {
    float* sc = scores + t * size_t(B * len_max);
    for (size_t p = b; p < e; ++p) {
      const int64_t hh = int64_t(p) / blocks, i = (int64_t(p) % blocks) * B;
      kt.attention(q, past, kv, k, v, ld, hs, n_heads, head_dim, out, H, sc, i, std::min(n, i + B), hh, hh + 1);
    }
  });
}
// The same over an F32 cache.
inline void attention(ThreadPool& pool, const float* q, int64_t past, int64_t n, const float* k, const float* v,
                      int64_t ld, int64_t hs, int64_t n_heads, int64_t head_dim, float* out, float* scores) {
  attention(pool, q, past, n, dtype::F32, k, v, ld, hs, n_heads, head_dim, out, scores);
}

// int8 quantization of a row-major f32 [rows, cols] matrix, rows [r0, r1): see quantize.hpp.
inline void quantize_rows(const float* w, int64_t cols, int64_t block, int64_t r0, int64_t r1, int8_t* q,
                          float* scale) {
  kernels::active().quantize_rows(w, cols, block, r0, r1, q, scale);
}

// int4 quantization of the same, q two a byte (MatrixRef's I4 rows): see quantize.hpp.
inline void quantize_rows_i4(const float* w, int64_t cols, int64_t block, int64_t r0, int64_t r1, uint8_t* q,
                             float* scale) {
  kernels::active().quantize_rows_i4(w, cols, block, r0, r1, q, scale);
}

}  // namespace ops
OPT_NAMESPACE_END
