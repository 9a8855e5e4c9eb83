// Each kernel against its plain Eigen reference in opt::ref (kernels/reference.hpp), on odd sizes, on every ISA
// this CPU runs, with tolerances derived from the problem: a length-K f32 dot product is within
// c * K * eps * max|x| * max|w| of the exact sum. Also the invariances the kernels promise: a value does not
// depend on the thread count, on the batch it is in (tile shapes), on which fused segment it belongs to, nor on
// the instruction set (every ISA's bits equal the scalar kernels').
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <opt/detail/large_alloc.hpp>
#include <opt/ops.hpp>
#include <opt/ops_ref.hpp>
#include <opt/quantize.hpp>
#include <random>
#include <string>
#include <vector>

#include "stored_weights.hpp"

namespace {

std::vector<float> randu(size_t n, uint32_t seed, float a = 1.0f) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(-a, a);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
float maxabs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}
constexpr double kEps = 1.1920929e-7;

// Runs body() once per ISA this CPU runs (the dispatch switched to it), then restores the ISA in use.
template <class F>
void for_each_isa(F&& body) {
  const opt::kernels::isa was = opt::kernels::active_isa();
  for (opt::kernels::isa i : opt::kernels::available_isas()) {
    INFO("isa " << opt::kernels::to_string(i));
    opt::kernels::set_isa(i);
    body(i);
  }
  opt::kernels::set_isa(was);
}
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Weights of a given storage type plus the f32 values they hold.
using W = opt_test::StoredWeights;
W make(opt::dtype t, int64_t rows, int64_t cols, uint32_t seed) {
  return opt_test::store_weights(t, rows, cols, randu(size_t(rows * cols), seed));
}

}  // namespace

TEST_CASE("linear matches opt::ref::linear for every weight type, odd sizes, tiles and tails, on every ISA") {
  opt::ThreadPool pool2(2), pool3(3);
  for_each_isa([&](opt::kernels::isa) {
  for (opt::dtype t : {opt::dtype::F32, opt::dtype::F16, opt::dtype::BF16, opt::dtype::I8, opt::dtype::I4})
    for (int64_t K : {1, 15, 16, 17, 63, 64, 65, 130, 257, 1100, 2061})
      for (int64_t R : {1, 3, 4, 7, 18, 67})
        for (int64_t n : {1, 2, 4, 5, 8, 9, 13, 97, 200}) {
          INFO(opt::to_string(t) << " n=" << n << " R=" << R << " K=" << K);
          W w = make(t, R, K, uint32_t(K * 1000 + R));
          std::vector<float> x = randu(size_t(n * K), uint32_t(n + 7)), b = randu(size_t(R), 3);
          std::vector<float> got(size_t(n * R)), want(size_t(n * R)), one(static_cast<size_t>(R)), g3(static_cast<size_t>(n * R));
          opt::ops::linear(pool2, x.data(), n, w.ref, b.data(), got.data());
          opt::ref::linear(x.data(), n, opt::dtype::F32, w.f32.data(), R, K, b.data(), want.data());
          const double tol = 2.0 * double(K + 16) * kEps * maxabs(x) * maxabs(w.f32) + 2 * kEps * maxabs(b);
          double worst = 0;
          for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
          CHECK(worst <= tol);
          // batch invariance: each row alone gives the same bits as in the batch (tile path vs GEMV path)
          bool same = true;
          for (int64_t i = 0; i < n; ++i) {
            opt::ops::linear(pool2, x.data() + i * K, 1, w.ref, b.data(), one.data());
            same = same && std::equal(one.begin(), one.end(), got.begin() + i * R);
          }
          CHECK(same);
          // thread-count invariance
          opt::ops::linear(pool3, x.data(), n, w.ref, b.data(), g3.data());
          CHECK(g3 == got);
        }
  });
}

