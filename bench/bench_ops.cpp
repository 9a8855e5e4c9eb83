// Kernel benchmarks: GEMV per weight dtype (decode), the GEMM shapes of an opt-125m prefill, attention and
// LayerNorm; and the per-token logprobs of a 50272-token vocabulary (opt/logprobs.hpp).
// Every kernel is checked against its plain reference (opt::ref) before it is timed; a mismatch
// skips the benchmark with an error. Counters: GB/s (bytes of weights read) for GEMV, GFLOP/s for GEMM.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <opt/logprobs.hpp>
#include <opt/ops.hpp>
#include <opt/ops_ref.hpp>
#include <opt/quantize.hpp>
#include <opt/sampler.hpp>
#include <random>
#include <string>
#include <vector>

#include "../tests/stored_weights.hpp"

namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

using Weights = opt_test::StoredWeights;
Weights make_weights(opt::dtype t, int64_t rows, int64_t cols, uint32_t seed) {
  return opt_test::store_weights(t, rows, cols, randn(size_t(rows * cols), seed, 0.02f));
}

// max |got - want| <= 4 * K * eps * max|x| * max|w| (+ the bias scale): the bound of a length-K f32 dot product.
bool check_linear(const std::vector<float>& x, int64_t n, const Weights& w, std::string& msg) {
  const int64_t R = w.ref.rows, K = w.ref.cols;
  std::vector<float> got(size_t(n * R)), want(size_t(n * R));
  opt::ThreadPool pool(2);
  opt::ops::linear(pool, x.data(), n, w.ref, nullptr, got.data());
  opt::ref::linear(x.data(), n, opt::dtype::F32, w.f32.data(), R, K, nullptr, want.data());
  float mx = 0, mw = 0;
  for (float v : x) mx = std::max(mx, std::fabs(v));
  for (float v : w.f32) mw = std::max(mw, std::fabs(v));
  const double tol = 4.0 * double(K) * 1.19e-7 * mx * mw;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(double(got[i]) - double(want[i])));
  msg = "maxdiff " + std::to_string(worst) + " > tol " + std::to_string(tol);
  return worst <= tol;
}

opt::dtype dtype_of(int64_t code) {
  switch (code) {
    case 0: return opt::dtype::F32;
    case 1: return opt::dtype::F16;
    case 2: return opt::dtype::BF16;
    case 3: return opt::dtype::I8;
    default: return opt::dtype::I4;
  }
}

