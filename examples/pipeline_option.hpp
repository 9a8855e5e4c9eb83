// One model across processes (opt/pipeline.hpp) for opt-generate and opt-serve: built with -DOPT_MPI=ON and run
// as `mpirun -np N PROGRAM ...` with the flags of one process, rank 0 holds the embeddings, the head and the first
// layers and does everything a single process does; the other ranks hold the remaining layers and only compute.
// Without OPT_MPI (or with one rank) nothing changes. Also --peak-rss (every rank's VmHWM on stderr at exit).
#pragma once
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <opt/config.hpp>
#include <opt/model.hpp>
#include <opt/pipeline.hpp>
#include <string>

struct PipelineFlags {
  bool peak_rss = false;
  int64_t fail_after = -1;  // hidden, for the tests: rank 1 dies abruptly after this many passes
};

inline void add_pipeline_options(CLI::App& app, PipelineFlags& f) {
  app.add_flag("--peak-rss", f.peak_rss,
               "at exit, print this process's peak RSS (VmHWM of /proc/self/status) to stderr; under mpirun, every "
               "rank's");
  app.add_option("--pipeline-fail-after", f.fail_after, "(tests) rank 1 ends abruptly after this many passes")
      ->group("");
}

// VmHWM of /proc/self/status in kB (-1 when unreadable).
inline long peak_rss_kb() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
  return -1;
}

// The process's place in the pipeline: MPI initialized and finalized (with OPT_MPI), its rank and part.
class PipelineRun {
 public:
  PipelineRun(int& argc, char**& argv, const char* program) : program_(program) {
#if defined(OPT_MPI)
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks_);
#else
    (void)argc, (void)argv;
#endif
  }
  PipelineRun(const PipelineRun&) = delete;
  PipelineRun& operator=(const PipelineRun&) = delete;
  ~PipelineRun() {
    head_.reset();
#if defined(OPT_MPI)
    MPI_Finalize();
#endif
  }

  int rank() const noexcept { return rank_; }
  int ranks() const noexcept { return ranks_; }
  bool pipelined() const noexcept { return ranks_ > 1; }

  // What this rank loads of the model in `dir`: all of it alone, else its stage's part.
  opt::LoadOptions load_options(opt::LoadOptions lo, const std::string& dir) {
    if (!pipelined()) return lo;
    const opt::Config c = opt::Config::from_file(std::filesystem::path(dir) / "config.json");
    return opt::pipeline::stage_options(lo, c.num_hidden_layers, ranks_, rank_);
  }

  // Rank 0 of several: the other ranks run the layers beyond its own (collective with serve()).
  void attach(opt::Model& model) {
#if defined(OPT_MPI)
    if (!pipelined()) return;
    part_ = model.part_string();
    try {
      head_ = std::make_shared<opt::pipeline::Head>(model, MPI_COMM_WORLD);
    } catch (const opt::config_error&) {  // the parts do not fit: the Head told the stages to stop
      stopped_ = true;
      throw;
    }
    model.set_remote_layers(head_);
#else
    (void)model;
#endif
  }

  // A rank > 0: runs its layers for every pass until rank 0 finishes; the exit code.
  int serve(const opt::Model& model, size_t threads, const PipelineFlags& f) {
#if defined(OPT_MPI)
    opt::Workspace ws(threads);
    opt::pipeline::Stage stage(model, ws, MPI_COMM_WORLD);
    while (stage.serve_pass())
      if (rank_ == 1 && f.fail_after >= 0 && stage.passes() >= f.fail_after) {
        std::fprintf(stderr, "%s: rank 1: ending abruptly after %lld passes (--pipeline-fail-after)\n", program_,
                     (long long)stage.passes());
        std::_Exit(3);
      }
#else
    (void)model, (void)threads, (void)f;
#endif
    return 0;
  }

  // Rank 0: tells the other ranks to stop (after the work, or after an error before any pass).
  void finish() {
#if defined(OPT_MPI)
    if (!pipelined()) return;
    if (head_) head_->finish();
#endif
  }

  // An error on this rank: one line on stderr; a rank > 0 (or an error inside a pass) ends the whole job, since
  // the others wait for it. Returns the exit code.
  int fail(const std::string& what) {
    std::string msg = what;
    for (char& c : msg)
      if (c == '\n') c = ' ';
    if (pipelined()) std::fprintf(stderr, "%s: rank %d: %s\n", program_, rank_, msg.c_str());
    else std::fprintf(stderr, "%s: %s\n", program_, msg.c_str());
#if defined(OPT_MPI)
    if (pipelined()) {
      std::fflush(stderr);
      // rank 0 stops the stages when they wait for a pass; anywhere else (a stage, or rank 0 before the
      // handshake, which the stages are inside) only ending the job frees the others
      bool stopped = stopped_;
      if (rank_ == 0 && head_) {
        try {
          head_->finish();
          stopped = true;
        } catch (const std::exception&) {
        }
      }
      if (!stopped) MPI_Abort(MPI_COMM_WORLD, 1);
    }
#endif
    return 1;
  }

  // --stats, rank 0 of several: the hand-offs.
  void print_traffic() const {
#if defined(OPT_MPI)
    if (!head_) return;
    const opt::pipeline::Traffic t = head_->traffic();
    std::fprintf(stderr, "pipeline: %d ranks (rank 0: %s) | %lld passes, %lld tokens | %lld bytes sent over %d "
                 "boundaries (%lld hidden, %lld headers) | %.1f bytes per pass per boundary\n",
                 ranks_, part_.c_str(), (long long)t.passes, (long long)t.tokens, (long long)t.bytes(),
                 t.boundaries, (long long)t.hidden_bytes, (long long)t.header_bytes,
                 t.passes ? double(t.bytes()) / double(t.passes) / t.boundaries : 0.0);
#endif
  }

  // --peak-rss: this rank's VmHWM.
  void print_peak_rss(const opt::Model* model) const {
    const long kb = peak_rss_kb();
    if (pipelined())
      std::fprintf(stderr, "%s: rank %d of %d (%s): peak RSS %ld kB\n", program_, rank_, ranks_,
                   model ? model->part_string().c_str() : "not loaded", kb);
    else
      std::fprintf(stderr, "%s: peak RSS %ld kB\n", program_, kb);
  }

 private:
  const char* program_;
  int rank_ = 0, ranks_ = 1;
  std::string part_;
  bool stopped_ = false;  // rank 0: the stages were told to stop
#if defined(OPT_MPI)
  std::shared_ptr<opt::pipeline::Head> head_;
#else
  std::shared_ptr<void> head_;
#endif
};
