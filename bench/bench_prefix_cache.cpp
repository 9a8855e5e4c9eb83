// Time to first token with and without a prefix cache hit (opt::PrefixCache in opt::Batch), on one OPT shape with
// random weights (default opt-125m in f32; written once under $OPT_BENCH_DIR or <build>/bench-models):
//   BM_TTFT/cold/<prefix>   add() of a prompt of <prefix> shared tokens + 8 of its own, then the step that gives its
//                           first token, with an empty cache (what a server without one pays for every request)
//   BM_TTFT/warm/<prefix>   the same prompt after another prompt with the same <prefix> tokens (and another tail)
//                           was run: the prefix's KV is copied from the cache and only the rest is computed;
//                           speedup = cold / warm
// The first token and its logits are checked equal, bit for bit, between cold and warm before a figure is printed.
// --model=NAME / OPT_BENCH_MODEL, --format=f32|f16|bf16 / OPT_BENCH_FORMAT, --threads=N / OPT_BENCH_THREADS
// (default 2), --kv=f32|f16|bf16 / OPT_BENCH_KV (the KV cache's type, default f32); each figure is the median of
// OPT_BENCH_REPS (default 5) runs.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <opt/batch.hpp>
#include <opt/prefix_cache.hpp>
#include <opt/random_checkpoint.hpp>
#include <string>
#include <vector>

#include "options.hpp"

