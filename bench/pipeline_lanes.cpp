// pipeline-lanes: micro-batches interleaved across the MPI pipeline (opt/pipeline.hpp, Head::lane), measured.
//
//   mpirun -np N pipeline-lanes -m DIR [--groups G] [--batch B] [--prompt P] [--new T] [--threads 1] [--ids]
//
// G groups of B sequences each (deterministic prompts of P ids) decode T new tokens greedily, each group driven by
// its own host thread on rank 0 through its own lane (a Model copy with set_remote_layers(head->lane(g))); with
// G >= 2 and N >= 2 ranks, the ranks work on different groups at the same time. Rank 0's group threads take turns
// on one mutex (held around forward(), released while a pass is on the other ranks), so rank 0 computes on
// --threads threads like every other rank. With one rank there is no pipeline: the groups take turns on the whole
// model. Rank 0 prints one line per sequence (with --ids: its new ids; always: an FNV-1a hash of the bits of every
// logits row it was chosen from) and a summary line with the aggregate decode tokens/s; the per-sequence lines are
// the same for any N and G (tests/mpi/lanes.test.mjs). Built with -DOPT_MPI=ON (tests/CMakeLists.txt).
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <opt/config.hpp>
#include <opt/model.hpp>
#include <opt/pipeline.hpp>
#include <opt/sampler.hpp>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Result {
  std::vector<int32_t> ids;
  uint64_t hash = 1469598103934665603ull;  // FNV-1a offset basis
};

void hash_row(uint64_t& h, const float* row, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, row + i, 4);
    for (int k = 0; k < 4; ++k) h = (h ^ ((bits >> (8 * k)) & 0xffu)) * 1099511628211ull;
  }
}

// Everyone waits until `n` have arrived (C++17 has no std::barrier).
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mu_);
    if (--n_ == 0) cv_.notify_all();
    else cv_.wait(lock, [&] { return n_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_;
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0, rank = 0, ranks = 1;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  CLI::App app{"Micro-batches interleaved across the MPI pipeline: aggregate decode tokens/s"};
  std::string dir;
  int groups = 2, batch = 1;
  int64_t prompt = 8, n_new = 32;
  size_t threads = 1;
  bool print_ids = false;
  app.add_option("-m,--model", dir, "model folder")->required();
  app.add_option("--groups", groups, "groups of sequences in flight at once (one lane and host thread each)")
      ->check(CLI::Range(1, 64));
  app.add_option("--batch", batch, "sequences per group")->check(CLI::Range(1, 1024));
  app.add_option("--prompt", prompt, "prompt ids per sequence")->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  app.add_option("--new", n_new, "new tokens per sequence")->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  app.add_option("--threads", threads, "compute threads per rank");
  app.add_flag("--ids", print_ids, "print every sequence's new ids");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = rank == 0 ? app.exit(e) : 0;
    MPI_Finalize();
    return rc ? rc : 0;
  }
  try {
    const opt::Config cfg = opt::Config::from_file(std::filesystem::path(dir) / "config.json");
    opt::LoadOptions lo;
    if (ranks > 1) lo = opt::pipeline::stage_options(lo, cfg.num_hidden_layers, ranks, rank);
    const opt::Model model = opt::Model::load(dir, lo);
    if (rank > 0) {
      opt::Workspace ws(threads);
      opt::pipeline::Stage stage(model, ws, MPI_COMM_WORLD);
      while (stage.serve_pass()) {
      }
      MPI_Finalize();
      return 0;
    }
    std::shared_ptr<opt::pipeline::Head> head;
    if (ranks > 1) head = std::make_shared<opt::pipeline::Head>(model, MPI_COMM_WORLD);
    const int64_t V = cfg.vocab_size, S = int64_t(groups) * batch;
    std::vector<Result> results(static_cast<size_t>(S));
    std::mutex cpu;  // rank 0's compute: one group at a time
    Barrier prefilled(groups);
    std::vector<double> decode_end(static_cast<size_t>(groups));
    std::chrono::steady_clock::time_point t_start, t_prefilled;
    t_start = std::chrono::steady_clock::now();
    auto drive = [&](int g) {
      try {
        opt::Model m = model;
        if (head) m.set_remote_layers(head->lane(g, &cpu));
        opt::Workspace ws(threads);
        std::vector<opt::KvCache> caches;
        std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(batch));
        std::vector<int32_t> next(static_cast<size_t>(batch));
        for (int b = 0; b < batch; ++b) {
          caches.emplace_back(cfg, prompt + n_new);
          const int64_t s = int64_t(g) * batch + b;
          prompts[size_t(b)].push_back(2);  // </s>, OPT's BOS
          for (int64_t t = 1; t < prompt; ++t)
            prompts[size_t(b)].push_back(int32_t(3 + (s * 7919 + t * 104729) % (V - 3)));
        }
        std::vector<opt::SequenceChunk> chunks(static_cast<size_t>(batch));
        auto step = [&](bool first) {
          for (int b = 0; b < batch; ++b)
            chunks[size_t(b)] = {&caches[size_t(b)], first ? prompts[size_t(b)].data() : &next[size_t(b)],
                                 first ? prompt : 1};
          const opt::LogitsView lv = m.forward(chunks, ws);
          for (int b = 0; b < batch; ++b) {
            Result& r = results[size_t(int64_t(g) * batch + b)];
            hash_row(r.hash, lv.row(b), V);
            next[size_t(b)] = opt::argmax(lv.row(b), V);
            r.ids.push_back(next[size_t(b)]);
          }
        };
        std::unique_lock<std::mutex> hold(cpu);
        step(true);
        hold.unlock();
        prefilled.arrive_and_wait();
        if (g == 0) t_prefilled = std::chrono::steady_clock::now();
        hold.lock();
        for (int64_t i = 1; i < n_new; ++i) step(false);
        hold.unlock();
        decode_end[size_t(g)] =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
      } catch (const std::exception& e) {  // the other groups may wait for this one: end the job
        std::fprintf(stderr, "pipeline-lanes: rank 0, group %d: %s\n", g, e.what());
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
    };
    std::vector<std::thread> pool;
    for (int g = 0; g < groups; ++g) pool.emplace_back(drive, g);
    for (std::thread& t : pool) t.join();
    if (head) head->finish();
    double end = 0;
    for (double d : decode_end) end = std::max(end, d);
    const double prefill_s = std::chrono::duration<double>(t_prefilled - t_start).count();
    const double decode_s = end - prefill_s;
    for (int64_t s = 0; s < S; ++s) {
      std::printf("sequence %lld: logits hash %016llx", (long long)s, (unsigned long long)results[size_t(s)].hash);
      if (print_ids) {
        std::printf(" ids");
        for (int32_t id : results[size_t(s)].ids) std::printf(" %d", id);
      }
      std::printf("\n");
    }
    const double tokens = double(S) * double(n_new - 1);
    std::printf("pipeline-lanes: %d ranks, %d groups x %d sequences, prompt %lld, %lld new, %zu thread(s) per rank, "
                "kernels %s | prefill %.1f ms | decode %.0f tokens in %.1f ms: %.2f tok/s aggregate\n",
                ranks, groups, batch, (long long)prompt, (long long)n_new, threads,
                opt::kernels::to_string(opt::kernels::active_isa()), prefill_s * 1e3, tokens,
                decode_s * 1e3, decode_s > 0 ? tokens / decode_s : 0.0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipeline-lanes: rank %d: %s\n", rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return 0;
}