TEST_CASE("every panel grouping gives the same bits; pack() interleaves groups of panel_group(type) panels") {
  // PackedMatrix::group only moves bytes: decode tiles read a whole group as one stream, prefill and tail tiles
  // read part of one, a version-1 stored folder has group 1. Sizes: groups whole and partial, a tail panel.
  opt::ThreadPool pool(2);
  for_each_isa([&](opt::kernels::isa) {
    for (opt::dtype t : {opt::dtype::F32, opt::dtype::F16, opt::dtype::BF16, opt::dtype::I8, opt::dtype::I4})
      for (int64_t K : {17, 256, 1100})
        for (int64_t R : {18, 100, 130, 260}) {
          W w = make(t, R, K, uint32_t(K * 31 + R));
          CHECK(w.ref.group == opt::ops::panel_group(t));
          for (int64_t g : {1, 2, 3, 4, 5}) {
            opt::ops::aligned_vector<std::byte> bytes;
            const opt::PackedMatrix r = opt_test::regroup(w.ref, g, bytes);
            bool elems = true;
            for (int64_t i = 0; i < R; i += 7)
              for (int64_t c = 0; c < K; c += 5)
                elems = elems && opt::ops::packed_element(r, i, c) == opt::ops::packed_element(w.ref, i, c);
            CHECK(elems);
            for (int64_t n : {1, 2, 4, 9, 16, 24}) {
              INFO(opt::to_string(t) << " K=" << K << " R=" << R << " group=" << g << " n=" << n);
              std::vector<float> x = randu(size_t(n * K), uint32_t(n + K)), b = randu(size_t(R), 5);
              std::vector<float> want(size_t(n * R)), got(size_t(n * R));
              opt::ops::linear(pool, x.data(), n, w.ref, b.data(), want.data());
              opt::ops::linear(pool, x.data(), n, r, b.data(), got.data());
              CHECK(same_bits(want, got));
              if (t == opt::dtype::I8 && n == 1) {  // approximate int8: whole groups as one stream, other panels alone
                opt::ops::linear(pool, x.data(), n, w.ref, b.data(), want.data(), {}, true);
                opt::ops::linear(pool, x.data(), n, r, b.data(), got.data(), {}, true);
                CHECK(same_bits(want, got));
              }
            }
          }
        }
  });
}

TEST_CASE("approximate int8 (LinearSeg::approximate): within the inputs' quantization error, exact where unused") {
  // Where the ISA has int8 dot products (AVX-512 VNNI + VBMI) one token's I8 linear runs on x quantized per block
  // to round(x / s), s = max|x| / 127: each output moves by at most sum_k |w_rk| s_b(k) / 2 from the exact one.
  // Elsewhere (another ISA, more tokens, columns not a multiple of 4, other weight types) it is the exact kernel.
  opt::ThreadPool pool(2);
  for_each_isa([&](opt::kernels::isa i) {
    for (int64_t K : {64, 300, 1100, 2061})
      for (int64_t R : {1, 18, 100})
        for (int64_t n : {1, 2}) {
          INFO("n=" << n << " R=" << R << " K=" << K);
          W w = make(opt::dtype::I8, R, K, uint32_t(K * 7 + R));
          std::vector<float> x = randu(size_t(n * K), uint32_t(K + n), 3.0f), b = randu(size_t(R), 9);
          std::vector<float> exact(size_t(n * R)), approx(size_t(n * R));
          opt::ops::Epilogue ep;
          ep.has_act = true, ep.act = opt::activation::gelu;
          opt::ops::linear(pool, x.data(), n, w.ref, b.data(), exact.data(), ep);
          opt::ops::linear(pool, x.data(), n, w.ref, b.data(), approx.data(), ep, true);
          const bool used =
              i == opt::kernels::isa::avx512 && n == 1 && K % 4 == 0 && opt::kernels::cpu_has_int8_dot();
          if (!used) {
            CHECK(same_bits(exact, approx));
            continue;
          }
          // the bound, on the sums before the epilogue
          std::vector<float> pre_e(static_cast<size_t>(R)), pre_a(static_cast<size_t>(R));
          opt::ops::linear(pool, x.data(), 1, w.ref, b.data(), pre_e.data());
          opt::ops::linear(pool, x.data(), 1, w.ref, b.data(), pre_a.data(), {}, true);
          const int64_t B = w.ref.block;
          for (int64_t r = 0; r < R; ++r) {
            double bound = 0;
            for (int64_t k0 = 0; k0 < K; k0 += B) {
              double mx = 0, sw = 0;
              for (int64_t k = k0; k < std::min(K, k0 + B); ++k)
                mx = std::max(mx, std::fabs(double(x[size_t(k)]))), sw += std::fabs(double(w.f32[size_t(r * K + k)]));
              bound += sw * mx / 127.0 / 2.0;
            }
            const double d = std::fabs(double(pre_e[size_t(r)]) - double(pre_a[size_t(r)]));
            CHECK(d <= bound * 1.01 + 1e-4 * (1.0 + std::fabs(double(pre_e[size_t(r)]))));
          }
          CHECK(!same_bits(exact, approx));  // it ran (random inputs do not quantize exactly)
        }
  });
}

