// Weight-only quantization, chosen at load (LoadOptions::quantize). The kernels widen q to f32 inside the dot
// product and apply s per block; compute stays f32.
// - int8: each row of a [rows, cols] weight is cut into blocks of ops::kQ8Block (128) columns; a block stores
//   int8 values q = round(w / s) with s = max|w| / 127 over the block (symmetric, no zero point). Error per
//   weight <= s / 2 = max|w_block| / 254.
// - int4: blocks of ops::kQ4Block (32) columns, q = round(w / s) in [-8, 7] with s = -e / 8, e the block's
//   extreme (the weight of largest magnitude, the first one on a tie): e itself is exact (q = -8), and the step
//   is max|w| / 8 rather than the max|w| / 7 of a [-7, 7] code, all 16 codes used. Error per weight <= |s| / 2,
//   but for weights of the extreme's other sign beyond 15/16 of its magnitude (rounded to +8, clamped to 7:
//   error < |s|). Symmetric,
//   no zero point (a zero point would cost another value per block for weights that are centred on 0).
//   Measured (Gaussian weights, RMS error / sigma): blocks of 32: 0.0855 with s = -e / 8, 0.0933 with
//   s = max|w| / 8 (clamped to [-8, 7]), 0.0965 with s = max|w| / 7 ([-7, 7]); blocks of 64: 0.0954, 0.0997,
//   0.108. Blocks of 32 cost 5 bits a weight (64: 4.5) for 10% less error; on the fixtures they kept greedy
//   decoding equal to f32's longer (543 / 1438 tokens against 456 with 64). On random 125m-shape weights the
//   schemes' max logit errors were within noise of each other (0.48 to 0.54, max |logit| 2.8).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "opt/ops.hpp"
#include "opt/thread_pool.hpp"

OPT_NAMESPACE_BEGIN

// An owned row-major int8 or int4 matrix with its scales; ref() views it for the kernels (ops::pack repacks it).
struct QuantizedMatrix {
  dtype type = dtype::I8;         // I8, or I4 (two weights a byte: MatrixRef's I4 rows)
  ops::aligned_vector<int8_t> q;  // I8: [rows, cols]; I4: [rows, ceil(cols / 2)] bytes; 64-byte aligned
  std::vector<float> scale;   // [rows, ceil(cols / block)]
  int64_t rows = 0, cols = 0, block = ops::kQ8Block;

  MatrixRef ref() const noexcept {
    MatrixRef m{type, q.data(), rows, cols};
    m.scale = scale.data();
    m.block = block;
    return m;
  }
};

// Quantizes rows [r0, r1) of src into dst (sized by the caller), through the active ISA's quantizer kernel.
inline void quantize_int8_rows(const MatrixRef& src, QuantizedMatrix& dst, int64_t r0, int64_t r1,
                               std::vector<float>& row) {
  const int64_t K = src.cols, nb = (K + dst.block - 1) / dst.block;
  row.resize(size_t(K));
  for (int64_t r = r0; r < r1; ++r) {
    ops::row_to_f32(src, r, row.data());
    ops::quantize_rows(row.data(), K, dst.block, 0, 1, dst.q.data() + r * K, dst.scale.data() + r * nb);
  }
}

namespace detail {
// quantize_rows(src, d, r0, r1, row) over all of src's rows, split over the pool's threads (each with its row buffer).
template <class Rows>
inline void quantize_all_rows(const MatrixRef& src, QuantizedMatrix& d, ThreadPool* pool, Rows&& quantize_rows) {
  if (!pool) {
    std::vector<float> row;
    quantize_rows(src, d, 0, src.rows, row);
    return;
  }
  pool->parallel_for(size_t(src.rows), 64, [&](size_t b, size_t e) {
    std::vector<float> row;
    quantize_rows(src, d, int64_t(b), int64_t(e), row);
  });
}
}  // namespace detail

// src (F32, F16 or BF16) -> int8 + per-(row, block) scales, split over the pool's threads.
inline QuantizedMatrix quantize_int8(const MatrixRef& src, ThreadPool* pool = nullptr) {
  QuantizedMatrix d;
  d.rows = src.rows, d.cols = src.cols;
  const int64_t nb = (src.cols + d.block - 1) / d.block;
  d.q.resize(size_t(src.rows * src.cols));
  d.scale.resize(size_t(src.rows * nb));
  detail::quantize_all_rows(src, d, pool, quantize_int8_rows);
  return d;
}

// Quantizes rows [r0, r1) of src into the int4 matrix dst (sized by the caller), through the active ISA's kernel.
inline void quantize_int4_rows(const MatrixRef& src, QuantizedMatrix& dst, int64_t r0, int64_t r1,
                               std::vector<float>& row) {
  const int64_t K = src.cols, nb = (K + dst.block - 1) / dst.block, rb = (K + 1) / 2;
  row.resize(size_t(K));
  uint8_t* q = reinterpret_cast<uint8_t*>(dst.q.data());
  for (int64_t r = r0; r < r1; ++r) {
    ops::row_to_f32(src, r, row.data());
    ops::quantize_rows_i4(row.data(), K, dst.block, 0, 1, q + r * rb, dst.scale.data() + r * nb);
  }
}

// src (F32, F16 or BF16) -> row-major int4 (I4) + per-(row, block of `block` columns) scales, split over the
// pool's threads. ops::pack(result.ref()) gives the kernels' panels.
inline QuantizedMatrix quantize_int4(const MatrixRef& src, ThreadPool* pool = nullptr,
                                     int64_t block = ops::kQ4Block) {
  QuantizedMatrix d;
  d.type = dtype::I4;
  d.rows = src.rows, d.cols = src.cols, d.block = block;
  const int64_t nb = (src.cols + d.block - 1) / d.block;
  d.q.resize(size_t(src.rows) * size_t((src.cols + 1) / 2));
  d.scale.resize(size_t(src.rows * nb));
  detail::quantize_all_rows(src, d, pool, quantize_int4_rows);
  return d;
}

OPT_NAMESPACE_END
