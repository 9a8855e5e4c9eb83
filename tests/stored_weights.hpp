// A weight matrix in a given storage (F32, F16, BF16, or I8 / I4 with scales) built from f32 values, plus the f32
// values the kernels actually see after rounding or quantization. Shared by tests/test_ops.cpp and bench/bench_ops.cpp.
#pragma once
#include <cstdint>
#include <cstring>
#include <opt/detail/fp16.hpp>
#include <opt/ops.hpp>
#include <opt/quantize.hpp>
#include <vector>

namespace opt_test {

struct StoredWeights {
  opt::MatrixRef stored;     // as a checkpoint stores it (row-major)
  opt::PackedWeights packed;  // the kernels' panels
  opt::PackedMatrix ref;      // packed.view()
  std::vector<float> f32;  // the values the kernel sees (after rounding/quantization)
  std::vector<uint16_t> h16;
  opt::QuantizedMatrix q8;  // I8 or I4
};

inline StoredWeights store_weights(opt::dtype t, int64_t rows, int64_t cols, std::vector<float> values) {
  StoredWeights w;
  w.f32 = std::move(values);
  if (t == opt::dtype::F32) {
    w.stored = {t, w.f32.data(), rows, cols};
  } else if (t == opt::dtype::I8 || t == opt::dtype::I4) {
    const opt::MatrixRef src{opt::dtype::F32, w.f32.data(), rows, cols};
    w.q8 = t == opt::dtype::I8 ? opt::quantize_int8(src) : opt::quantize_int4(src);
    w.stored = w.q8.ref();
    for (int64_t r = 0; r < rows; ++r) opt::ops::row_to_f32(w.stored, r, w.f32.data() + r * cols);
  } else {
    w.h16.resize(w.f32.size());
    for (size_t i = 0; i < w.f32.size(); ++i) {
      w.h16[i] = t == opt::dtype::F16 ? opt::detail::f32_to_f16(w.f32[i]) : opt::detail::f32_to_bf16(w.f32[i]);
      w.f32[i] = t == opt::dtype::F16 ? opt::detail::f16_to_f32(w.h16[i]) : opt::detail::bf16_to_f32(w.h16[i]);
    }
    w.stored = {t, w.h16.data(), rows, cols};
  }
  w.packed = opt::ops::pack(w.stored);
  w.ref = w.packed.view();
  return w;
}

// The values of m laid out in panel groups of g (PackedMatrix::group) in `bytes`: the same matrix (scales shared
// with m), another layout. g = 1 is the layout of version-1 stored packed folders.
inline opt::PackedMatrix regroup(const opt::PackedMatrix& m, int64_t g, opt::ops::aligned_vector<std::byte>& bytes) {
  opt::PackedMatrix r = m;
  r.group = g;
  bytes.assign(m.value_bytes(), std::byte{0});
  r.data = bytes.data();
  const size_t cb = opt::ops::panel_column_bytes(m.type);
  for (int64_t p = 0; p < m.panels(); ++p)
    for (int64_t c = 0; c < m.cols; ++c)
      std::memcpy(bytes.data() + (r.panel(p) - static_cast<const std::byte*>(r.data)) + size_t(c) * r.column_stride(p),
                  m.panel(p) + size_t(c) * m.column_stride(p), cb);
  return r;
}

}  // namespace opt_test
