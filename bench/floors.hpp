// The machine's floors, measured with the widest vectors this CPU runs (the same ISA choice as the kernels):
//   read_sum     one pass over a buffer with 4 independent vector accumulators per thread (memory bandwidth), in
//                kReadVariants ways (no software prefetch; prefetch into L1 16 KiB ahead; into L2 1 KiB ahead; 8
//                streams prefetched into L2):
//                which one reads fastest differs by machine (on Zen 4 a prefetched pass on 2 threads read up to
//                40 GB/s where the plain one read 25-30), so the benchmarks take the best
//   fma_chains   16 independent FMA chains per thread (the FMA peak)
// Shared by the benchmarks; each prints floor_isa with its figures.
#pragma once
#include <opt/kernels/dispatch.hpp>
#include <opt/kernels/prelude.hpp>

#include <cstddef>
#if defined(OPT_HAVE_X86_KERNELS)
#include <immintrin.h>
#endif
#if defined(OPT_HAVE_NEON_KERNELS)
#include <arm_neon.h>
#endif

namespace opt_bench {

// The read variants: 0 no software prefetch, 1 prefetch into L1 16 KiB ahead, 2 into L2 1 KiB ahead. One call per
// `bytes` read: a prefetch per cache line of them.
// Variant 3 reads its range as 8 concurrent streams (8 equal parts, a vector of each in turn, each prefetched into
// L2 1 KiB ahead), as a decode tile reads 8 panels. Added because on the Zen 5 VM a stored opt-6.7b int8 decode
// streamed 54 GB/s where one prefetched stream per thread read 44; there, on 2 threads, all four variants then read
// within a few percent of each other (40-47 GB/s), so the gap was not the access pattern.
constexpr int kReadVariants = 4;
constexpr int kReadStreams = 8;
inline const char* read_variant_name(int v) {
  return v == 0 ? "plain" : v == 1 ? "pf_l1_16k" : v == 2 ? "pf_l2_1k" : "streams8_pf_l2_1k";
}
// [0, n) as kReadStreams parts of len floats (a multiple of 16) and a tail from kReadStreams * len.
inline size_t stream_len(size_t n) { return n / kReadStreams / 16 * 16; }
// (Through the kernels' prefetch_kept: with a plain __builtin_prefetch, GCC 12 deleted these loops and variants
// 1 and 2 read exactly as variant 0.)
inline void prefetch_ahead(const float* p, int variant, int bytes) {
  const char* c = reinterpret_cast<const char*>(p);
  if (variant == 1)
    for (int b = 0; b < bytes; b += 64) opt::kernels::prefetch_kept<3>(c + 16384 + b);
  else if (variant == 2)
    for (int b = 0; b < bytes; b += 64) opt::kernels::prefetch_kept<2>(c + 1024 + b);
}

#if defined(OPT_HAVE_X86_KERNELS)
__attribute__((target("avx512f"))) inline float read_streams_avx512(const float* p, size_t n) {
  const size_t len = stream_len(n);
  __m512 a[kReadStreams];
  for (int j = 0; j < kReadStreams; ++j) a[j] = _mm512_setzero_ps();
  for (size_t i = 0; i < len; i += 16)
    for (int j = 0; j < kReadStreams; ++j) {
      const float* q = p + j * len + i;
      __builtin_prefetch(reinterpret_cast<const char*>(q) + 1024, 0, 2);
      a[j] = _mm512_add_ps(a[j], _mm512_loadu_ps(q));
    }
  for (int j = 1; j < kReadStreams; ++j) a[0] = _mm512_add_ps(a[0], a[j]);
  alignas(64) float t[16];
  _mm512_store_ps(t, a[0]);
  float s = 0;
  for (float v : t) s += v;
  for (size_t i = kReadStreams * len; i < n; ++i) s += p[i];
  return s;
}
__attribute__((target("avx512f"))) inline float read_sum_avx512(const float* p, size_t n, int variant) {
  if (variant == 3) return read_streams_avx512(p, n);
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    prefetch_ahead(p + i, variant, 64 * 4);
    a0 = _mm512_add_ps(a0, _mm512_loadu_ps(p + i));
    a1 = _mm512_add_ps(a1, _mm512_loadu_ps(p + i + 16));
    a2 = _mm512_add_ps(a2, _mm512_loadu_ps(p + i + 32));
    a3 = _mm512_add_ps(a3, _mm512_loadu_ps(p + i + 48));
  }
  alignas(64) float t[16];
  _mm512_store_ps(t, _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  float s = 0;
  for (float v : t) s += v;
  for (; i < n; ++i) s += p[i];
  return s;
}
__attribute__((target("avx2"))) inline float read_streams_avx2(const float* p, size_t n) {
  const size_t len = stream_len(n);
  __m256 a[kReadStreams];
  for (int j = 0; j < kReadStreams; ++j) a[j] = _mm256_setzero_ps();
  for (size_t i = 0; i < len; i += 16)
    for (int j = 0; j < kReadStreams; ++j) {
      const float* q = p + j * len + i;
      __builtin_prefetch(reinterpret_cast<const char*>(q) + 1024, 0, 2);
      a[j] = _mm256_add_ps(a[j], _mm256_add_ps(_mm256_loadu_ps(q), _mm256_loadu_ps(q + 8)));
    }
  for (int j = 1; j < kReadStreams; ++j) a[0] = _mm256_add_ps(a[0], a[j]);
  alignas(32) float t[8];
  _mm256_store_ps(t, a[0]);
  float s = 0;
  for (float v : t) s += v;
  for (size_t i = kReadStreams * len; i < n; ++i) s += p[i];
  return s;
}
__attribute__((target("avx2"))) inline float read_sum_avx2(const float* p, size_t n, int variant) {
  if (variant == 3) return read_streams_avx2(p, n);
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    prefetch_ahead(p + i, variant, 32 * 4);
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
  }
  alignas(32) float t[8];
  _mm256_store_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  float s = 0;
  for (float v : t) s += v;
  for (; i < n; ++i) s += p[i];
  return s;
}
// FLOPs done: iters * 16 chains * lanes * 2
__attribute__((target("avx512f"))) inline double fma_chains_avx512(long iters) {
  __m512 a[16];
  for (int j = 0; j < 16; ++j) a[j] = _mm512_set1_ps(float(j));
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  for (long i = 0; i < iters; ++i)
    for (int j = 0; j < 16; ++j) a[j] = _mm512_fmadd_ps(a[j], m, c);
  __m512 s = a[0];
  for (int j = 1; j < 16; ++j) s = _mm512_add_ps(s, a[j]);
  alignas(64) float t[16];
  _mm512_store_ps(t, s);
  volatile float sink = t[0];
  (void)sink;
  return double(iters) * 16 * 16 * 2;
}
__attribute__((target("avx2,fma"))) inline double fma_chains_avx2(long iters) {
  __m256 a[12];  // 12 chains: FMA latency (4-5 cycles) x 2 pipes, within the 16 registers
  for (int j = 0; j < 12; ++j) a[j] = _mm256_set1_ps(float(j));
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (long i = 0; i < iters; ++i)
    for (int j = 0; j < 12; ++j) a[j] = _mm256_fmadd_ps(a[j], m, c);
  __m256 s = a[0];
  for (int j = 1; j < 12; ++j) s = _mm256_add_ps(s, a[j]);
  alignas(32) float t[8];
  _mm256_store_ps(t, s);
  volatile float sink = t[0];
  (void)sink;
  return double(iters) * 12 * 8 * 2;
}
#endif
#if defined(OPT_HAVE_NEON_KERNELS)
inline float read_streams_neon(const float* p, size_t n) {
  const size_t len = stream_len(n);
  float32x4_t a[kReadStreams];
  for (int j = 0; j < kReadStreams; ++j) a[j] = vdupq_n_f32(0);
  for (size_t i = 0; i < len; i += 16)
    for (int j = 0; j < kReadStreams; ++j) {
      const float* q = p + j * len + i;
      __builtin_prefetch(reinterpret_cast<const char*>(q) + 1024, 0, 2);
      a[j] = vaddq_f32(a[j], vaddq_f32(vaddq_f32(vld1q_f32(q), vld1q_f32(q + 4)),
                                       vaddq_f32(vld1q_f32(q + 8), vld1q_f32(q + 12))));
    }
  for (int j = 1; j < kReadStreams; ++j) a[0] = vaddq_f32(a[0], a[j]);
  float s = vaddvq_f32(a[0]);
  for (size_t i = kReadStreams * len; i < n; ++i) s += p[i];
  return s;
}
inline float read_sum_neon(const float* p, size_t n, int variant) {
  if (variant == 3) return read_streams_neon(p, n);
  float32x4_t a0 = vdupq_n_f32(0), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    prefetch_ahead(p + i, variant, 16 * 4);
    a0 = vaddq_f32(a0, vld1q_f32(p + i));
    a1 = vaddq_f32(a1, vld1q_f32(p + i + 4));
    a2 = vaddq_f32(a2, vld1q_f32(p + i + 8));
    a3 = vaddq_f32(a3, vld1q_f32(p + i + 12));
  }
  float s = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
  for (; i < n; ++i) s += p[i];
  return s;
}
inline double fma_chains_neon(long iters) {
  float32x4_t a[16];
  for (int j = 0; j < 16; ++j) a[j] = vdupq_n_f32(float(j));
  const float32x4_t m = vdupq_n_f32(0.999999f), c = vdupq_n_f32(1e-7f);
  for (long i = 0; i < iters; ++i)
    for (int j = 0; j < 16; ++j) a[j] = vfmaq_f32(c, a[j], m);
  float32x4_t s = a[0];
  for (int j = 1; j < 16; ++j) s = vaddq_f32(s, a[j]);
  volatile float sink = vgetq_lane_f32(s, 0);
  (void)sink;
  return double(iters) * 16 * 4 * 2;
}
#endif
inline float read_sum_scalar(const float* p, size_t n, int variant) {
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  size_t i = 0;
  if (variant == 3) {  // the streams, one element of each in turn
    const size_t len = stream_len(n);
    float a[kReadStreams] = {};
    for (; i < len; ++i)
      for (int j = 0; j < kReadStreams; ++j) a[j] += p[j * len + i];
    for (float v : a) s0 += v;
    i = kReadStreams * len;
  }
  for (; i + 4 <= n; i += 4) s0 += p[i], s1 += p[i + 1], s2 += p[i + 2], s3 += p[i + 3];
  float s = s0 + s1 + s2 + s3;
  for (; i < n; ++i) s += p[i];
  return s;
}
inline double fma_chains_scalar(long iters) {
  float a[16];
  for (int j = 0; j < 16; ++j) a[j] = float(j);
  for (long i = 0; i < iters; ++i)
    for (int j = 0; j < 16; ++j) a[j] = a[j] * 0.999999f + 1e-7f;
  volatile float sink = a[0];
  (void)sink;
  return double(iters) * 16 * 2;
}

// The ISA the floors use: the best this CPU runs (not OPT_ISA: a floor is the machine's, whatever runs on it).
inline opt::kernels::isa floor_isa() { return opt::kernels::best_isa(); }

inline float read_sum(const float* p, size_t n, int variant) {
  switch (floor_isa()) {
#if defined(OPT_HAVE_X86_KERNELS)
    case opt::kernels::isa::avx512: return read_sum_avx512(p, n, variant);
    case opt::kernels::isa::avx2: return read_sum_avx2(p, n, variant);
#endif
#if defined(OPT_HAVE_NEON_KERNELS)
    case opt::kernels::isa::neon: return read_sum_neon(p, n, variant);
#endif
    default: return read_sum_scalar(p, n, variant);
  }
}
inline double fma_chains(long iters) {
  switch (floor_isa()) {
#if defined(OPT_HAVE_X86_KERNELS)
    case opt::kernels::isa::avx512: return fma_chains_avx512(iters);
    case opt::kernels::isa::avx2: return fma_chains_avx2(iters);
#endif
#if defined(OPT_HAVE_NEON_KERNELS)
    case opt::kernels::isa::neon: return fma_chains_neon(iters);
#endif
    default: return fma_chains_scalar(iters);
  }
}

}  // namespace opt_bench