TEST_CASE("fused segments and epilogues equal the separate ops") {
  opt::ThreadPool pool(2);
  const int64_t n = 9, K = 70, R1 = 20, R2 = 12;
  W a = make(opt::dtype::F32, R1, K, 1), c = make(opt::dtype::BF16, R2, K, 2);
  std::vector<float> x = randu(size_t(n * K), 5), b1 = randu(size_t(R1), 6), b2 = randu(size_t(R2), 7);
  std::vector<float> y1(size_t(n * R1)), y2 = randu(size_t(n * R2), 8), r1(size_t(n * R1)), r2(size_t(n * R2));
  std::vector<float> y2_old = y2;
  opt::ops::Epilogue e1;
  e1.has_scale = true, e1.scale = 0.125f, e1.has_act = true, e1.act = opt::activation::gelu;
  opt::ops::Epilogue e2;
  e2.residual = true;
  const opt::ops::LinearSeg segs[2] = {{a.ref, b1.data(), y1.data(), R1, e1}, {c.ref, b2.data(), y2.data(), R2, e2}};
  opt::ops::linear_multi(pool, x.data(), n, segs, 2);
  opt::ops::linear(pool, x.data(), n, a.ref, b1.data(), r1.data());
  for (auto& v : r1) v = opt::ops::activate(opt::activation::gelu, v * 0.125f);
  opt::ops::linear(pool, x.data(), n, c.ref, b2.data(), r2.data());
  for (size_t i = 0; i < r2.size(); ++i) r2[i] = y2_old[i] + r2[i];
  CHECK(y1 == r1);
  CHECK(y2 == r2);
}

TEST_CASE("layer_norm and activations match opt::ref") {
  for (int64_t d : {1, 7, 64, 100, 768}) {
    const int64_t n = 5;
    std::vector<float> x = randu(size_t(n * d), uint32_t(d), 3.0f), g = randu(size_t(d), 2), b = randu(size_t(d), 3);
    std::vector<float> y(x.size()), want(x.size());
    opt::ops::layer_norm(x.data(), n, d, g.data(), b.data(), 1e-5f, y.data());
    opt::ref::layer_norm(x.data(), n, d, g.data(), b.data(), 1e-5f, want.data());
    // |(x - m) * rstd| <= sqrt(d): a few ulps of values up to sqrt(d) * max|g| + max|b|
    const double tol = 8 * kEps * (std::sqrt(double(d)) * maxabs(g) + maxabs(b));
    for (size_t i = 0; i < y.size(); ++i) CHECK(std::fabs(y[i] - want[i]) <= tol);
  }
  for (auto a : {opt::activation::relu, opt::activation::gelu, opt::activation::gelu_new, opt::activation::silu,
                 opt::activation::quick_gelu, opt::activation::tanh, opt::activation::sigmoid})
    for (float v : {-5.0f, -1.0f, -0.1f, 0.0f, 0.3f, 2.0f, 7.0f})
      CHECK(std::fabs(opt::ops::activate(a, v) - opt::ref::activate(a, v)) <= 4 * kEps * (1 + std::fabs(v)));
}

