// opt-serve: an HTTP server for OPT models with continuous batching.
//
//   opt-serve -m MODEL_DIR [-t TOKENIZER_DIR] [--host 127.0.0.1] [--port 8080] [--max-batch 16] [--threads N]
//             [--max-queue 64] [--max-body-bytes 1048576] [--max-tokens-limit N] [--max-prompts 32]
//             [--kv-cache f32|f16|bf16] [--max-connections 4096] [--head-timeout 10] [--body-timeout 30]
//             [--timeout 30] [--api-key KEY | --api-key-file FILE] [--cache-bytes 268435456]
//             [--cache-block-tokens 16] [--drain-timeout S]
//             [--lookup N | --draft-self int8|int4 | --draft DIR] [--draft-tokens K]
//
// Endpoints
//   POST /generate        {"prompts": [...], "max_new_tokens": 50} -> {"texts": [...]}: greedy, each text starts
//                         with its prompt (the seed's contract; equal to batch_decode(skip_special_tokens=True)).
//   POST /v1/completions  OpenAI completions: prompt (string, list of strings, ids or lists of ids), max_tokens,
//                         temperature, top_p, top_k, repetition_penalty, stop, seed, echo, n = 1, stream
//                         (server-sent events "data: {...}\n\n", ending with "data: [DONE]\n\n").
//   POST /tokenize        {"prompt": "..."} -> {"tokens": [...]}; POST /detokenize {"tokens": [...]} -> {"prompt"}.
//   GET  /v1/models, GET /health, GET /metrics (Prometheus), GET / (a page to type a prompt and watch the answer).
//
// The files: main.cpp (the command line, loading, signals), http.hpp (Boost.Beast sessions, routing, deadlines),
// api.hpp (what each endpoint answers), scheduler.hpp (the thread that owns opt::Batch), request.hpp (request
// bodies -> sequences), metrics.hpp (GET /metrics), page.hpp (the page at /), options.hpp (the settings).
//
// Design: HTTP sessions (a few I/O threads, event-driven) parse and validate a request (tokenize, check limits),
// then hand its sequences to ONE scheduler thread that owns the model's opt::Batch. Between two steps the
// scheduler admits waiting sequences (up to --max-batch running), drops those whose client went away (Batch::stop
// frees the KV cache at once), runs one step for all of them, and hands each new token to its request's TextStream
// (streaming detokenizer + stop strings). Every sequence has its own cache, positions and sampler, so its answer is
// the one it gets alone. Sequences beyond --max-batch wait in a queue of --max-queue; past that a request gets 429.
// Errors are JSON: {"error": {"message", "type", "param", "code"}}.
//
// Speculative decoding (the flags of opt-generate): --lookup N (prompt lookup, n-grams up to N), --draft-self
// int8|int4 (the model's own weights quantized) or --draft DIR (a draft model with the same vocabulary), with
// --draft-tokens K (default 5, adaptive). Every sequence then speculates inside the shared batch step (a request
// opts out with "speculative": false, in /generate and /v1/completions). Greedy answers are exactly the same as
// without the flag; a seeded sampling answer is the same on every run and in any batch, drawn from the same
// distribution as without the flag but with draws of its own (opt out to get the plain sampler's draws).
// /health then adds "speculative": {"drafter", "proposed", "accepted", "passes"}; /metrics the same counters.
//
// Stopping (SIGTERM or SIGINT, taken by an Asio signal_set). Without --drain-timeout (or with 0) the server stops
// at once: requests running or waiting end with the error "server shutting down" (a stream as its last event, then
// [DONE]) and the process exits 0. With --drain-timeout S > 0 it drains first, as a replica behind a load balancer
// should (deploy/nginx/): new work (/generate, /v1/completions) gets 503 "the server is shutting down" and
// GET /health 503 {"status": "draining"}; every answer closes its connection; what is running and waiting runs to
// its end; then the server stops and exits 0. If the drain is not over after S seconds, or a second signal
// comes, the requests still running or waiting end with "server shutting down" and the process exits 1, so that
// a supervisor can tell a drain that lost work from one that did not.
//
// Built with -DOPT_MPI=ON, `mpirun -np N opt-serve ...` (the same flags) splits the decoder layers over N ranks
// (opt/pipeline.hpp): rank 0 serves HTTP and runs the batch, the other ranks only compute their layers of each step.
#include <CLI/CLI.hpp>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>

