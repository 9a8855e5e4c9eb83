// The matrices the kernels read. Knows nothing of OPT or of file formats.
//   MatrixRef     a row-major [rows, cols] view (PyTorch's Linear layout [out, in]) of F32, F16, BF16, or I8 / I4 +
//                 scales: what a checkpoint stores or the quantizer makes; rows are read by the embedding lookup
//                 and the quantizer. I4 rows are ceil(cols / 2) bytes: column c in byte c / 2, the low nibble when
//                 c is even, each nibble q + 8 (q in [-8, 7]); an odd row's last high nibble is 8 (q = 0).
//   PackedMatrix  the same values repacked into panels of kPanel rows, column by column ([panel][col][kPanel]),
//                 the layout of the linear kernels: one load gives one column of kPanel weight rows, so every
//                 output is one sequential FMA chain over its inputs, whatever the vector width (see kernels.hpp).
//   PackedWeights owns a PackedMatrix's storage (64-byte aligned); pack() makes one from a MatrixRef.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#include "opt/detail/fp16.hpp"
#include "opt/detail/large_alloc.hpp"
#include "opt/dtype.hpp"
#include "opt/thread_pool.hpp"

OPT_NAMESPACE_BEGIN

// A read-only [rows, cols] row-major matrix (PyTorch's Linear layout: [out_features, in_features]).
struct MatrixRef {
  dtype type = dtype::F32;  // F32, F16, BF16, I8 or I4 (I8 / I4 with scales)
  const void* data = nullptr;
  int64_t rows = 0, cols = 0;

  const float* scale = nullptr;  // I8 / I4 only: [rows, ceil(cols / block)] per-row, per-block scales
  int64_t block = 0;             // I8 / I4 only: columns per scale

  // Bytes of one row (I4: two weights a byte, the last one rounded up).
  size_t row_bytes() const noexcept {
    return type == dtype::I4 ? (size_t(cols) + 1) / 2 : size_t(cols) * dtype_size(type);
  }
  const std::byte* row_ptr(int64_t r) const noexcept {
    return static_cast<const std::byte*>(data) + size_t(r) * row_bytes();
  }
  int64_t blocks_per_row() const noexcept { return block ? (cols + block - 1) / block : 0; }
  // Bytes a pass over the whole matrix reads (values and scales).
  size_t bytes() const noexcept {
    if (!data) return 0;
    return size_t(rows) * row_bytes() + size_t(rows) * size_t(blocks_per_row()) * 4;
  }
};

namespace ops {

// std::allocator with 64-byte (cache line, one AVX-512 vector) alignment; buffers of 4 MiB and more are
// 2 MiB-aligned mappings backed by transparent huge pages where the system allows (detail/large_alloc.hpp).
template <class T>
struct AlignedAllocator {
  using value_type = T;
  static constexpr std::size_t kAlign = 64;
  AlignedAllocator() = default;
  template <class U>
  AlignedAllocator(const AlignedAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    if (n > std::size_t(-1) / sizeof(T)) throw std::bad_array_new_length();
    return static_cast<T*>(detail::large_alloc(n * sizeof(T), kAlign));
  }
  void deallocate(T* p, std::size_t n) noexcept { detail::large_free(p, n * sizeof(T), kAlign); }
  template <class U>
  bool operator==(const AlignedAllocator<U>&) const noexcept { return true; }
  template <class U>
  bool operator!=(const AlignedAllocator<U>&) const noexcept { return false; }
};
template <class T>
using aligned_vector = std::vector<T, AlignedAllocator<T>>;

// Rows per panel: one AVX-512 vector of f32, two AVX2 vectors, four NEON vectors, sixteen scalars.
constexpr int64_t kPanel = 16;
// int8 weights: one f32 scale per row and block of kQ8Block columns.
constexpr int64_t kQ8Block = 128;
// int4 weights: one f32 scale per row and block of kQ4Block columns (see quantize.hpp for why 32).
constexpr int64_t kQ4Block = 32;
// Bytes of one panel column (kPanel weights of consecutive rows). I4 packs two a byte: byte j holds row j in its
// low nibble and row j + kPanel / 2 in its high nibble, each the weight's q + 8 (q in [-8, 7]).
constexpr size_t panel_column_bytes(dtype t) noexcept {
  return t == dtype::I4 ? size_t(kPanel) / 2 : size_t(kPanel) * dtype_size(t);
}
// Panels a packed matrix of type t interleaves column by column (PackedMatrix::group) when this build packs it,
// so that a tile reading whole groups reads one sequential stream. A decode tile (1-4 tokens; AVX-512 16-bit
// weights 1-6) reads 4 panels; a tile of 5-8 tokens or of prefill reads 2 (kernels/*.hpp: np_for, kNP), and where
// that is half a group's column of 16-bit or f32 weights it reads every other cache line, which was slow.
// Measured on Zen 5 (2 threads, paired rounds in one process, against panel after panel):
//   I8:   groups of 4: a decode token 0.82x, a 9-token pass (speculative verification) 1.04x;
//         groups of 2: 0.89x and 0.96x
//   BF16: groups of 4: opt-125m decode 0.91x, 9-token pass 1.14x; opt-1.3b 0.96x, 1.16x (17 tokens 1.13x);
//         groups of 2: opt-125m 0.94x, 0.98x; opt-1.3b 0.98x, 1.07x (17 tokens 1.02x)
//   F32:  groups of 4: opt-125m decode 0.92x; groups of 2: 0.96x
// So integer weights (an I8 / I4 group column is at most one cache line, which every tile reads whole) go in
// groups of 4, float weights in groups of 2.
constexpr int64_t panel_group(dtype t) noexcept { return t == dtype::I8 || t == dtype::I4 ? 4 : 2; }
// Types whose weights are integers with one f32 scale per (row, block of columns).
constexpr bool has_scales(dtype t) noexcept { return t == dtype::I8 || t == dtype::I4; }

}  // namespace ops

