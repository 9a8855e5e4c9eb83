// End-to-end speed of one OPT shape (random weights, written once under $OPT_BENCH_DIR or <build>/bench-models),
// each figure set against its hardware floor measured in the same run:
//   BM_ReadBandwidth   sustained read bandwidth over a 512 MiB buffer (1 and 2 threads), the best of the read
//                      variants of bench/floors.hpp (read= names it); BM_Decode and BM_Seed4 measure it again
//                      beside each repetition (floor_GBps) and set x_floor against that
//   BM_PeakFlops       FMA peak: independent chains of the widest FMA this CPU has, per thread (1 and 2 threads)
//   BM_Decode          batch 1, 7-token prompt, 50 new tokens: ms/token, and x_floor = ms / (bytes per token / BW)
//   BM_Seed4           4 prompts of 3-7 tokens, 50 new tokens: ms/step, total ms, step / batch-1 step (against
//                      BM_Decode's, and x_batch1_paired against a batch-1 decode run step for step beside it),
//                      and its FMA floor: x_fma_floor = ms / (a 4-token step's FLOPs / the 2-thread FMA peak), and
//                      batch1_bound = max(FMA floor, read floor) / read floor, the least x_batch1 a step that
//                      overlapped the FMAs and the reads perfectly could reach (each output stays one FMA chain a
//                      token, so a batch of 4 costs 4 FMAs a weight: where that takes as long as reading the weight,
//                      the batch-4 step cannot cost the same as a batch-1 one)
//   BM_Prefill512      one 512-token pass: ms, and x_floor = ms / (FLOPs / the 2-thread FMA peak measured beside it)
//   BM_LoadTTFT        Model::load + Workspace + first forward of a 7-token prompt (warm page cache), and the
//                      prompt pass alone on the loaded model (prompt7_warm_ms)
//   BM_LoadCold        Model::load after the checkpoint's pages are dropped from the page cache (posix_fadvise
//                      DONTNEED on each file): what the disk allows, with disk_MBps = file bytes / load time
//   BM_PeakRSS         peak RSS of a child process that loads and decodes 50 tokens, against
//                      weight files + KV cache + 64 MiB
//   BM_Int8Error       (opt-125m only) int8 against f32 logits and greedy tokens
// What runs: --model=NAME or OPT_BENCH_MODEL (an OPT shape: opt-125m, the default, ... opt-66b; see
// opt-make-random --list) and --formats=a,b or OPT_BENCH_FORMATS (weight formats, default f32,bf16,f16,int8):
//   f32 f16 bf16   a checkpoint stored in that type (sharded like the hub's when large), packed at load
//   int8 int4      quantized at load: from the f32 checkpoint at opt-125m, from the bf16 one for larger shapes
//                  (int8 with the LM head in int8 too, int4 with it as stored)
//   int8-stored int4-stored   the stored packed format (packed.hpp), written quantized (the other tensors and the
//                  LM head in f32 at opt-125m, bf16 beyond): Model::load maps it, nothing is quantized or copied
//   bf16-packed    the stored packed format with bf16 panels (mapped as stored, no repacking at load)
// One format's model is in memory at a time (formats run one after another), so large shapes fit.
// --new=N or OPT_BENCH_NEW: new tokens per decode run (default 50). Every figure is the median of OPT_BENCH_REPS
// (default 5) repetitions. Floors use 2-thread bandwidth/peak (the machine's); x_floor_same_threads uses the figure
// measured with the benchmark's own thread count.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <opt/generate.hpp>
#include <opt/random_checkpoint.hpp>
#include <string>
#include <vector>

#include "floors.hpp"
#include "options.hpp"

