// int8 weight-only quantization, chosen at load (LoadOptions::quantize): each row of a [rows, cols] weight is cut
// into blocks of ops::kQ8Block (128) columns; a block stores int8 values q = round(w / s) with
// s = max|w| / 127 over the block (symmetric, no zero point). The kernels widen q * s to f32 inside the dot
// product; compute stays f32. Error per weight <= s / 2 = max|w_block| / 254.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "opt/ops.hpp"
#include "opt/thread_pool.hpp"

OPT_NAMESPACE_BEGIN

// An owned int8 matrix with its scales; ref() views it for the kernels.
struct QuantizedMatrix {
  ops::aligned_vector<int8_t> q;  // [rows, cols], 64-byte aligned
  std::vector<float> scale;   // [rows, ceil(cols / block)]
  int64_t rows = 0, cols = 0, block = ops::kQ8Block;

  MatrixRef ref() const noexcept {
    MatrixRef m{dtype::I8, q.data(), rows, cols};
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

// src (F32, F16 or BF16) -> int8 + per-(row, block) scales, split over the pool's threads.
inline QuantizedMatrix quantize_int8(const MatrixRef& src, ThreadPool* pool = nullptr) {
  QuantizedMatrix d;
  d.rows = src.rows, d.cols = src.cols;
  const int64_t nb = (src.cols + d.block - 1) / d.block;
  d.q.resize(size_t(src.rows * src.cols));
  d.scale.resize(size_t(src.rows * nb));
  if (!pool) {
    std::vector<float> row;
    quantize_int8_rows(src, d, 0, src.rows, row);
    return d;
  }
  pool->parallel_for(size_t(src.rows), 64, [&](size_t b, size_t e) {
    std::vector<float> row;
    quantize_int8_rows(src, d, int64_t(b), int64_t(e), row);
  });
  return d;
}

OPT_NAMESPACE_END
