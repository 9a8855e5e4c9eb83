// Speculative decoding against plain greedy decoding, in the same run, on one OPT shape with random weights
// (default opt-1.3b in bf16; written once under $OPT_BENCH_DIR or <build>/bench-models, as bench_generate does):
//   BM_Plain/<workload>            ms per new token of plain greedy decoding (the prompt pass included)
//   BM_Spec/<drafter>/<workload>   the same with speculative decoding: ms/token, plain decoding's ms/token in
//                                  runs interleaved with these (plain_ms_per_token), speedup = the median of each
//                                  pair's plain / speculative, acceptance (accepted / proposed drafts), tokens
//                                  per model pass, and in plain steps what a proposal's drafting took (draft_steps,
//                                  its catching up included) and a verifying pass (pass_steps)
// Drafters: self_int8 (the model's own weights quantized to int8 at load, LM head too), self_int8_approx (the same
// on the CPU's int8 dot products, LoadOptions::approximate_int8: AVX-512 VNNI), self_int4 (to int4, the
// LM head as stored), lookup (prompt lookup, n-grams up to 3),
// draft_125m (a random opt-125m: a poor guesser, as any unrelated draft of random weights must be), never (proposes
// a wrong token every time: the cost of a drafter that never guesses right, with adaptive K).
// Workloads: "prompt" (a 7-token prompt) and "repeat" (a prompt that repeats a 12-token phrase three times).
// Both outputs are checked equal to plain decoding's before a figure is printed.
// --model=NAME / OPT_BENCH_MODEL, --format=f32|f16|bf16 / OPT_BENCH_FORMAT, --new=N / OPT_BENCH_NEW (default 32),
// --k=K / OPT_BENCH_K (default 5, SpeculativeOptions::draft_tokens); every figure is the median of OPT_BENCH_REPS (default 3) runs.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <opt/random_checkpoint.hpp>
#include <opt/speculative.hpp>
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

std::string g_model = "opt-1.3b", g_format = "bf16";
int g_new = 32, g_k = int(opt::SpeculativeOptions{}.draft_tokens), g_reps = 3;

std::filesystem::path checkpoint(const std::string& shape, const std::string& type) {
  const char* e = std::getenv("OPT_BENCH_DIR");
  const auto dir = std::filesystem::path(e ? e : OPT_BENCH_DEFAULT_DIR) / (shape + "-" + type);
  if (!std::filesystem::exists(dir / "config.json")) {
    opt::RandomCheckpointOptions o;
    o.type = type == "f32" ? opt::dtype::F32 : type == "f16" ? opt::dtype::F16 : opt::dtype::BF16;
    std::fprintf(stderr, "bench_speculative: writing %s\n", dir.c_str());
    opt::write_random_checkpoint(dir, opt::opt_shape(shape), o);
  }
  return dir;
}

const opt::Model& target() {
  static const opt::Model m = opt::Model::load(checkpoint(g_model, g_format));
  return m;
}

std::vector<int32_t> workload(const std::string& name) {
  if (name == "prompt") return {2, 31414, 6, 127, 766, 16, 3437};
  const std::vector<int32_t> phrase = {133, 2119, 6219, 16, 5, 313, 9, 5, 232, 4, 20, 3034};
  std::vector<int32_t> p = {2};
  for (int r = 0; r < 3; ++r) p.insert(p.end(), phrase.begin(), phrase.end());
  return p;
}

opt::GenerateOptions options() {
  opt::GenerateOptions go;
  go.max_new_tokens = g_new;
  go.stop_at_eos = false;
  return go;
}

std::map<std::string, std::vector<int32_t>> g_plain;  // plain new tokens, by workload

void label(benchmark::State& state) {
  state.SetLabel(std::string("kernels=") + opt::kernels::to_string(opt::kernels::active_isa()) + " " + g_model + " " +
                 g_format);
}

void BM_Plain(benchmark::State& state, std::string w) {
  label(state);
  const opt::Model& m = target();
  opt::Workspace ws(2);
  const auto p = workload(w);
  std::vector<double> ms;
  for (auto _ : state) {
    for (int r = 0; r < g_reps; ++r) {
      auto t0 = clk::now();
      const opt::GenerateResult res = opt::generate_ids(m, {p}, options(), ws);
      ms.push_back(ms_since(t0) / double(res.new_tokens[0].size()));
      g_plain[w] = res.new_tokens[0];
    }
    state.SetIterationTime(median(ms) * 1e-3);
  }
  state.counters["ms_per_token"] = median(ms);
}

// Proposes a token the model will not choose (the plain continuation + 1): nothing is ever accepted.
class NeverDrafter : public opt::Drafter {
 public:
  explicit NeverDrafter(const std::vector<int32_t>& prompt, const std::vector<int32_t>& plain, int64_t vocab)
      : prompt_(prompt.size()), plain_(plain), vocab_(vocab) {}
  std::vector<int32_t> propose(const std::vector<int32_t>& t, int64_t k) override {
    const size_t done = t.size() - prompt_;
    std::vector<int32_t> out;
    for (size_t j = done; j < plain_.size() && int64_t(out.size()) < k; ++j)
      out.push_back(int32_t((plain_[j] + 1) % vocab_));
    return out;
  }