namespace {

using clk = std::chrono::steady_clock;
double ms_since(clk::time_point t0) { return std::chrono::duration<double, std::milli>(clk::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int reps() {
  return std::max(1, opt_bench::env_int("OPT_BENCH_REPS", 5));
}

std::string bench_dir() {
  const char* e = std::getenv("OPT_BENCH_DIR");
  return e ? e : OPT_BENCH_DEFAULT_DIR;
}

std::string g_model = "opt-125m";  // --model / OPT_BENCH_MODEL
int g_new = 50;                     // --new / OPT_BENCH_NEW

const char* const kFormats[] = {"f32", "f16", "bf16", "int8", "int4", "int8-stored", "int4-stored", "bf16-packed"};

// The float type of a shape's unquantized tensors.
std::string float_type() { return g_model == "opt-125m" ? "f32" : "bf16"; }

// The stored checkpoint a weight format runs from.
std::string stored_type(const std::string& type) {
  if (type == "int8" || type == "int4") return float_type();
  return type;
}

opt::dtype dtype_of(const std::string& t) {
  return t == "f32" ? opt::dtype::F32 : t == "f16" ? opt::dtype::F16 : opt::dtype::BF16;
}

// The checkpoint for a weight format: written once (shard by shard, never the whole model in memory).
std::filesystem::path checkpoint(const std::string& type) {
  const std::string stored = stored_type(type);
  const auto dir = std::filesystem::path(bench_dir()) / (g_model + "-" + stored);
  if (!std::filesystem::exists(dir / "config.json")) {
    opt::RandomCheckpointOptions o;
    if (stored == "int8-stored" || stored == "int4-stored") {
      o.type = stored == "int8-stored" ? opt::dtype::I8 : opt::dtype::I4;
      o.float_type = dtype_of(float_type());
    } else if (stored == "bf16-packed") {
      o.type = opt::dtype::BF16;
      o.packed = true;
    } else {
      o.type = dtype_of(stored);
    }
    o.seed = 1;
    std::fprintf(stderr, "bench_generate: writing %s\n", dir.c_str());
    opt::write_random_checkpoint(dir, opt::opt_shape(g_model), o);
  }
  return dir;
}

// Bytes of a checkpoint folder's weight files.
double checkpoint_bytes(const std::filesystem::path& dir) {
  double n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") n += double(e.file_size());
  return n;
}

opt::LoadOptions load_options(const std::string& type) {
  opt::LoadOptions o;
  if (type == "int8") {  // the whole model in int8, LM head included (as ggml's q8_0 figure)
    o.quantize = opt::quantization::int8;
    o.lm_head_int8 = true;
  }
  if (type == "int4") o.quantize = opt::quantization::int4;
  return o;
}

// The model of a format, loaded once and reused by every benchmark of that format. Asking for another format
// drops the others first (except keep_also, for comparisons), so one large model is in memory at a time.
std::map<std::string, std::unique_ptr<opt::Model>>& model_cache() {
  static std::map<std::string, std::unique_ptr<opt::Model>> cache;
  return cache;
}
void release_models() { model_cache().clear(); }

const opt::Model& model(const std::string& type, const std::string& keep_also = "") {
  auto& cache = model_cache();
  for (auto it = cache.begin(); it != cache.end();)
    it = it->first == type || it->first == keep_also ? std::next(it) : cache.erase(it);
  auto& m = cache[type];
  if (!m) m = std::make_unique<opt::Model>(opt::Model::load(checkpoint(type), load_options(type)));
  return *m;
}

// ---- the machine's floors ------------------------------------------------------------------------------------
double read_pass(opt::ThreadPool& pool, const float* buf, size_t n, int variant) {
  std::vector<double> part(pool.size(), 0.0);
  pool.parallel_for_t(n, 4096, [&](size_t t, size_t b, size_t e) {
    part[t] += opt_bench::read_sum(buf + b, e - b, variant);
  });
  double s = 0;
  for (double p : part) s += p;
  return s;
}

// A buffer far larger than any cache (the f32 opt-125m weights were 495 MB).
constexpr size_t kBandwidthBytes = size_t(512) << 20;

// The buffer the floors read: the same allocator as the model's weights (huge pages where the system gives them),
// so the floor pays the same TLB costs as the kernels do.
using FloorBuffer = opt::ops::aligned_vector<float>;

// GB/s (1e9 bytes) of one pass over buf.
double read_gbps(opt::ThreadPool& pool, const FloorBuffer& buf, int variant) {
  auto t0 = clk::now();
  benchmark::DoNotOptimize(read_pass(pool, buf.data(), buf.size(), variant));
  return double(buf.size() * sizeof(float)) / (ms_since(t0) * 1e6);
}

// The read floor of `threads` threads: the median GB/s of the fastest read variant (bench/floors.hpp).
struct ReadFloor {
  int variant = 0;
  double gbps = 0;
  double by_variant[opt_bench::kReadVariants] = {};  // each variant's median GB/s
};
// The one buffer every floor reads, allocated and written at first use (the run's first benchmark, before any model
// is loaded) and kept, and filled with distinct values (float(i)), no two pages alike (so a host that merges
// identical pages cannot remap it 4 KiB at a time). Beside a loaded 2.7b-30b model on the Zen 5 VM the probe
// still read 18-46 GB/s where the decode itself streamed 25-56 (ratios under 1) with the buffer all on huge pages
// (floor_huge = 1): the cause is not found; the run's first floor (BM_ReadBandwidth) is the other reference.
const FloorBuffer& floor_buffer() {
  static const FloorBuffer buf = [] {
    FloorBuffer b(kBandwidthBytes / 4);
    for (size_t i = 0; i < b.size(); ++i) b[i] = float(i);
    return b;
  }();
  return buf;
}

// The fraction of floor_buffer() the kernel backs with huge pages (AnonHugePages of its mappings in
// /proc/self/smaps; -1 where that cannot be read): printed as floor_huge, so a probe on 4 KiB pages shows.
double floor_huge_fraction() {
  const FloorBuffer& buf = floor_buffer();
  const auto lo = reinterpret_cast<uintptr_t>(buf.data()), hi = lo + buf.size() * sizeof(float);
  std::FILE* f = std::fopen("/proc/self/smaps", "r");
  if (!f) return -1;
  char line[512];
  bool in = false;
  double huge_kb = 0;
  while (std::fgets(line, sizeof line, f)) {
    unsigned long a = 0, b = 0;
    if (std::sscanf(line, "%lx-%lx ", &a, &b) == 2) {  // a mapping's first line (field lines: "Name: value")
      in = a < hi && b > lo;
      continue;
    }
    unsigned long kb = 0;
    if (in && std::sscanf(line, "AnonHugePages: %lu kB", &kb) == 1) huge_kb += double(kb);
  }
  std::fclose(f);
  return huge_kb * 1024.0 / double(buf.size() * sizeof(float));
}

const ReadFloor& read_floor(size_t threads) {
  static std::map<size_t, ReadFloor> memo;
  if (memo.count(threads)) return memo[threads];
  const FloorBuffer& buf = floor_buffer();
  opt::ThreadPool pool(threads);
  ReadFloor best;
  for (int v = 0; v < opt_bench::kReadVariants; ++v) {
    std::vector<double> gbps;
    for (int r = 0; r < 3 + 2 * reps(); ++r) gbps.push_back(read_gbps(pool, buf, v));
    const double g = median(gbps);
    best.by_variant[v] = g;
    if (g > best.gbps) best.variant = v, best.gbps = g;
  }
  return memo[threads] = best;
}
double bandwidth(size_t threads) { return read_floor(threads).gbps; }

// The machine's bandwidth drifts (on a shared VM the 2-thread figure moved between ~25 and ~44 GB/s from one
// minute to the next), so the decode benchmarks measure their floor beside themselves: one 2-thread pass of the
// best variant before each repetition; x_floor is the median time against the median of these passes.
class FloorProbe {
 public:
  FloorProbe() : pool_(2) {}
  double pass() {
    gbps_.push_back(read_gbps(pool_, floor_buffer(), read_floor(2).variant));
    return gbps_.back();
  }
  double gbps() const { return median(gbps_); }

 private:
  opt::ThreadPool pool_;
  std::vector<double> gbps_;
};

// FLOP/s of one pass of fused multiply-adds on every thread of the pool: independent chains of the widest FMA,
// `iters` steps a thread (bench/floors.hpp).
double fma_pass(opt::ThreadPool& pool, long iters) {
  std::vector<double> flops(pool.size(), 0.0);
  auto t0 = clk::now();
  pool.run([&](size_t t) { flops[t] = opt_bench::fma_chains(iters); });
  double total = 0;
  for (double f : flops) total += f;
  return total / (ms_since(t0) * 1e-3);
}

// The FMA peak of `threads` threads: the median of a few short passes.
double peak_flops(size_t threads) {
  static std::map<size_t, double> memo;
  if (memo.count(threads)) return memo[threads];
  opt::ThreadPool pool(threads);
  std::vector<double> r;
  for (int rep = 0; rep < 3 + reps(); ++rep) r.push_back(fma_pass(pool, 20'000'000 / 16));
  return memo[threads] = median(r);
}

// The FMA peak drifts as the bandwidth does (2 threads read 230-457 GFLOP/s here within minutes: the host at
// times runs both vCPUs on one core), so prefill measures its floor beside itself too: one 2-thread pass before
// each repetition and one after the last (each ~25 ms: shorter ones caught the host's hiccups and read half the
// peak); x_floor is the median time against the median of these passes, x_floor_run_peak the same against the
// 2-thread peak measured at the start of the run (BM_PeakFlops/2).
class PeakProbe {
 public:
  PeakProbe() : pool_(2) {}
  void pass() { gflops_.push_back(fma_pass(pool_, 160'000'000 / 16) * 1e-9); }  // ~25 ms
  double gflops() const { return median(gflops_); }

 private:
  opt::ThreadPool pool_;
  std::vector<double> gflops_;
};

// How f32 weights are prefetched (opt::kernels::f32_prefetch: by CPU, or OPT_PREFETCH_F32): bytes ahead a stream,
// or off.
std::string f32_prefetch_label() {
  const auto& p = opt::kernels::f32_prefetch();
  return p.decode ? std::to_string(p.stream_bytes) : std::string("off");
}

// Which kernels ran (and how they prefetch f32) and which the floors used: every figure carries them.
void label_isa(benchmark::State& state) {
  state.SetLabel(std::string("kernels=") + opt::kernels::to_string(opt::kernels::active_isa()) +
                 " floors=" + opt::kernels::to_string(opt_bench::floor_isa()) +
                 " f32_prefetch=" + f32_prefetch_label());
}

void BM_ReadBandwidth(benchmark::State& state) {
  const size_t threads = size_t(state.range(0));
  for (auto _ : state) state.SetIterationTime(1e-3);
  state.counters["GBps"] = bandwidth(threads);
  state.counters["buffer_MB"] = double(kBandwidthBytes) / 1e6;
  for (int v = 0; v < opt_bench::kReadVariants; ++v)
    state.counters[std::string("GBps_") + opt_bench::read_variant_name(v)] = read_floor(threads).by_variant[v];
  state.SetLabel(std::string("kernels=") + opt::kernels::to_string(opt::kernels::active_isa()) +
                 " floors=" + opt::kernels::to_string(opt_bench::floor_isa()) +
                 " read=" + opt_bench::read_variant_name(read_floor(threads).variant));
}
BENCHMARK(BM_ReadBandwidth)->Arg(1)->Arg(2)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);

void BM_PeakFlops(benchmark::State& state) {
  label_isa(state);
  const size_t threads = size_t(state.range(0));
  for (auto _ : state) state.SetIterationTime(1e-3);
  state.counters["GFLOPs"] = peak_flops(threads) / 1e9;
}
BENCHMARK(BM_PeakFlops)->Arg(1)->Arg(2)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);

// ---- workloads -------------------------------------------------------------------------------------------------
const std::vector<int32_t> kPrompt = {2, 31414, 6, 127, 766, 16, 3437};  // 7 tokens
const std::vector<std::vector<int32_t>> kSeedPrompts = {
    {2, 31414, 6, 127, 766, 16, 3437}, {2, 133, 2119, 6219}, {2, 100, 200, 300, 400, 500}, {2, 42}};

// KV bytes the decode steps read on average: 2 (k, v) x layers x hidden x 4 bytes x mean cache length.
double kv_bytes_per_step(const opt::Config& c, double mean_len) {
  return 2.0 * double(c.num_hidden_layers) * double(c.hidden_size) * 4.0 * mean_len;
}

std::map<std::string, double> g_batch1_step;  // ms per batch-1 step, by "type/threads"

// x_floor against the probe's bandwidth (measured beside the benchmark); floor_GBps is that bandwidth.
// x_floor: the median time against the floor at the probes' median bandwidth. x_floor_paired: the median over the
// repetitions of each one's time against the floor of the probes read right before and right after it (their mean
// bandwidth), which follows a machine whose memory speed drifts between repetitions. Returns the floor (ms).
double set_floor(benchmark::State& state, double ms, double bytes, size_t threads, const FloorProbe& probe,
                 const std::vector<double>& paired = {}) {
  if (!paired.empty()) state.counters["x_floor_paired"] = median(paired);
  const double floor2 = bytes / (probe.gbps() * 1e6);
  state.counters["floor_GBps"] = probe.gbps();
  state.counters["floor_huge"] = floor_huge_fraction();
  state.counters["floor_ms"] = floor2;
  state.counters["x_floor"] = ms / floor2;
  if (threads != 2) state.counters["x_floor_same_threads"] = ms / (bytes / (bandwidth(threads) * 1e6));
  return floor2;
}

void BM_Decode(benchmark::State& state, std::string type) {
  label_isa(state);
  const size_t threads = size_t(state.range(0));
  const opt::Model& m = model(type);
  opt::Workspace ws(threads);
  opt::KvCache kv(m.config(), int64_t(kPrompt.size()) + g_new);
  std::vector<double> per_token, paired;
  FloorProbe probe;
  const double bytes = double(m.decode_weight_bytes()) + kv_bytes_per_step(m.config(), kPrompt.size() + g_new / 2.0);
  // one untimed pass first: a memory-mapped (stored) model's pages are then resident, as in steady decoding
  kv.clear();
  benchmark::DoNotOptimize(m.forward({{&kv, kPrompt.data(), int64_t(kPrompt.size())}}, ws).data);
  for (auto _ : state) {
    for (int r = 0; r < reps(); ++r) {
      const double before = probe.pass();
      kv.clear();
      opt::LogitsView lv = m.forward({{&kv, kPrompt.data(), int64_t(kPrompt.size())}}, ws);
      int32_t id = opt::argmax(lv.row(0), lv.cols);
      std::vector<opt::SequenceChunk> step = {{&kv, &id, 1}};
      auto t0 = clk::now();
      for (int s = 1; s < g_new; ++s) {
        lv = m.forward(step, ws);
        id = opt::argmax(lv.row(0), lv.cols);
      }
      per_token.push_back(ms_since(t0) / (g_new - 1));
      const double after = probe.pass();
      paired.push_back(per_token.back() / (bytes / (0.5 * (before + after) * 1e6)));
    }
    state.SetIterationTime(median(per_token) * 1e-3);
  }
  const double ms = median(per_token);
  g_batch1_step[type + "/" + std::to_string(threads)] = ms;
  state.counters["ms_per_token"] = ms;
  state.counters["MB_per_token"] = bytes / 1e6;
  set_floor(state, ms, bytes, threads, probe, paired);
}

// Multiply-adds of one token through the decoder layers and projections (the weights it multiplies by once;
// attention and the LM head apart).
double layer_macs_per_token(const opt::Config& c) {
  const double H = double(c.hidden_size), E = double(c.word_embed_proj_dim), F = double(c.ffn_dim);
  double macs = double(c.num_hidden_layers) * (4 * H * H + 2 * H * F);
  if (c.has_projections()) macs += H * E + E * H;
  return macs;
}

// FLOPs of one decode step of B sequences at mean context L (logits for every row): 2 per multiply-add.
double step_flops(const opt::Config& c, double B, double L) {
  const double H = double(c.hidden_size), E = double(c.word_embed_proj_dim);
  const double attn = double(c.num_hidden_layers) * 2.0 * H * L;  // QKᵀ and PV over L positions
  return 2.0 * B * (layer_macs_per_token(c) + attn + double(c.vocab_size) * E);
}

void BM_Seed4(benchmark::State& state, std::string type) {
  label_isa(state);
  const size_t threads = size_t(state.range(0));
  const opt::Model& m = model(type);
  opt::Workspace ws(threads);
  std::vector<opt::KvCache> kv;
  for (auto& p : kSeedPrompts) kv.emplace_back(m.config(), int64_t(p.size()) + g_new);
  std::vector<double> step_ms, total_ms, paired;
  FloorProbe probe;
  double mean_len = 0;
  for (auto& p : kSeedPrompts) mean_len += double(p.size()) + g_new / 2.0;
  const double bytes = double(m.decode_weight_bytes()) + kv_bytes_per_step(m.config(), mean_len);
  std::vector<int32_t> next(kSeedPrompts.size());
  std::vector<opt::SequenceChunk> prefill, step;
  for (size_t b = 0; b < kSeedPrompts.size(); ++b) {
    prefill.push_back({&kv[b], kSeedPrompts[b].data(), int64_t(kSeedPrompts[b].size())});
    step.push_back({&kv[b], &next[b], 1});
  }
  // x_batch1_paired: a batch-1 decode (BM_Decode's prompt) runs step for step beside the batch of 4, each step
  // of one right after the same step of the other, so the ratio compares steps taken within milliseconds of each
  // other (on a VM whose speed moves from minute to minute, x_batch1_step, against BM_Decode's run, moved by
  // 1.5x between runs)
  opt::KvCache kv1(m.config(), int64_t(kPrompt.size()) + g_new);
  int32_t id1 = 0;
  const std::vector<opt::SequenceChunk> prefill1 = {{&kv1, kPrompt.data(), int64_t(kPrompt.size())}};
  const std::vector<opt::SequenceChunk> step1 = {{&kv1, &id1, 1}};
  std::vector<double> ratio1;
  for (auto _ : state) {
    for (int r = 0; r < reps(); ++r) {
      const double before = probe.pass();
      for (auto& c : kv) c.clear();
      kv1.clear();
      auto t0 = clk::now();
      opt::LogitsView lv = m.forward(prefill, ws);
      for (size_t b = 0; b < next.size(); ++b) next[b] = opt::argmax(lv.row(int64_t(b)), lv.cols);
      const double prefill_ms = ms_since(t0);
      lv = m.forward(prefill1, ws);
      id1 = int32_t(opt::argmax(lv.row(0), lv.cols));
      double ms4 = 0, ms1 = 0;
      for (int s = 1; s < g_new; ++s) {
        auto t1 = clk::now();
        lv = m.forward(step, ws);
        for (size_t b = 0; b < next.size(); ++b) next[b] = opt::argmax(lv.row(int64_t(b)), lv.cols);
        auto t2 = clk::now();
        lv = m.forward(step1, ws);
        id1 = int32_t(opt::argmax(lv.row(0), lv.cols));
        ms4 += std::chrono::duration<double, std::milli>(t2 - t1).count(), ms1 += ms_since(t2);
      }
      step_ms.push_back(ms4 / (g_new - 1));
      total_ms.push_back(prefill_ms + ms4);
      ratio1.push_back(ms4 / ms1);
      const double after = probe.pass();
      paired.push_back(step_ms.back() / (bytes / (0.5 * (before + after) * 1e6)));
    }
    state.SetIterationTime(median(total_ms) * 1e-3);
  }
  const double ms = median(step_ms);
  state.counters["ms_per_step"] = ms;
  state.counters["total_ms"] = median(total_ms);
  state.counters["x_batch1_paired"] = median(ratio1);
  auto it = g_batch1_step.find(type + "/" + std::to_string(threads));
  if (it != g_batch1_step.end()) state.counters["x_batch1_step"] = ms / it->second;
  const double read_ms = set_floor(state, ms, bytes, threads, probe, paired);
  const double fma_ms = step_flops(m.config(), double(kSeedPrompts.size()), mean_len) / peak_flops(2) * 1e3;
  state.counters["fma_floor_ms"] = fma_ms;
  state.counters["x_fma_floor"] = ms / fma_ms;
  state.counters["batch1_bound"] = std::max(1.0, fma_ms / read_ms);
}

// FLOPs of one pass of T tokens (last-token logits only): 2 per multiply-add.
double prefill_flops(const opt::Config& c, double T) {
  const double H = double(c.hidden_size), E = double(c.word_embed_proj_dim);
  const double attn = double(c.num_hidden_layers) * 2.0 * H * T * (T + 1);  // QKᵀ and PV over the causal half
  return 2.0 * T * layer_macs_per_token(c) + attn + 2.0 * double(c.vocab_size) * E;
}

void BM_Prefill512(benchmark::State& state, std::string type) {
  label_isa(state);
  const size_t threads = size_t(state.range(0));
  const opt::Model& m = model(type);
  opt::Workspace ws(threads);
  const int64_t T = 512;
  std::vector<int32_t> ids(T);
  for (int64_t i = 0; i < T; ++i) ids[size_t(i)] = int32_t((i * 7919 + 3) % m.config().vocab_size);
  opt::KvCache kv(m.config(), T);
  std::vector<double> ms;
  PeakProbe probe;
  for (auto _ : state) {
    for (int r = 0; r < std::max(3, reps() / 2 + 1); ++r) {
      probe.pass();
      kv.clear();
      auto t0 = clk::now();
      benchmark::DoNotOptimize(m.forward({{&kv, ids.data(), T}}, ws).data);
      ms.push_back(ms_since(t0));
    }
    probe.pass();
    state.SetIterationTime(median(ms) * 1e-3);
  }
  const double flops = prefill_flops(m.config(), double(T));
  const double t = median(ms);
  const double floor2 = flops / (probe.gflops() * 1e9) * 1e3;
  state.counters["ms"] = t;
  state.counters["floor_GFLOPs"] = probe.gflops();
  state.counters["tok_per_s"] = double(T) / (t * 1e-3);
  state.counters["GFLOPs"] = flops / (t * 1e6);
  state.counters["floor_ms"] = floor2;
  state.counters["x_floor"] = t / floor2;
  state.counters["x_floor_run_peak"] = t / (flops / peak_flops(2) * 1e3);
  if (threads != 2) state.counters["x_floor_same_threads"] = t / (flops / peak_flops(threads) * 1e3);
}

void BM_LoadTTFT(benchmark::State& state, std::string type) {
  label_isa(state);
  const size_t threads = size_t(state.range(0));
  const auto dir = checkpoint(type);
  release_models();  // one model in memory: a format packed at load holds a copy (two 6.7b bf16 ones do not fit)
  { opt::Model warm = opt::Model::load(dir, load_options(type)); }  // page cache warm
  std::vector<double> load_ms, ttft_ms, prompt_ms;
  for (auto _ : state) {
    for (int r = 0; r < reps(); ++r) {
      auto t0 = clk::now();
      opt::Model m = opt::Model::load(dir, load_options(type));
      load_ms.push_back(ms_since(t0));
      opt::Workspace ws(threads);
      opt::KvCache kv(m.config(), int64_t(kPrompt.size()) + g_new);
      opt::LogitsView lv = m.forward({{&kv, kPrompt.data(), int64_t(kPrompt.size())}}, ws);
      benchmark::DoNotOptimize(opt::argmax(lv.row(0), lv.cols));
      ttft_ms.push_back(ms_since(t0));
      // the same prompt again on the loaded model: the prompt pass alone, weights already mapped
      kv.clear();
      auto t1 = clk::now();
      lv = m.forward({{&kv, kPrompt.data(), int64_t(kPrompt.size())}}, ws);
      benchmark::DoNotOptimize(opt::argmax(lv.row(0), lv.cols));
      prompt_ms.push_back(ms_since(t1));
    }
    state.SetIterationTime(median(ttft_ms) * 1e-3);
  }
  state.counters["load_ms"] = median(load_ms);
  state.counters["load_plus_ttft_ms"] = median(ttft_ms);
  state.counters["prompt7_warm_ms"] = median(prompt_ms);
}

// Drops dir's files from the page cache (clean pages only; the next read comes from the disk).
void drop_page_cache(const std::filesystem::path& dir) {
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const int fd = ::open(e.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

void BM_LoadCold(benchmark::State& state, std::string type) {
  label_isa(state);
  const auto dir = checkpoint(type);
  release_models();  // nothing else in memory
  std::vector<double> load_ms;
  for (auto _ : state) {
    for (int r = 0; r < std::max(1, reps() / 2); ++r) {
      drop_page_cache(dir);
      auto t0 = clk::now();
      opt::Model m = opt::Model::load(dir, load_options(type));
      load_ms.push_back(ms_since(t0));
    }
    state.SetIterationTime(median(load_ms) * 1e-3);
  }
  state.counters["load_ms"] = median(load_ms);
  state.counters["disk_MBps"] = checkpoint_bytes(dir) / (median(load_ms) * 1e3);
}

// Child mode (argv: --rss-child type threads model new): load, decode, print peak RSS in KiB and the cache's bytes.
int rss_child(const std::string& type, size_t threads) {
  const opt::Model m = opt::Model::load(checkpoint(type), load_options(type));
  opt::Workspace ws(threads);
  opt::KvCache kv(m.config(), int64_t(kPrompt.size()) + g_new);
  opt::LogitsView lv = m.forward({{&kv, kPrompt.data(), int64_t(kPrompt.size())}}, ws);
  int32_t id = opt::argmax(lv.row(0), lv.cols);
  for (int s = 1; s < g_new; ++s) {
    lv = m.forward({{&kv, &id, 1}}, ws);
    id = opt::argmax(lv.row(0), lv.cols);
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  std::printf("%ld %zu\n", ru.ru_maxrss, kv.bytes());
  return 0;
}

void BM_PeakRSS(benchmark::State& state, std::string type) {
  label_isa(state);
  const size_t threads = size_t(state.range(0));
  const auto dir = checkpoint(type);
  long rss_kib = 0;
  size_t kv_bytes = 0;
  for (auto _ : state) {
    const std::string cmd =
        "/proc/" + std::to_string(getpid()) + "/exe --rss-child " + type + " " + std::to_string(threads) + " " +
        g_model + " " + std::to_string(g_new);
    FILE* p = popen(cmd.c_str(), "r");
    if (!p || std::fscanf(p, "%ld %zu", &rss_kib, &kv_bytes) != 2) {
      if (p) pclose(p);
      state.SkipWithError("the --rss-child process failed");
      return;
    }
    pclose(p);
    state.SetIterationTime(1e-3);
  }
  const double file = checkpoint_bytes(dir);
  const double budget = file + double(kv_bytes) + 64.0 * 1048576.0;
  state.counters["peak_rss_MiB"] = double(rss_kib) / 1024.0;
  state.counters["budget_MiB"] = budget / 1048576.0;
  state.counters["x_budget"] = double(rss_kib) * 1024.0 / budget;
}

// int8 against f32 on the 125m-shape model: max |logit error| over the seed prompts' prompt passes, and greedy
// agreement over 50 new tokens (tokens equal before the first divergence / all tokens).
void BM_Int8Error(benchmark::State& state, bool lm_head_int8) {
  label_isa(state);
  const opt::Model& f = model("f32", "int8");
  opt::LoadOptions lo;
  lo.quantize = opt::quantization::int8;
  lo.lm_head_int8 = lm_head_int8;
  const opt::Model q = opt::Model::load(checkpoint("f32"), lo);
  opt::Workspace ws(2);
  double max_err = 0, max_logit = 0;
  size_t agree = 0, total = 0;
  for (auto _ : state) {
    for (const auto& p : kSeedPrompts) {
      opt::KvCache k1(f.config(), 64), k2(q.config(), 64);
      opt::ForwardOptions fo;
      fo.all_logits = true;
      auto a = f.forward({{&k1, p.data(), int64_t(p.size())}}, ws, fo);
      std::vector<float> av(a.data, a.data + a.rows * a.cols);
      auto b = q.forward({{&k2, p.data(), int64_t(p.size())}}, ws, fo);
      for (size_t i = 0; i < av.size(); ++i) {
        max_err = std::max(max_err, double(std::fabs(av[i] - b.data[i])));
        max_logit = std::max(max_logit, double(std::fabs(av[i])));
      }
    }
    opt::GenerateOptions go;
    go.max_new_tokens = g_new;
    go.stop_at_eos = false;
    auto g1 = opt::generate_ids(f, kSeedPrompts, go, ws), g2 = opt::generate_ids(q, kSeedPrompts, go, ws);
    for (size_t b = 0; b < kSeedPrompts.size(); ++b) {
      size_t i = 0;
      while (i < g1.new_tokens[b].size() && g1.new_tokens[b][i] == g2.new_tokens[b][i]) ++i;
      agree += i;
      total += g1.new_tokens[b].size();
    }
    state.SetIterationTime(1e-3);
  }
  state.counters["max_logit_err"] = max_err;
  state.counters["max_logit"] = max_logit;
  state.counters["greedy_agree"] = double(agree) / double(total);
}

// The comma-separated list in s.
std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b <= s.size()) {
    const size_t e = std::min(s.find(',', b), s.size());
    if (e > b) out.push_back(s.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

void register_all(const std::vector<std::string>& formats) {
  const bool both = std::find(formats.begin(), formats.end(), "f32") != formats.end() &&
                    std::find(formats.begin(), formats.end(), "int8") != formats.end();
  if (g_model == "opt-125m" && both) {
    benchmark::RegisterBenchmark("BM_Int8Error/lm_head_f32", BM_Int8Error, false)
        ->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("BM_Int8Error/lm_head_int8", BM_Int8Error, true)
        ->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
  }
  for (const std::string& type : formats) {
    benchmark::RegisterBenchmark(("BM_Decode/" + type).c_str(), BM_Decode, type)
        ->Arg(1)->Arg(2)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("BM_Seed4/" + type).c_str(), BM_Seed4, type)
        ->Arg(1)->Arg(2)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("BM_Prefill512/" + type).c_str(), BM_Prefill512, type)
        ->Arg(1)->Arg(2)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("BM_LoadTTFT/" + type).c_str(), BM_LoadTTFT, type)
        ->Arg(2)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("BM_LoadCold/" + type).c_str(), BM_LoadCold, type)
        ->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("BM_PeakRSS/" + type).c_str(), BM_PeakRSS, type)
        ->Arg(2)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
  }
}