// [rows, cols] in panels of kPanel rows: element (r, c) in panel p = r / kPanel, row r % kPanel of its column c
// (ops::panel_column_bytes(type) bytes a column); the last panel is padded with zero rows (I4: nibbles 8, q = 0)
// whose scales are 0. The panels go in groups of `group` (the last group may hold fewer), each group's columns
// interleaved: column c of its panels one after the other, then column c + 1. So panel p's column c is at
// panel(p) + c * column_stride(p), and a group is one contiguous stream; group 1 is panel after panel. Every
// kernel gives the same bits for any group. I8 / I4: scale (r, block b) at panel r / kPanel, offset
// b * kPanel + r % kPanel (not interleaved).
struct PackedMatrix {
  dtype type = dtype::F32;  // F32, F16, BF16, I8 or I4
  const void* data = nullptr;
  const float* scale = nullptr;  // I8 / I4 only
  int64_t rows = 0, cols = 0, block = 0;
  int64_t group = 1;  // panels interleaved column by column (ops::panel_group(type) when packed by this build)

  int64_t panels() const noexcept { return (rows + ops::kPanel - 1) / ops::kPanel; }
  int64_t blocks() const noexcept { return block ? (cols + block - 1) / block : 0; }
  // panels in p's group
  int64_t group_panels(int64_t p) const noexcept { return std::min(group, panels() - p / group * group); }
  // panel p's column 0; its column c is column_stride(p) bytes after column c - 1
  const std::byte* panel(int64_t p) const noexcept {
    const int64_t g0 = p / group * group;
    return static_cast<const std::byte*>(data) +
           (size_t(g0) * size_t(cols) + size_t(p - g0)) * ops::panel_column_bytes(type);
  }
  size_t column_stride(int64_t p) const noexcept { return size_t(group_panels(p)) * ops::panel_column_bytes(type); }
  const float* panel_scales(int64_t p) const noexcept { return scale + size_t(p) * size_t(blocks()) * size_t(ops::kPanel); }
  // Sizes of the two arrays: value bytes (padding included) and f32 scales (0 for float types).
  size_t value_bytes() const noexcept { return size_t(panels()) * size_t(cols) * ops::panel_column_bytes(type); }
  size_t scale_count() const noexcept { return size_t(panels()) * size_t(blocks()) * size_t(ops::kPanel); }
  // Bytes one pass over the matrix reads (values, padding and scales).
  size_t bytes() const noexcept { return data ? value_bytes() + scale_count() * 4 : 0; }
  explicit operator bool() const noexcept { return data != nullptr; }
};