TEST_CASE("argmax matches opt::ref::argmax on every ISA: ties, signed zeros, infinities, NaNs, every tail") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::vector<float>> cases;
  for (int64_t n : {0, 1, 2, 15, 16, 17, 255, 256, 257, 600, 50272}) cases.push_back(randu(size_t(n), uint32_t(n + 1)));
  // the maximum in several chunks (the first wins), at the ends, -0 before +0 and +0 before -0, all equal
  std::vector<float> t = randu(1000, 7);
  t[10] = t[300] = t[999] = 5.0f;
  cases.push_back(t);
  t = randu(1000, 8);
  t[999] = 9.0f;
  cases.push_back(t);
  cases.push_back(std::vector<float>(700, -0.0f));
  t = std::vector<float>(700, -1.0f);
  t[5] = -0.0f, t[600] = 0.0f;
  cases.push_back(t);
  t[5] = 0.0f, t[600] = -0.0f;
  cases.push_back(t);
  cases.push_back(std::vector<float>(513, 2.5f));
  // infinities and NaNs, in the vector part and in a chunk's tail
  for (size_t at : {size_t(0), size_t(3), size_t(256), size_t(700), size_t(1023)})
    for (float special : {inf, -inf, nan}) {
      t = randu(1030, uint32_t(at + 9));
      t[at] = special;
      cases.push_back(t);
      t[at + 5] = nan;  // a NaN after: the first NaN wins
      cases.push_back(t);
    }
  cases.push_back(std::vector<float>(300, -inf));
  cases.push_back(std::vector<float>(300, nan));
  for_each_isa([&](opt::kernels::isa) {
    for (const auto& c : cases) {
      INFO("n = " << c.size());
      CHECK(opt::ops::argmax(c.data(), int64_t(c.size())) == opt::ref::argmax(c.data(), int64_t(c.size())));
    }
  });
  CHECK(opt::ref::argmax(cases.back().data(), 300) == 0);
}

TEST_CASE("attention matches opt::ref::attention; prompt pass equals step by step") {
  opt::ThreadPool pool(2);
  for (int64_t hd : {16, 24, 64}) {
    const int64_t nh = 3, H = nh * hd, past = 37, n = 6;
    std::vector<float> q = randu(size_t(n * H), 1, 0.5f), k = randu(size_t((past + n) * H), 2, 2.0f),
                       v = randu(size_t((past + n) * H), 3), out(size_t(n * H)), want(size_t(n * H));
    std::vector<float> scores(size_t(2 * opt::ops::kAttentionScratch * (past + n)));
    opt::ops::attention(pool, q.data(), past, n, k.data(), v.data(), H, hd, nh, hd, out.data(), scores.data());
    opt::ref::attention(q.data(), past, n, k.data(), v.data(), H, hd, nh, hd, want.data());
    // outputs are convex combinations of |v| <= 1; exp is within a few ulps, scores within K * eps * |q||k|
    const double tol = 1e-6 * (1 + double(hd) * 0.5 * 2.0);
    for (size_t i = 0; i < out.size(); ++i) CHECK(std::fabs(out[i] - want[i]) <= tol);
    // token i computed in the prompt pass == token i computed alone with past + i cached positions
    std::vector<float> alone(static_cast<size_t>(H));
    bool same = true;
    for (int64_t i = 0; i < n; ++i) {
      opt::ops::attention(pool, q.data() + i * H, past + i, 1, k.data(), v.data(), H, hd, nh, hd, alone.data(),
                          scores.data());
      same = same && std::equal(alone.begin(), alone.end(), out.begin() + i * H);
    }
    CHECK(same);
    // the same cache laid out one block per head (KvCache's layout, with room for 5 more positions) gives the
    // same bits: prompt pass and decode step
    const int64_t cap = past + n + 5, T = past + n;
    std::vector<float> kh(size_t(nh * cap * hd), 7.0f), vh(size_t(nh * cap * hd), 7.0f);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < nh; ++h)
        for (int64_t d = 0; d < hd; ++d) {
          kh[size_t((h * cap + t) * hd + d)] = k[size_t(t * H + h * hd + d)];
          vh[size_t((h * cap + t) * hd + d)] = v[size_t(t * H + h * hd + d)];
        }
    std::vector<float> blocked(out.size()), blocked_ref(out.size());
    opt::ops::attention(pool, q.data(), past, n, kh.data(), vh.data(), hd, cap * hd, nh, hd, blocked.data(),
                        scores.data());
    CHECK(blocked == out);
    opt::ref::attention(q.data(), past, n, kh.data(), vh.data(), hd, cap * hd, nh, hd, blocked_ref.data());
    CHECK(blocked_ref == want);
    opt::ops::attention(pool, q.data() + (n - 1) * H, past + n - 1, 1, kh.data(), vh.data(), hd, cap * hd, nh, hd,
                        alone.data(), scores.data());
    CHECK(std::equal(alone.begin(), alone.end(), out.begin() + (n - 1) * H));
  }
}

