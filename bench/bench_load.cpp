// Model::load (warm page cache) of the opt-125m shape in each weight format, with the random checkpoints written
// once under $OPT_BENCH_DIR (default <build>/bench-models):
//   BM_Load/f32            f32 safetensors: every linear weight repacked into panels at load
//   BM_Load/f32_q8         the same with LoadOptions::quantize = int8 (quantizing at load, then packing)
//   BM_Load/int8_stored    the stored packed format, int8 (opt-make-random --dtype int8): bound in place
//   BM_Load/f32_packed     the stored packed format, f32 panels (--dtype f32 --packed): bound in place
// Counters: file_MB (the weight files), owned_MB (weights the model holds in memory, Model::owned_weight_bytes),
// first_ms (the first 1-token forward after the load, which touches the mapped pages).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <opt/generate.hpp>
#include <opt/random_checkpoint.hpp>
#include <string>

namespace {

namespace fs = std::filesystem;

struct Format {
  const char* name;
  opt::dtype type;
  bool packed, quantize;
};
const Format kFormats[] = {{"f32", opt::dtype::F32, false, false},
                           {"f32_q8", opt::dtype::F32, false, true},
                           {"int8_stored", opt::dtype::I8, true, false},
                           {"f32_packed", opt::dtype::F32, true, false}};

fs::path model_dir(const Format& f) {
  const char* env = std::getenv("OPT_BENCH_DIR");
  const fs::path root = env && *env ? fs::path(env) : fs::path(OPT_BENCH_DEFAULT_DIR);
  const std::string kind = f.type == opt::dtype::I8 ? "int8-stored" : f.packed ? "f32-packed" : "f32";
  const fs::path dir = root / ("opt-125m-" + kind);
  if (!fs::exists(dir / "config.json")) {
    opt::RandomCheckpointOptions o;
    o.type = f.type;
    o.float_type = opt::dtype::F32;
    o.packed = f.packed;
    opt::write_random_checkpoint(dir, opt::opt_shape("opt-125m"), o);
  }
  return dir;
}

void BM_Load(benchmark::State& state, const Format& f) {
  const fs::path dir = model_dir(f);
  opt::LoadOptions lo;
  if (f.quantize) lo.quantize = opt::quantization::int8;
  size_t file_bytes = 0;
  for (auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") file_bytes += fs::file_size(e.path());
  (void)opt::Model::load(dir, lo);  // warm the page cache
  size_t owned = 0;
  double first_ms = 0;
  for (auto _ : state) {
    opt::Model m = opt::Model::load(dir, lo);
    state.PauseTiming();
    owned = m.owned_weight_bytes();
    opt::Workspace ws(2);
    opt::KvCache kv(m.config(), 8);
    const int32_t id = 2;
    const auto t0 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(m.forward({{&kv, &id, 1}}, ws).data);
    first_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    state.ResumeTiming();
  }
  state.counters["file_MB"] = double(file_bytes) / 1e6;
  state.counters["owned_MB"] = double(owned) / 1e6;
  state.counters["first_ms"] = first_ms;
}

const bool registered = [] {
  for (const Format& f : kFormats)
    benchmark::RegisterBenchmark((std::string("BM_Load/") + f.name).c_str(), BM_Load, f)
        ->Unit(benchmark::kMillisecond)
        ->Iterations(5)
        ->Repetitions(3)
        ->ReportAggregatesOnly(true);
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