// Owned panel storage; view() is valid while it lives (moving it keeps the addresses).
struct PackedWeights {
  ops::aligned_vector<std::byte> values;
  ops::aligned_vector<float> scales;
  PackedMatrix m;
  const PackedMatrix& view() const noexcept { return m; }
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
    case dtype::I8: {
      const int8_t* q = reinterpret_cast<const int8_t*>(p);
      const float* s = m.scale + r * m.blocks_per_row();
      for (int64_t i = 0; i < n; ++i) out[i] = float(q[i]) * s[i / m.block];
      break;
    }
    case dtype::I4: {
      const uint8_t* q = reinterpret_cast<const uint8_t*>(p);
      const float* s = m.scale + r * m.blocks_per_row();
      for (int64_t i = 0; i < n; ++i) out[i] = float(int((q[i / 2] >> (4 * (i % 2))) & 15) - 8) * s[i / m.block];
      break;
    }
    default: OPT_DASSERT(false);
  }
}

// Element (r, c) of a packed matrix as float (tests, and what the kernels see).
inline float packed_element(const PackedMatrix& m, int64_t r, int64_t c) {
  const int64_t pi = r / kPanel, j = r % kPanel;
  const std::byte* p = m.panel(pi) + size_t(c) * m.column_stride(pi);  // column c of the panel
  switch (m.type) {
    case dtype::F32: return reinterpret_cast<const float*>(p)[j];
    case dtype::F16: return detail::f16_to_f32(reinterpret_cast<const uint16_t*>(p)[j]);
    case dtype::BF16: return detail::bf16_to_f32(reinterpret_cast<const uint16_t*>(p)[j]);
    case dtype::I8:
      return float(reinterpret_cast<const int8_t*>(p)[j]) *
             m.panel_scales(pi)[size_t(c / m.block) * size_t(kPanel) + size_t(j)];
    case dtype::I4: {
      const int64_t half = kPanel / 2;
      const uint8_t b = reinterpret_cast<const uint8_t*>(p)[size_t(j % half)];
      return float(int(j < half ? b & 15 : b >> 4) - 8) *
             m.panel_scales(pi)[size_t(c / m.block) * size_t(kPanel) + size_t(j)];
    }
    default: return 0.0f;
  }
}

namespace detail_pack {
// Rows [r0, r0 + rows) of src (elements of type E) into one panel whose columns are `stride` bytes apart:
// column c gets src[r0 + j, c] at j < rows and zeros (padding) up to kPanel.
template <class E>
inline void columns(const MatrixRef& src, int64_t r0, int64_t rows, std::byte* dst, size_t stride) {
  const E* row[kPanel];
  for (int64_t j = 0; j < rows; ++j) row[j] = reinterpret_cast<const E*>(src.row_ptr(r0 + j));
  const int64_t K = src.cols;
  for (int64_t c = 0; c < K; ++c) {
    E* col = reinterpret_cast<E*>(dst + size_t(c) * stride);
    for (int64_t j = 0; j < rows; ++j) col[j] = row[j][c];
    for (int64_t j = rows; j < kPanel; ++j) col[j] = E(0);
  }
}
// The same from I4 rows (two weights a byte) into I4 panel columns of kPanel / 2 bytes; missing rows get
// nibble 8 (q = 0).
inline void columns_i4(const MatrixRef& src, int64_t r0, int64_t rows, std::byte* dst, size_t stride) {
  constexpr int64_t half = kPanel / 2;
  const uint8_t* row[kPanel];
  for (int64_t j = 0; j < rows; ++j) row[j] = reinterpret_cast<const uint8_t*>(src.row_ptr(r0 + j));
  auto nib = [&](int64_t j, int64_t c) -> unsigned { return j < rows ? (row[j][c / 2] >> (4 * (c % 2))) & 15u : 8u; };
  const int64_t K = src.cols;
  for (int64_t c = 0; c < K; ++c) {
    uint8_t* col = reinterpret_cast<uint8_t*>(dst + size_t(c) * stride);
    for (int64_t j = 0; j < half; ++j) col[j] = uint8_t(nib(j, c) | nib(j + half, c) << 4);
  }
}
}  // namespace detail_pack