namespace {
// v rounded to a cache element type (as KvCache::store rounds), the stored elements and their f32 values.
struct HalfCache {
  std::vector<uint16_t> e;  // F16 / BF16 elements
  std::vector<float> f;     // the values they hold, widened
};
HalfCache to_half(opt::dtype t, const std::vector<float>& v) {
  HalfCache h;
  for (float x : v) {
    const uint16_t b = t == opt::dtype::F16 ? opt::detail::f32_to_f16(x) : opt::detail::f32_to_bf16(x);
    h.e.push_back(b);
    h.f.push_back(t == opt::dtype::F16 ? opt::detail::f16_to_f32(b) : opt::detail::bf16_to_f32(b));
  }
  return h;
}
}  // namespace

TEST_CASE("attention over F16 and BF16 caches: the F32 kernel's bits on the widened values, and the reference") {
  opt::ThreadPool pool(2);
  for_each_isa([&](opt::kernels::isa) {
    for (opt::dtype t : {opt::dtype::F16, opt::dtype::BF16})
      for (int64_t hd : {8, 16, 24, 64}) {
        INFO(opt::to_string(t) << " head_dim " << hd);
        const int64_t nh = 3, H = nh * hd, past = 37, n = 19, T = past + n, cap = T + 5;
        // one block of positions per head (KvCache's layout, room for 5 more), then the rows-of-heads layout
        std::vector<float> q = randu(size_t(n * H), 1, 0.5f);
        const HalfCache k = to_half(t, randu(size_t(nh * cap * hd), 2, 2.0f));
        const HalfCache v = to_half(t, randu(size_t(nh * cap * hd), 3));
        std::vector<float> scores(size_t(2 * opt::ops::kAttentionScratch * T)), got(size_t(n * H)),
            want(size_t(n * H)), ref(size_t(n * H)), alone(static_cast<size_t>(H));
        opt::ops::attention(pool, q.data(), past, n, t, k.e.data(), v.e.data(), hd, cap * hd, nh, hd, got.data(),
                            scores.data());
        opt::ops::attention(pool, q.data(), past, n, k.f.data(), v.f.data(), hd, cap * hd, nh, hd, want.data(),
                            scores.data());
        CHECK(same_bits(got, want));
        opt::ref::attention(q.data(), past, n, t, k.e.data(), v.e.data(), hd, cap * hd, nh, hd, ref.data());
        const double tol = 1e-6 * (1 + double(hd) * 0.5 * 2.0);
        double worst = 0;
        for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, double(std::fabs(got[i] - ref[i])));
        CHECK(worst <= tol);
        // a decode step (one token alone, on the calling thread) gives the prompt pass's bits
        bool same = true;
        for (int64_t i : {int64_t(0), n / 2, n - 1}) {
          opt::ops::attention_rows(q.data() + i * H, past + i, t, k.e.data(), v.e.data(), hd, cap * hd, nh, hd,
                                   alone.data(), H, scores.data(), 0, 1, 0, nh);
          same = same && std::memcmp(alone.data(), got.data() + i * H, size_t(H) * 4) == 0;
        }
        CHECK(same);
        // rows of all heads (ld = H, hs = head_dim)
        const HalfCache kr = to_half(t, randu(size_t(T * H), 4, 2.0f)), vr = to_half(t, randu(size_t(T * H), 5));
        opt::ops::attention(pool, q.data(), past, n, t, kr.e.data(), vr.e.data(), H, hd, nh, hd, got.data(),
                            scores.data());
        opt::ops::attention(pool, q.data(), past, n, kr.f.data(), vr.f.data(), H, hd, nh, hd, want.data(),
                            scores.data());
        CHECK(same_bits(got, want));
      }
  });
  // an element type attention cannot read
  std::vector<float> q(16), kv(64), out(16), scores(64);
  opt::ThreadPool p1(1);
  CHECK_THROWS_AS(opt::ops::attention(p1, q.data(), 0, 1, opt::dtype::I8, kv.data(), kv.data(), 16, 16, 1, 16,
                                      out.data(), scores.data()),
                  opt::input_error);
}