namespace {

using clk = std::chrono::steady_clock;
double ms_since(clk::time_point t0) { return std::chrono::duration<double, std::milli>(clk::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string g_model = "opt-125m", g_format = "f32", g_kv = "f32";
int g_threads = 2, g_reps = 5;

opt::dtype type_of(const std::string& t) {
  return t == "f32" ? opt::dtype::F32 : t == "f16" ? opt::dtype::F16 : opt::dtype::BF16;
}

std::filesystem::path checkpoint(const std::string& shape, const std::string& type) {
  const char* e = std::getenv("OPT_BENCH_DIR");
  const auto dir = std::filesystem::path(e ? e : OPT_BENCH_DEFAULT_DIR) / (shape + "-" + type);
  if (!std::filesystem::exists(dir / "config.json")) {
    opt::RandomCheckpointOptions o;
    o.type = type_of(type);
    std::fprintf(stderr, "bench_prefix_cache: writing %s\n", dir.c_str());
    opt::write_random_checkpoint(dir, opt::opt_shape(shape), o);
  }
  return dir;
}

const opt::Model& model() {
  static const opt::Model m = opt::Model::load(checkpoint(g_model, g_format));
  return m;
}

// `n` token ids from a seeded stream, none of them special (ids 0..3)
std::vector<int32_t> tokens(size_t n, uint32_t seed, int64_t vocab) {
  std::vector<int32_t> out;
  uint64_t x = 0x9E3779B97F4A7C15ull * (seed + 1);
  for (size_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    out.push_back(int32_t(4 + (x >> 33) % uint64_t(vocab - 4)));
  }
  return out;
}

struct First {
  int32_t token = 0;
  std::vector<float> logits;
};

// add() + the first step of `prompt` in `batch`: the time to its first token, in ms.
double first_token(opt::Batch& batch, const std::vector<int32_t>& prompt, First* out) {
  opt::SequenceOptions so;
  so.max_new_tokens = 1;
  so.kv_cache = type_of(g_kv);
  const auto t0 = clk::now();
  const opt::SeqId id = batch.add(prompt, so);
  const std::vector<opt::StepToken>& st = batch.step();
  const double ms = ms_since(t0);
  if (out) {
    out->token = st.at(0).token;
    out->logits.assign(st[0].logits, st[0].logits + batch.model().config().vocab_size);
  }
  batch.release(id);
  return ms;
}

std::map<int64_t, double> g_cold_ms;  // by prefix length
std::map<int64_t, First> g_cold;      // the cold first token, the reference of the warm one

void label(benchmark::State& state) {
  state.SetLabel(std::string("kernels=") + opt::kernels::to_string(opt::kernels::active_isa()) + " " + g_model + " " +
                 g_format + " kv=" + g_kv + " threads=" + std::to_string(g_threads));
}

void BM_TTFT(benchmark::State& state, bool warm, int64_t prefix_len) {
  label(state);
  const opt::Model& m = model();
  const int64_t vocab = m.config().vocab_size;
  const std::vector<int32_t> prefix = tokens(size_t(prefix_len), 1, vocab);
  auto with_tail = [&](uint32_t seed) {
    std::vector<int32_t> p = prefix;
    const std::vector<int32_t> tail = tokens(8, seed, vocab);
    p.insert(p.end(), tail.begin(), tail.end());
    return p;
  };
  const std::vector<int32_t> prompt = with_tail(2), other = with_tail(3);
  if (warm && !g_cold.count(prefix_len)) {
    state.SkipWithError("run BM_TTFT/cold first (its first token is the reference)");
    return;
  }
  opt::Batch batch(m, size_t(g_threads));
  std::vector<double> ms;
  opt::PrefixCacheStats stats;
  for (auto _ : state) {
    for (int r = 0; r < g_reps; ++r) {
      First f;
      if (warm) {
        auto cache = std::make_shared<opt::PrefixCache>(m, size_t(1) << 30);
        batch.set_prefix_cache(cache);
        first_token(batch, other, nullptr);  // stores the shared prefix
        ms.push_back(first_token(batch, prompt, &f));
        stats = cache->stats();
        const First& want = g_cold[prefix_len];
        if (f.token != want.token ||
            std::memcmp(f.logits.data(), want.logits.data(), f.logits.size() * sizeof(float)) != 0) {
          state.SkipWithError("the warm first token or its logits differ from the cold run's");
          return;
        }
      } else {
        ms.push_back(first_token(batch, prompt, &f));
        g_cold[prefix_len] = f;
      }
    }
    state.SetIterationTime(median(ms) * 1e-3);
  }
  state.counters["ttft_ms"] = median(ms);
  state.counters["prompt_tokens"] = double(prompt.size());
  if (warm) {
    state.counters["cached_tokens"] = double(stats.hit_tokens);
    state.counters["speedup"] = g_cold_ms[prefix_len] / median(ms);
  } else {
    g_cold_ms[prefix_len] = median(ms);
  }
}

}  // namespace

int main(int argc, char** argv) {
  g_reps = opt_bench::env_int("OPT_BENCH_REPS", g_reps);
  opt_bench::take_flags(argc, argv,
                        {opt_bench::flag("model", "OPT_BENCH_MODEL", g_model),
                         opt_bench::flag("format", "OPT_BENCH_FORMAT", g_format),
                         opt_bench::flag("kv", "OPT_BENCH_KV", g_kv),
                         opt_bench::flag("threads", "OPT_BENCH_THREADS", g_threads)});
  try {
    (void)opt::opt_shape(g_model);
    for (const std::string* t : {&g_format, &g_kv})
      if (*t != "f32" && *t != "f16" && *t != "bf16")
        throw std::invalid_argument("--format and --kv must be f32, f16 or bf16");
    if (g_threads < 1 || g_reps < 1) throw std::invalid_argument("--threads >= 1, OPT_BENCH_REPS >= 1");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_prefix_cache: %s\n", e.what());
    return 1;
  }
  for (int64_t prefix : {100, 400, 1000})
    for (bool warm : {false, true})
      benchmark::RegisterBenchmark(
          ("BM_TTFT/" + std::string(warm ? "warm/" : "cold/") + std::to_string(prefix)).c_str(), BM_TTFT, warm, prefix)
          ->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  try {
    benchmark::RunSpecifiedBenchmarks();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_prefix_cache: %s\n", e.what());
    return 1;
  }
  benchmark::Shutdown();
  return 0;
}