#include <boost/asio/signal_set.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../kv_cache_option.hpp"
#include "../pipeline_option.hpp"
#include "../speculation_option.hpp"
#include "api.hpp"
#include "http.hpp"
#include "options.hpp"

namespace {

using namespace opt_serve;
using Clock = std::chrono::steady_clock;

// The soft limit of open files raised to the hard one (each connection is a file descriptor); returns the limit.
rlim_t raise_file_limit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return 0;
  if (r.rlim_cur < r.rlim_max) {
    rlimit want = r;
    want.rlim_cur = r.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &want) == 0) r = want;
  }
  return r.rlim_cur;
}

// The key of --api-key-file: the file's first line, without surrounding spaces.
std::string read_key_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot read --api-key-file " + path);
  std::string line;
  std::getline(f, line);
  const size_t b = line.find_first_not_of(" \t\r\n"), e = line.find_last_not_of(" \t\r\n");
  if (b == std::string::npos) throw std::runtime_error("--api-key-file " + path + " holds no key");
  return line.substr(b, e - b + 1);
}

}  // namespace

int main(int argc, char** argv) {
  // SIGINT/SIGTERM are taken by an Asio signal_set on the main thread; every other thread blocks them (blocked
  // here, before MPI starts its own threads). Under mpirun SIGUSR1 too: mpirun ends the job at once on SIGINT/SIGTERM, but passes SIGUSR1
  // to every rank, so it is the clean shutdown (rank 0 answers what it can, then stops the other ranks, which wait
  // for that). SIGPIPE: a client that went away makes writes fail instead of killing the process.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  PipelineRun pipe(argc, argv, "opt-serve");
  if (!pipe.pipelined()) {  // one process: SIGUSR1 keeps its default action
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    pthread_sigmask(SIG_UNBLOCK, &usr1, nullptr);
    sigdelset(&sigs, SIGUSR1);
  }
  PipelineFlags pf;
  ServerOptions o;
  std::string api_key, api_key_file;
  CLI::App app{"Serve an OPT model over HTTP: /generate, OpenAI /v1/completions (with streaming), a web page",
               "opt-serve"};
  app.add_option("-m,--model", o.model_dir, "model folder (config.json + safetensors, or pytorch_model.bin)")->required();
  app.add_option("-t,--tokenizer", o.tokenizer_dir, "tokenizer folder (default: the model folder)");
  app.add_option("--host", o.host, "address to listen on")->capture_default_str();
  app.add_option("--port", o.port, "port (0: any free port; the chosen one is printed)")->capture_default_str()
      ->check(CLI::Range(0, 65535));
  app.add_option("--model-name", o.model_name, "the model's name in responses (default: the folder's name)");
  app.add_option("--max-batch", o.max_batch, "sequences run together in one step")->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--max-queue", o.max_queue, "sequences that may wait for a slot; beyond that: 429")
      ->capture_default_str()->check(CLI::Range(0, 100000));
  app.add_option("--threads", o.threads, "compute threads (0: all cores)")->capture_default_str();
  app.add_option("--http-threads", o.http_threads, "HTTP I/O threads, each serving many connections (0: 2)")
      ->capture_default_str()->check(CLI::Range(0, 256));
  app.add_option("--max-body-bytes", o.max_body_bytes, "largest request body; beyond that: 413")
      ->capture_default_str()->check(CLI::Range(size_t(1), size_t(1) << 30));
  app.add_option("--max-tokens-limit", o.max_tokens_limit, "largest max_tokens a request may ask (0: the context)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--max-prompts", o.max_prompts, "prompts per request")->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--timeout", o.timeout_s, "time to write an answer (each piece of a stream), seconds")
      ->capture_default_str()->check(CLI::Range(1, 3600));
  app.add_option("--head-timeout", o.head_timeout_s,
                 "time to send a request's head, and to keep an idle connection open, seconds")
      ->capture_default_str()->check(CLI::Range(1, 3600));
  app.add_option("--body-timeout", o.body_timeout_s, "time to send a request's body, seconds")
      ->capture_default_str()->check(CLI::Range(1, 3600));
  app.add_option("--max-connections", o.max_connections, "open connections; beyond that a new one gets 503")
      ->capture_default_str()->check(CLI::Range(size_t(1), size_t(1) << 20));
  auto* key_opt = app.add_option("--api-key", api_key, "every endpoint but /health needs 'Authorization: Bearer KEY'");
  app.add_option("--api-key-file", api_key_file, "the API key: the first line of this file")->excludes(key_opt);
  app.add_option("--drain-timeout", o.drain_timeout_s,
                 "on SIGTERM/SIGINT, refuse new work (503) and finish what runs and waits for up to this long, "
                 "seconds; past it the rest fails and the exit status is 1 (0: stop at once)")
      ->capture_default_str()->check(CLI::Range(0, 86400));
  app.add_option("--step-delay-ms", o.step_delay_ms, "sleep after each step (tests and demos)")
      ->capture_default_str()->check(CLI::Range(0, 10000));
  app.add_option("--kv-cache", o.kv_cache, "KV cache elements: f32 (exact), f16 or bf16 (half the memory)")
      ->capture_default_str()->check(kv_cache_validator());
  app.add_option("--cache-bytes", o.cache_bytes,
                 "prefix cache: bytes of prompts' KV kept for later requests that start with the same tokens, least "
                 "recently used evicted first (0: off; default 256 MiB)")
      ->capture_default_str();
  app.add_option("--cache-block-tokens", o.cache_block_tokens, "prefix cache: tokens per cached block")
      ->capture_default_str()->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  add_speculation_options(app, o.spec);
  add_pipeline_options(app, pf);
  CLI11_PARSE(app, argc, argv);
  // Under mpirun the prefix cache is off: the other ranks' layers of a cached prefix are not kept anywhere.
  if (pipe.pipelined()) o.cache_bytes = 0;

  if (pipe.rank() > 0) {  // a pipeline stage: its layers of every step, until rank 0 stops
    // (its signals stay blocked: rank 0 shuts down on them, then tells this one)
    try {
      const opt::Model part = opt::Model::load(o.model_dir, pipe.load_options({}, o.model_dir));
      const int rc = pipe.serve(part, o.threads, pf);
      if (pf.peak_rss) pipe.print_peak_rss(&part);
      return rc;
    } catch (const std::exception& e) {
      return pipe.fail(e.what());
    }
  }

  // (SIGINT/SIGTERM, and SIGUSR1 under mpirun, are blocked since the start of main: they come to the Asio
  // signal_set below, on this thread, once every other thread exists.)
  signal(SIGPIPE, SIG_IGN);

  const rlim_t files = raise_file_limit();
  if (files != RLIM_INFINITY && files < o.max_connections + 64)
    std::fprintf(stderr, "opt-serve: warning: %llu open files allowed (ulimit -n), fewer than --max-connections %zu\n",
                 (unsigned long long)files, o.max_connections);

  std::unique_ptr<Server> s;
  std::shared_ptr<opt::Drafter> drafter;
  std::string drafter_name;
  try {
    if (!api_key_file.empty()) api_key = read_key_file(api_key_file);
    else if (app.count("--api-key") && api_key.empty()) throw std::runtime_error("--api-key is empty");
    namespace fs = std::filesystem;
    const fs::path tdir = o.tokenizer_dir.empty() ? fs::path(o.model_dir) : fs::path(o.tokenizer_dir);
    if (o.model_name.empty()) o.model_name = fs::path(o.model_dir).lexically_normal().filename().string();
    if (o.model_name.empty()) o.model_name = fs::path(o.model_dir).lexically_normal().parent_path().filename().string();
    auto t0 = Clock::now();
    opt::Model model = opt::Model::load(o.model_dir, pipe.load_options({}, o.model_dir));
    pipe.attach(model);  // under mpirun: the other ranks run the layers beyond this one's
    s = std::make_unique<Server>(o, std::move(model), opt::Tokenizer::from_dir(tdir));
    s->api_key = api_key;
    RequestRules rules;
    rules.context = s->context();
    rules.vocab_size = s->model.config().vocab_size;
    rules.max_tokens_limit = o.max_tokens_limit;
    rules.max_prompts = o.max_prompts;
    s->parser = std::make_unique<RequestParser>(s->tok, rules, std::random_device{}());
    std::fprintf(stderr, "opt-serve: loaded %s in %.0f ms (context %lld, vocab %lld)\n", o.model_dir.c_str(),
                 std::chrono::duration<double, std::milli>(Clock::now() - t0).count(),
                 (long long)s->context(), (long long)s->model.config().vocab_size);
    drafter = make_drafter(o.spec, o.model_dir, s->model, o.threads, drafter_name);
    if (drafter)
      std::fprintf(stderr, "opt-serve: speculative decoding: %s, K<=%lld\n", drafter_name.c_str(),
                   (long long)o.spec.draft_tokens);
  } catch (const std::exception& e) {
    if (pipe.pipelined()) return pipe.fail(e.what());
    std::fprintf(stderr, "opt-serve: %s\n", e.what());
    return 1;
  }
  Server& srv = *s;
  srv.sched = std::make_unique<Scheduler>(srv.model, srv.tok, srv.o, std::move(drafter), drafter_name);

  net::io_context ioc;
  HttpServer http(srv, ioc);
  int port = 0;
  try {
    port = http.listen(o.host, o.port);
  } catch (const std::exception& e) {
    if (pipe.pipelined()) return pipe.fail(e.what());
    std::fprintf(stderr, "opt-serve: %s\n", e.what());
    return 1;
  }
  // The signals: the first starts the stop (a drain first with --drain-timeout), a second one cuts a drain short.
  net::signal_set signals(ioc, SIGINT, SIGTERM);
  if (pipe.pipelined()) signals.add(SIGUSR1);  // mpirun's clean shutdown (see above)
  std::mutex stop_mu;
  std::condition_variable stop_cv;
  int signals_seen = 0, first_signal = 0;
  bool io_over = false;
  std::function<void()> wait_signal = [&] {
    signals.async_wait([&](const boost::system::error_code& ec, int sig) {
      if (ec) return;
      {
        std::lock_guard<std::mutex> lk(stop_mu);
        if (signals_seen++ == 0) first_signal = sig;
      }
      stop_cv.notify_all();
      wait_signal();
    });
  };
  wait_signal();
  srv.sched->start();
  http.start();

  int exit_code = 0;
  std::thread stopper([&] {
    std::unique_lock<std::mutex> lk(stop_mu);
    stop_cv.wait(lk, [&] { return signals_seen > 0 || io_over; });
    if (signals_seen == 0) return;  // the I/O threads ended on their own
    const char* name = first_signal == SIGINT ? "SIGINT" : first_signal == SIGTERM ? "SIGTERM" : "SIGUSR1";
    if (o.drain_timeout_s > 0) {
      std::fprintf(stderr, "opt-serve: %s, draining (at most %d s), then shutting down\n", name, o.drain_timeout_s);
      http.begin_drain();  // every answer closes its connection
      srv.sched->begin_drain();  // new work gets 503; what runs and waits goes on
      const auto deadline = Clock::now() + std::chrono::seconds(o.drain_timeout_s);
      while (srv.sched->outstanding() > 0 && signals_seen < 2 && Clock::now() < deadline)
        stop_cv.wait_for(lk, std::chrono::milliseconds(20));
      if (const size_t left = srv.sched->outstanding(); left > 0) {
        std::fprintf(stderr, "opt-serve: drain cut short (%s): %zu sequences still running or waiting end with an "
                     "error\n", signals_seen >= 2 ? "a second signal" : "--drain-timeout", left);
        exit_code = 1;
      } else {
        std::fprintf(stderr, "opt-serve: drained\n");
      }
    } else {
      std::fprintf(stderr, "opt-serve: %s, shutting down\n", name);
    }
    lk.unlock();
    http.begin_shutdown();  // no new connections; idle ones close
    srv.sched->shutdown();  // running and waiting requests end with an error; streams close after it
    // the sessions write those last answers; whatever is still open after 3 s is dropped
    for (int i = 0; i < 300 && srv.connections.load() > 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ioc.stop();
  });
  std::printf("opt-serve: listening on http://%s:%d\n", o.host.c_str(), port);
  std::fflush(stdout);

  const size_t io_threads = o.http_threads ? o.http_threads : 2;
  std::vector<std::thread> pool;
  for (size_t i = 1; i < io_threads; ++i) pool.emplace_back([&ioc] { ioc.run(); });
  pthread_sigmask(SIG_UNBLOCK, &sigs, nullptr);  // every thread exists: the signals come to this one
  ioc.run();
  for (auto& t : pool) t.join();
  http.abandon_all();  // what is left (past the 3 s) is dropped with the io_context
  {
    std::lock_guard<std::mutex> lk(stop_mu);
    io_over = true;
  }
  stop_cv.notify_all();
  stopper.join();
  if (!srv.sched->stopping()) srv.sched->shutdown();
  pipe.finish();  // (the scheduler has stopped: no pass is running)
  if (pf.peak_rss) pipe.print_peak_rss(&srv.model);
  std::fprintf(stderr, "opt-serve: stopped\n");
  return exit_code;
}