TEST_CASE("every kernel gives the scalar kernels' bits on every ISA") {
  const opt::kernels::isa was = opt::kernels::active_isa();
  MESSAGE("ISAs on this machine: " << opt::kernels::available_isas_string());
  opt::ThreadPool pool(2);
  // Everything below computed under one ISA, concatenated.
  auto compute = [&]() {
    std::vector<float> all;
    auto put = [&](const std::vector<float>& v) { all.insert(all.end(), v.begin(), v.end()); };
    // linear: every weight type, tile heights 1..13 tokens, row tails, every epilogue and activation (300 rows:
    // one-token integer tiles over 8 panels where the ISA takes them, with 4-panel and 1-panel tails)
    const opt::activation acts[] = {opt::activation::relu, opt::activation::gelu, opt::activation::gelu_new,
                                    opt::activation::silu, opt::activation::quick_gelu, opt::activation::tanh,
                                    opt::activation::sigmoid};
    for (opt::dtype t : {opt::dtype::F32, opt::dtype::F16, opt::dtype::BF16, opt::dtype::I8, opt::dtype::I4})
      for (int64_t K : {7, 64, 300})
        for (int64_t R : {5, 16, 37, 300})
          for (int64_t n : {1, 2, 3, 4, 5, 6, 7, 8, 9, 13}) {
            W w = make(t, R, K, uint32_t(K + R));
            std::vector<float> x = randu(size_t(n * K), uint32_t(n), 2.0f), b = randu(size_t(R), 4);
            std::vector<float> y = randu(size_t(n * R), 5);
            opt::ops::Epilogue ep;
            ep.has_act = true, ep.act = acts[size_t(n + K + R) % 7];
            ep.has_scale = (n % 2) == 0, ep.scale = 0.3f;
            ep.residual = (n % 3) == 0;
            opt::ops::linear(pool, x.data(), n, w.ref, (R % 2) ? b.data() : nullptr, y.data(), ep);
            put(y);
          }
    // activations over arrays (vector body and scalar tail), across the ranges where the approximations switch
    std::vector<float> a = randu(1000, 9, 12.0f);
    a.push_back(-100.0f), a.push_back(100.0f), a.push_back(0.0f), a.push_back(-0.0f), a.push_back(1e-6f);
    for (opt::activation act : acts) {
      std::vector<float> v = a;
      opt::ops::activate(act, v.data(), int64_t(v.size()));
      put(v);
      for (float z : {-3.0f, 0.01f, 5.0f}) all.push_back(opt::ops::activate(act, z));
    }
    // layer norm, with and without the affine part
    for (int64_t d : {1, 7, 64, 100}) {
      std::vector<float> x = randu(size_t(3 * d), uint32_t(d), 3.0f), g = randu(size_t(d), 2), bb = randu(size_t(d), 3);
      std::vector<float> y(x.size());
      opt::ops::layer_norm(x.data(), 3, d, g.data(), bb.data(), 1e-5f, y.data());
      put(y);
      opt::ops::layer_norm(x.data(), 3, d, nullptr, nullptr, 1e-5f, y.data());
      put(y);
    }
    // softmax's exp and sum
    for (int64_t n : {1, 15, 16, 17, 100}) {
      std::vector<float> sc = randu(size_t(n), uint32_t(n), 30.0f);
      all.push_back(opt::ops::exp_sub_sum(sc.data(), n, 30.0f));
      put(sc);
    }
    // attention: head sizes with and without a partial 16-lane chunk, prompt pass and decode
    for (int64_t hd : {8, 16, 24, 64}) {
      const int64_t nh = 3, H = nh * hd, past = 21, n = 5;
      std::vector<float> q = randu(size_t(n * H), 1, 0.5f), k = randu(size_t((past + n) * H), 2, 2.0f),
                         v = randu(size_t((past + n) * H), 3), out(size_t(n * H));
      std::vector<float> scores(size_t(2 * opt::ops::kAttentionScratch * (past + n)));
      opt::ops::attention(pool, q.data(), past, n, k.data(), v.data(), H, hd, nh, hd, out.data(), scores.data());
      put(out);
      // over F16 and BF16 caches: prompt pass and one decode step
      for (opt::dtype t : {opt::dtype::F16, opt::dtype::BF16}) {
        const HalfCache kh = to_half(t, k), vh = to_half(t, v);
        opt::ops::attention(pool, q.data(), past, n, t, kh.e.data(), vh.e.data(), H, hd, nh, hd, out.data(),
                            scores.data());
        put(out);
        opt::ops::attention(pool, q.data(), past + n - 1, 1, t, kh.e.data(), vh.e.data(), H, hd, nh, hd, out.data(),
                            scores.data());
        out.resize(size_t(H));
        put(out);
        out.resize(size_t(n * H));
      }
    }
    // the int8 quantizer
    {
      std::vector<float> w = randu(size_t(7 * 300), 11, 0.1f);
      std::vector<int8_t> q(w.size());
      std::vector<float> sc(size_t(7 * 3));
      opt::ops::quantize_rows(w.data(), 300, 128, 0, 7, q.data(), sc.data());
      put(sc);
      for (int8_t c : q) all.push_back(float(c));
    }
    // the int4 quantizer: an odd column count (a half-used last byte), a partial last block, an all-zero block,
    // ties of magnitude (the extreme's opposite, clamped to 7) and exact halves of a step (round to even)
    {
      const int64_t R = 7, K = 301, bl = opt::ops::kQ4Block, nb = (K + bl - 1) / bl;
      std::vector<float> w = randu(size_t(R * K), 12, 0.1f);
      for (int64_t k = 0; k < bl; ++k) w[size_t(K + k)] = 0.0f;
      w[size_t(2 * K)] = 0.4f, w[size_t(2 * K + 1)] = -0.4f;
      w[size_t(2 * K + 2)] = 0.025f, w[size_t(2 * K + 3)] = -0.075f;
      std::vector<uint8_t> q(size_t(R * ((K + 1) / 2)));
      std::vector<float> sc(size_t(R * nb));
      opt::ops::quantize_rows_i4(w.data(), K, bl, 0, R, q.data(), sc.data());
      put(sc);
      for (uint8_t c : q) all.push_back(float(c));
      // an odd block size: blocks that share a byte
      std::vector<float> sc7(size_t(R * ((K + 6) / 7)));
      opt::ops::quantize_rows_i4(w.data(), K, 7, 0, R, q.data(), sc7.data());
      put(sc7);
      for (uint8_t c : q) all.push_back(float(c));
    }
    return all;
  };
  opt::kernels::set_isa(opt::kernels::isa::scalar);
  const std::vector<float> want = compute();
  size_t compared = 0;
  for (opt::kernels::isa i : opt::kernels::available_isas()) {
    if (i == opt::kernels::isa::scalar) continue;
    INFO("isa " << opt::kernels::to_string(i));
    opt::kernels::set_isa(i);
    const std::vector<float> got = compute();
    CHECK(same_bits(got, want));
    if (!same_bits(got, want))
      for (size_t j = 0; j < std::min(got.size(), want.size()); ++j)
        if (std::memcmp(&got[j], &want[j], 4) != 0) {
          FAIL_CHECK("first difference at " << j << ": " << got[j] << " vs scalar " << want[j]);
          break;
        }
    ++compared;
  }
  MESSAGE(compared << " ISA(s) compared with scalar over " << want.size() << " values");
  opt::kernels::set_isa(was);
}