// The layout src packs into (data and scale null; groups of panel_group(type) panels): value_bytes() and
// scale_count() size its storage.
inline PackedMatrix packed_shape(const MatrixRef& src) noexcept {
  PackedMatrix m;
  m.type = src.type, m.rows = src.rows, m.cols = src.cols, m.block = has_scales(src.type) ? src.block : 0;
  m.group = panel_group(src.type);
  return m;
}

// Repacks a row-major matrix (any of its types) into panels, split over the pool's threads by panel. A copy:
// F32 keeps 4 bytes a weight, F16/BF16 2, I8 1, I4 half a byte (+ the scales); the source can be released
// afterwards. The panels go in slices of about 16 MiB of source; done(r0, r1) is called after each slice with the
// source rows it has finished with, so a caller can release them while the rest is packed (peak memory: the copy
// + a slice).
// pack_into writes into storage the caller owns: `values` (packed_shape(src).value_bytes() bytes) and `scales`
// (scale_count() floats; null for float types), each 64-byte aligned, their contents anything. Returns the view;
// pack() allocates the storage and returns it with the view.
template <class Done>
inline PackedMatrix pack_into(const MatrixRef& src, ThreadPool* pool, std::byte* values, float* scales, Done&& done) {
  PackedMatrix m = packed_shape(src);
  const bool scaled = has_scales(src.type);
  const size_t es = dtype_size(src.type);
  const int64_t np = m.panels(), K = src.cols, nb = m.blocks();
  m.data = values;
  m.scale = scaled ? scales : nullptr;
  // what the panels below leave unwritten: a last partial panel's padding scales (zero)
  if (scaled && np > 0 && np * kPanel > src.rows)
    std::fill(scales + size_t(np - 1) * size_t(nb) * size_t(kPanel), scales + m.scale_count(), 0.0f);
  auto panels = [&](size_t b, size_t e) {
    for (int64_t p = int64_t(b); p < int64_t(e); ++p) {
      std::byte* dst = values + (m.panel(p) - static_cast<const std::byte*>(m.data));
      const size_t stride = m.column_stride(p);
      const int64_t rows = std::min<int64_t>(kPanel, src.rows - p * kPanel);
      if (src.type == dtype::I4) detail_pack::columns_i4(src, p * kPanel, rows, dst, stride);
      else switch (es) {
        case 4: detail_pack::columns<uint32_t>(src, p * kPanel, rows, dst, stride); break;
        case 2: detail_pack::columns<uint16_t>(src, p * kPanel, rows, dst, stride); break;
        default: detail_pack::columns<uint8_t>(src, p * kPanel, rows, dst, stride); break;
      }
      if (scaled)
        for (int64_t j = 0; j < rows; ++j)
          for (int64_t bl = 0; bl < nb; ++bl)
            scales[(size_t(p) * size_t(nb) + size_t(bl)) * size_t(kPanel) + size_t(j)] =
                src.scale[size_t((p * kPanel + j) * nb + bl)];
    }
  };
  const size_t panel_src_bytes = std::max<size_t>(1, size_t(kPanel) * size_t(K) * es);
  const int64_t slice = std::max<int64_t>(1, int64_t((size_t(16) << 20) / panel_src_bytes));
  for (int64_t s0 = 0; s0 < np; s0 += slice) {
    const int64_t s1 = std::min(np, s0 + slice);
    if (pool) pool->parallel_for(size_t(s1 - s0), 4, [&](size_t b, size_t e) { panels(size_t(s0) + b, size_t(s0) + e); });
    else panels(size_t(s0), size_t(s1));
    done(s0 * kPanel, std::min(src.rows, s1 * kPanel));
  }
  return m;
}

template <class Done>
inline PackedWeights pack(const MatrixRef& src, ThreadPool* pool, Done&& done) {
  PackedWeights w;
  const PackedMatrix shape = packed_shape(src);
  w.values.resize(shape.value_bytes());
  w.scales.resize(shape.scale_count());
  w.m = pack_into(src, pool, w.values.data(), w.scales.empty() ? nullptr : w.scales.data(), done);
  return w;
}

inline PackedWeights pack(const MatrixRef& src, ThreadPool* pool = nullptr) {
  return pack(src, pool, [](int64_t, int64_t) {});
}

}  // namespace ops
OPT_NAMESPACE_END