// Takes --model=, --formats= and --new= out of argv (the rest goes to Google Benchmark); the environment
// variables give the defaults. Returns the formats, or throws on a bad value.
std::vector<std::string> parse_options(int& argc, char** argv) {
  std::string formats = "f32,bf16,f16,int8";
  opt_bench::take_flags(argc, argv,
                        {opt_bench::flag("model", "OPT_BENCH_MODEL", g_model),
                         opt_bench::flag("formats", "OPT_BENCH_FORMATS", formats),
                         opt_bench::flag("new", "OPT_BENCH_NEW", g_new)});
  (void)opt::opt_shape(g_model);  // throws for an unknown shape
  if (g_model.rfind("facebook/", 0) == 0) g_model = g_model.substr(9);  // the folder name: opt-X
  if (g_model.rfind("opt-", 0) != 0) g_model = "opt-" + g_model;
  if (g_new < 2) throw std::invalid_argument("--new must be at least 2");
  const auto list = split(formats);
  for (const std::string& f : list)
    if (std::find(std::begin(kFormats), std::end(kFormats), f) == std::end(kFormats))
      throw std::invalid_argument("unknown weight format '" + f +
                                  "' (expected f32, f16, bf16, int8, int4, int8-stored, int4-stored or bf16-packed)");
  if (list.empty()) throw std::invalid_argument("no weight formats given");
  return list;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc == 6 && std::string(argv[1]) == "--rss-child") {
      g_model = argv[4];
      g_new = std::atoi(argv[5]);
      return rss_child(argv[2], size_t(std::atoi(argv[3])));
    }
    register_all(parse_options(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_generate: %s\n", e.what());
    return 1;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  try {
    benchmark::RunSpecifiedBenchmarks();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_generate: %s\n", e.what());
    return 1;
  }
  benchmark::Shutdown();
  return 0;
}