TEST_CASE("large buffers: 2 MiB-aligned huge-page mappings, zeroed, usable to the last byte; small ones as before") {
  using opt::detail::kHugePage;
  using opt::detail::kLargeAllocation;
  for (size_t bytes : {kLargeAllocation, kLargeAllocation + 1, 3 * kHugePage + 12345, size_t(64) << 20}) {
    INFO("bytes " << bytes);
    void* p = opt::detail::large_alloc(bytes, 64);
    REQUIRE(p != nullptr);
#if defined(__linux__)
    CHECK(reinterpret_cast<uintptr_t>(p) % kHugePage == 0);
#endif
    const unsigned char* c = static_cast<const unsigned char*>(p);
    CHECK(c[0] == 0);
    CHECK(c[bytes - 1] == 0);
    std::memset(p, 0xA5, bytes);  // every byte writable (ASan / a fault would say otherwise)
    CHECK(c[bytes / 2] == 0xA5);
    opt::detail::large_free(p, bytes, 64);
  }
#if defined(__linux__)
  {
    // a buffer that ends inside its last 2 MiB: that part is not asked for a huge page (which would back the
    // whole tail past the end too); the whole 2 MiB before it are (VmFlags "hg" where the kernel has THP)
    const size_t bytes = 3 * kHugePage + 12345;
    void* p = opt::detail::large_alloc(bytes, 64);
    std::memset(p, 1, bytes);
    const auto flags_at = [](uintptr_t a) {
      std::ifstream f("/proc/self/smaps");
      std::string line;
      bool in = false;
      while (std::getline(f, line)) {
        unsigned long lo = 0, hi = 0;
        if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) in = lo <= a && a < hi;
        else if (in && line.rfind("VmFlags:", 0) == 0) return line;
      }
      return std::string("(no mapping)");
    };
    const uintptr_t b = reinterpret_cast<uintptr_t>(p);
    const std::string head = flags_at(b), tail = flags_at(b + 3 * kHugePage);
    INFO("head " << head << " | tail " << tail);
    CHECK(tail.rfind("VmFlags:", 0) == 0);
    CHECK(tail.find(" hg") == std::string::npos);
    if (std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled")) CHECK(head.find(" hg") != std::string::npos);
    opt::detail::large_free(p, bytes, 64);
  }
#endif
  void* small = opt::detail::large_alloc(1000, 64);
  CHECK(reinterpret_cast<uintptr_t>(small) % 64 == 0);
  opt::detail::large_free(small, 1000, 64);
  opt::detail::large_free(nullptr, kLargeAllocation, 64);  // no-op

  // the weights' and caches' containers: a large vector is a huge-page mapping, grows and shrinks like any other
  opt::ops::aligned_vector<float> v(kLargeAllocation / sizeof(float) + 7, 1.5f);
#if defined(__linux__)
  CHECK(reinterpret_cast<uintptr_t>(v.data()) % kHugePage == 0);
#endif
  v.resize(v.size() * 2, 2.5f);
  CHECK(v.front() == 1.5f);
  CHECK(v.back() == 2.5f);
  v.resize(10);
  v.shrink_to_fit();
  CHECK(reinterpret_cast<uintptr_t>(v.data()) % 64 == 0);
  CHECK(v[9] == 1.5f);
}