 private:
  size_t prompt_;
  std::vector<int32_t> plain_;
  int64_t vocab_;
};

std::unique_ptr<opt::Drafter> make_drafter(const std::string& d, const std::vector<int32_t>& prompt,
                                           const std::vector<int32_t>& plain) {
  static std::map<std::string, std::unique_ptr<opt::Model>> drafts;
  if (d == "lookup") return std::make_unique<opt::PromptLookupDrafter>(3);
  if (d == "never") return std::make_unique<NeverDrafter>(prompt, plain, target().config().vocab_size);
  auto& m = drafts[d];
  if (!m) {
    if (d == "self_int8" || d == "self_int8_approx" || d == "self_int4") {
      opt::LoadOptions lo;
      lo.quantize = d == "self_int4" ? opt::quantization::int4 : opt::quantization::int8;
      lo.quantize_lm_head = d != "self_int4";  // int4: the LM head as stored (an int4 one guesses far worse)
      lo.approximate_int8 = d == "self_int8_approx";
      m = std::make_unique<opt::Model>(opt::Model::load(checkpoint(g_model, g_format), lo));
    } else {
      m = std::make_unique<opt::Model>(opt::Model::load(checkpoint("opt-125m", "bf16")));
    }
  }
  return std::make_unique<opt::ModelDrafter>(*m, 2);
}

void BM_Spec(benchmark::State& state, std::string d, std::string w) {
  label(state);
  const opt::Model& m = target();
  opt::Workspace ws(2);
  const auto p = workload(w);
  if (!g_plain.count(w)) {
    state.SkipWithError("run BM_Plain first (its workload's plain tokens are the reference)");
    return;
  }
  std::vector<double> ms, plain_ms, ratio;
  opt::SpeculativeStats st;
  for (auto _ : state) {
    for (int r = 0; r < g_reps; ++r) {
      auto drafter = make_drafter(d, p, g_plain[w]);
      opt::SpeculativeOptions so;
      so.draft_tokens = g_k;
      // plain decoding right before each speculative run: the speedup is the median of these pairs' ratios, so
      // a machine whose speed drifts between benchmarks (a noisy VM) does not move it
      auto t0 = clk::now();
      const opt::GenerateResult plain = opt::generate_ids(m, {p}, options(), ws);
      plain_ms.push_back(ms_since(t0) / double(plain.new_tokens[0].size()));
      t0 = clk::now();
      const opt::GenerateResult res = opt::speculative_generate_ids(m, {p}, options(), *drafter, so, ws, false, &st);
      ms.push_back(ms_since(t0) / double(res.new_tokens[0].size()));
      ratio.push_back(plain_ms.back() / ms.back());
      if (res.new_tokens[0] != g_plain[w] || plain.new_tokens[0] != g_plain[w]) {
        state.SkipWithError("speculative output differs from plain decoding");
        return;
      }
    }
    state.SetIterationTime(median(ms) * 1e-3);
  }
  state.counters["ms_per_token"] = median(ms);
  const double plain_step = median(plain_ms);
  state.counters["plain_ms_per_token"] = plain_step;
  state.counters["speedup"] = median(ratio);
  state.counters["acceptance"] = st.acceptance();
  state.counters["tokens_per_pass"] = st.tokens_per_pass();
  // the split, in plain steps (plain decoding's ms/token): a proposal's drafting, and a verifying pass
  state.counters["draft_steps"] = st.draft_ms_per_proposal() / plain_step;
  state.counters["pass_steps"] = st.ms_per_pass() / plain_step;
}

}  // namespace

int main(int argc, char** argv) {
  g_reps = opt_bench::env_int("OPT_BENCH_REPS", g_reps);
  opt_bench::take_flags(argc, argv,
                        {opt_bench::flag("model", "OPT_BENCH_MODEL", g_model),
                         opt_bench::flag("format", "OPT_BENCH_FORMAT", g_format),
                         opt_bench::flag("new", "OPT_BENCH_NEW", g_new), opt_bench::flag("k", "OPT_BENCH_K", g_k)});
  try {
    (void)opt::opt_shape(g_model);
    if (g_format != "f32" && g_format != "f16" && g_format != "bf16")
      throw std::invalid_argument("--format must be f32, f16 or bf16");
    if (g_new < 2 || g_k < 1 || g_reps < 1) throw std::invalid_argument("--new >= 2, --k >= 1, OPT_BENCH_REPS >= 1");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_speculative: %s\n", e.what());
    return 1;
  }
  for (const char* w : {"prompt", "repeat"}) {
    benchmark::RegisterBenchmark((std::string("BM_Plain/") + w).c_str(), BM_Plain, std::string(w))
        ->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
    for (const char* d : {"self_int8", "self_int8_approx", "self_int4", "lookup", "draft_125m", "never"})
      benchmark::RegisterBenchmark((std::string("BM_Spec/") + d + "/" + w).c_str(), BM_Spec, std::string(d),
                                   std::string(w))
          ->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  try {
    benchmark::RunSpecifiedBenchmarks();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_speculative: %s\n", e.what());
    return 1;
  }
  benchmark::Shutdown();
  return 0;
}