// Args: {n tokens, out, in, dtype code (0 f32, 1 f16, 2 bf16, 3 int8, 4 int4), threads}
void BM_Linear(benchmark::State& state) {
  const int64_t n = state.range(0), R = state.range(1), K = state.range(2);
  const opt::dtype t = dtype_of(state.range(3));
  const size_t threads = size_t(state.range(4));
  Weights w = make_weights(t, R, K, 1);
  std::vector<float> x = randn(size_t(n * K), 2), y(size_t(n * R));
  std::string msg;
  if (!check_linear(x, std::min<int64_t>(n, 9), w, msg)) {  // up to 9 tokens: 4x4 tiles and the tails
    state.SkipWithError(("linear differs from opt::ref::linear: " + msg).c_str());
    return;
  }
  opt::ThreadPool pool(threads);
  for (auto _ : state) {
    opt::ops::linear(pool, x.data(), n, w.ref, nullptr, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  const double it = double(state.iterations());
  state.counters["GBps"] = benchmark::Counter(double(w.ref.bytes()) * it / 1e9, benchmark::Counter::kIsRate);
  state.counters["GFLOPs"] = benchmark::Counter(2.0 * double(n * R * K) * it / 1e9, benchmark::Counter::kIsRate);
  state.SetLabel(std::string(opt::to_string(t)) + " kernels=" + opt::kernels::to_string(opt::kernels::active_isa()));
}
// GEMV (decode) per dtype: fc1 [3072, 768], fc2 [768, 3072], LM head [50272, 768]; int4 beside int8 for the LM
// head, a layer and a batch of 4 tokens; [256, 768] stays in L2 (at most 768 KiB), so it runs at the kernel's
// compute rate, not the memory's
BENCHMARK(BM_Linear)
    ->ArgsProduct({{1}, {3072}, {768}, {0, 1, 2, 3, 4}, {1, 2}})
    ->ArgsProduct({{1}, {256}, {768}, {0, 1, 2, 3, 4}, {1}})
    ->Args({1, 768, 3072, 0, 2})
    ->Args({1, 50272, 768, 0, 2})
    ->Args({1, 50272, 768, 2, 2})
    ->Args({1, 50272, 768, 3, 2})
    ->Args({1, 50272, 768, 3, 1})
    ->Args({1, 50272, 768, 4, 2})
    ->Args({1, 50272, 768, 4, 1})
    ->Args({1, 768, 3072, 4, 2})
    ->Args({4, 3072, 768, 0, 2})
    ->Args({4, 3072, 768, 3, 2})
    ->Args({4, 3072, 768, 3, 1})
    ->Args({4, 3072, 768, 4, 2})
    ->Args({4, 3072, 768, 4, 1})
    ->Args({4, 50272, 768, 4, 2})
    ->Args({4, 50272, 768, 3, 2})
    ->ArgsProduct({{2, 3, 4, 5, 6}, {3072}, {768}, {0}, {1}})
    ->Unit(benchmark::kMicrosecond);
// GEMM (prefill of 512 tokens): q/k/v/out [768, 768], fc1 [3072, 768], fc2 [768, 3072]
BENCHMARK(BM_Linear)
    ->Args({512, 768, 768, 0, 2})
    ->Args({512, 3072, 768, 0, 2})
    ->Args({512, 768, 3072, 0, 2})
    ->Args({512, 3072, 768, 0, 1})
    ->Args({512, 3072, 768, 2, 2})
    ->Args({512, 3072, 768, 3, 2})
    ->Args({512, 3072, 768, 4, 2})
    ->Args({512, 3072, 256, 0, 1})
    ->Args({48, 3072, 768, 0, 1})
    ->Unit(benchmark::kMillisecond);

// Args: {past, n, threads[, kv]}: 12 heads of 64, the cache laid out as KvCache does (one block of positions per
// head), its elements F32 (kv 0, BM_Attention), F16 (1) or BF16 (2). Counter: GB/s of cache read (keys and values
// of every position, once per pass).
void attention_bench(benchmark::State& state, opt::dtype t) {
  const int64_t past = state.range(0), n = state.range(1), nh = 12, hd = 64, H = nh * hd, hs = (past + n) * hd;
  const size_t threads = size_t(state.range(2));
  std::vector<float> q = randn(size_t(n * H), 3, 0.125f), k = randn(size_t((past + n) * H), 4),
                     v = randn(size_t((past + n) * H), 5), out(size_t(n * H)), want(size_t(n * H));
  std::vector<uint16_t> kh, vh;  // the F16 / BF16 cache
  const void* kp = k.data();
  const void* vp = v.data();
  if (t != opt::dtype::F32) {
    const auto round = [t](float x) {
      return t == opt::dtype::F16 ? opt::detail::f32_to_f16(x) : opt::detail::f32_to_bf16(x);
    };
    for (size_t i = 0; i < k.size(); ++i) kh.push_back(round(k[i])), vh.push_back(round(v[i]));
    kp = kh.data();
    vp = vh.data();
  }
  std::vector<float> scores(threads * size_t(opt::ops::kAttentionScratch * (past + n)));
  opt::ThreadPool pool(threads);
  opt::ops::attention(pool, q.data(), past, n, t, kp, vp, hd, hs, nh, hd, out.data(), scores.data());
  opt::ref::attention(q.data(), past, std::min<int64_t>(n, 4), t, kp, vp, hd, hs, nh, hd, want.data());
  double worst = 0, tol = 1e-5 * std::sqrt(double(past + n));  // softmax weights sum to 1; |v| ~ 1
  for (int64_t i = 0; i < std::min<int64_t>(n, 4) * H; ++i)
    worst = std::max(worst, std::fabs(double(out[size_t(i)]) - double(want[size_t(i)])));
  if (!(worst <= tol)) {
    state.SkipWithError(("attention differs from opt::ref::attention: maxdiff " + std::to_string(worst)).c_str());
    return;
  }
  for (auto _ : state) {
    opt::ops::attention(pool, q.data(), past, n, t, kp, vp, hd, hs, nh, hd, out.data(), scores.data());
    benchmark::DoNotOptimize(out.data());
  }
  const double bytes = 2.0 * double(past + n) * double(H) * double(opt::dtype_size(t));
  state.counters["GB/s"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(opt::to_string(t)) + " kernels=" + opt::kernels::to_string(opt::kernels::active_isa()));
}
void BM_Attention(benchmark::State& state) { attention_bench(state, opt::dtype::F32); }
BENCHMARK(BM_Attention)
    ->Args({56, 1, 1})
    ->Args({511, 1, 2})
    ->Args({0, 512, 2})
    ->Args({0, 512, 1})
    ->Unit(benchmark::kMicrosecond);

// The KV cache's element types side by side: decode at a long past and a 512-token prefill, 1 and 2 threads.
void BM_AttentionKv(benchmark::State& state) {
  const opt::dtype types[] = {opt::dtype::F32, opt::dtype::F16, opt::dtype::BF16};
  attention_bench(state, types[state.range(3)]);
}
BENCHMARK(BM_AttentionKv)
    ->ArgsProduct({{2047}, {1}, {1, 2}, {0, 1, 2}})
    ->ArgsProduct({{0}, {512}, {1, 2}, {0, 1, 2}})
    ->Unit(benchmark::kMicrosecond);

// Args: {n, d}
void BM_LayerNorm(benchmark::State& state) {
  const int64_t n = state.range(0), d = state.range(1);
  std::vector<float> x = randn(size_t(n * d), 6), g = randn(size_t(d), 7), b = randn(size_t(d), 8),
                     y(size_t(n * d)), want(size_t(n * d));
  opt::ops::layer_norm(x.data(), n, d, g.data(), b.data(), 1e-5f, y.data());
  opt::ref::layer_norm(x.data(), n, d, g.data(), b.data(), 1e-5f, want.data());
  double worst = 0;
  for (size_t i = 0; i < y.size(); ++i) worst = std::max(worst, std::fabs(double(y[i]) - double(want[i])));
  if (!(worst <= 1e-5 * 8)) {  // |y| <= ~ |g| * sqrt(d) * few: a few ulps of values of order 10
    state.SkipWithError(("layer_norm differs from opt::ref::layer_norm: maxdiff " + std::to_string(worst)).c_str());
    return;
  }
  for (auto _ : state) {
    opt::ops::layer_norm(x.data(), n, d, g.data(), b.data(), 1e-5f, y.data());
    benchmark::DoNotOptimize(y.data());
  }
}
BENCHMARK(BM_LayerNorm)->Args({1, 768})->Args({512, 768})->Unit(benchmark::kMicrosecond);

// The per-token cost of opt-serve's "logprobs": opt::logprobs over one row of opt-125m's vocabulary (50272), the
// chosen token's log-probability and the top N (Arg; 0: the token's only), next to the argmax that greedy pays
// anyway. Checked first against log_softmax written out in long double.
void BM_Logprobs(benchmark::State& state) {
  const int64_t V = 50272, top = state.range(0);
  const std::vector<float> x = randn(size_t(V), 9, 3.0f);
  const int32_t token = opt::argmax(x.data(), V);
  long double mx = x[size_t(token)], sum = 0;
  for (float v : x) sum += std::exp(static_cast<long double>(v) - mx);
  const double want = double(-std::log(sum));
  const opt::PositionLogprobs lp = opt::logprobs(x.data(), V, token, top);
  if (!(std::fabs(lp.logprob - want) <= 1e-7) || lp.top.size() != size_t(top) ||
      (top > 0 && lp.top[0].token != token)) {
    state.SkipWithError("opt::logprobs differs from the long-double log_softmax");
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(opt::logprobs(x.data(), V, token, top));
}
BENCHMARK(BM_Logprobs)->Arg(0)->Arg(5)->Arg(20)->Unit(benchmark::kMicrosecond);

void BM_Argmax(benchmark::State& state) {
  const std::vector<float> x = randn(50272, 9, 3.0f);
  for (auto _ : state) benchmark::DoNotOptimize(opt::argmax(x.data(), int64_t(x.size())));
}
BENCHMARK(BM_Argmax)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
