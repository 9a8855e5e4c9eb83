// opt-serve: an HTTP server for OPT models with continuous batching.
//
//   opt-serve -m MODEL_DIR [-t TOKENIZER_DIR] [--host 127.0.0.1] [--port 8080] [--max-batch 16] [--threads N]
//             [--max-queue 64] [--max-body-bytes 1048576] [--max-tokens-limit N] [--max-prompts 32]
//             [--kv-cache f32|f16|bf16] [--lookup N | --draft-self int8|int4 | --draft DIR] [--draft-tokens K]
//
// Endpoints
//   POST /generate        {"prompts": [...], "max_new_tokens": 50} -> {"texts": [...]}: greedy, each text starts
//                         with its prompt (the seed's contract; equal to batch_decode(skip_special_tokens=True)).
//   POST /v1/completions  OpenAI completions: prompt (string, list of strings, ids or lists of ids), max_tokens,
//                         temperature, top_p, top_k, repetition_penalty, stop, seed, echo, n = 1, stream
//                         (server-sent events "data: {...}\n\n", ending with "data: [DONE]\n\n").
//   GET  /v1/models, GET /health, GET / (a page to type a prompt and watch the answer stream).
//
// Design: the HTTP threads parse and validate a request (tokenize, check limits), then hand its sequences to
// ONE scheduler thread that owns the model's opt::Batch. Between two steps the scheduler admits waiting
// sequences (up to --max-batch running), drops those whose client went away (Batch::stop frees the KV cache at
// once), runs one step for all of them, and hands each new token to its request's TextStream (streaming
// detokenizer + stop strings). Every sequence has its own cache, positions and sampler, so its answer is the one
// it gets alone. Sequences beyond --max-batch wait in a queue of --max-queue; past that a request gets 429.
// Errors are JSON: {"error": {"message", "type", "param", "code"}}.
//
// Speculative decoding (the flags of opt-generate): --lookup N (prompt lookup, n-grams up to N), --draft-self
// int8|int4 (the model's own weights quantized) or --draft DIR (a draft model with the same vocabulary), with
// --draft-tokens K (default 4, adaptive). Every sequence then speculates inside the shared batch step (a request
// opts out with "speculative": false, in /generate and /v1/completions). Greedy answers are exactly the same as
// without the flag; a seeded sampling answer is the same on every run and in any batch, drawn from the same
// distribution as without the flag but with draws of its own (opt out to get the plain sampler's draws).
// /health then adds "speculative": {"drafter", "proposed", "accepted", "passes"}.
#include <CLI/CLI.hpp>
#include <httplib.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <opt/batch.hpp>
#include <opt/generate.hpp>
#include <opt/model.hpp>
#include <opt/speculative.hpp>
#include <opt/tokenizer.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kv_cache_option.hpp"
#include "opt_serve_page.hpp"
#include "opt_serve_request.hpp"
#include "speculation_option.hpp"

namespace {

using json = nlohmann::json;
using namespace opt_serve;
using Clock = std::chrono::steady_clock;

struct ServerOptions {
  std::string model_dir, tokenizer_dir, host = "127.0.0.1", model_name;
  int port = 8080;
  size_t max_batch = 16, max_queue = 64, threads = 0, http_threads = 0, max_prompts = 32;
  size_t max_body_bytes = 1 << 20;
  int64_t max_tokens_limit = 0;  // 0: the model's context
  int timeout_s = 30;
  int step_delay_ms = 0;  // testing and demos: sleep after each step so streams can be watched
  std::string kv_cache = "f32";  // every sequence's KV cache element type (--kv-cache)
  SpeculationFlags spec;         // --lookup, --draft-self, --draft, --draft-tokens
};

// ---- errors -----------------------------------------------------------------------------------------------------

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.status == 429 || e.status == 503) res.set_header("Retry-After", "1");
  res.set_content(error_body(e), "application/json");
}

// ---- requests and the scheduler ------------------------------------------------------------------------------------

class Scheduler {
 public:
  // `drafter`: speculative decoding for every sequence that does not opt out (null: none).
  Scheduler(const opt::Model& model, const opt::Tokenizer& tok, const ServerOptions& o,
            std::shared_ptr<opt::Drafter> drafter, std::string drafter_name)
      : tok_(tok), opts_(o), batch_(model, o.threads), kv_cache_(opt::kv_cache_type_from_string(o.kv_cache)),
        drafter_name_(std::move(drafter_name)) {
    dopts_.skip_special_tokens = true;
    // clean_up_tokenization_spaces: the tokenizer's default, as batch_decode
    if (drafter) {
      opt::SpeculativeOptions so;
      so.draft_tokens = o.spec.draft_tokens;
      spec_ = opt::speculation(std::move(drafter), so, &spec_stats_);
    }
  }

  void start() { thread_ = std::thread([this] { run(); }); }

  // Stops the loop: every request still running or waiting fails with "server shutting down".
  void shutdown() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // Queues every choice of a request; false when the queue has no room for all of them (nothing is queued).
  bool submit(const std::shared_ptr<Request>& r) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stopping_) return false;
      if (pending_.size() + r->choices.size() > opts_.max_queue + free_slots_locked()) return false;
      r->remaining = r->choices.size();
      for (size_t i = 0; i < r->choices.size(); ++i) {
        r->choices[i].stream = std::make_unique<opt::TextStream>(tok_, r->choices[i].stop, dopts_);
        pending_.push_back({r, i});
      }
      queued_ = pending_.size();
    }
    cv_.notify_all();
    return true;
  }

  void wake() { cv_.notify_all(); }
  bool stopping() const {
    std::lock_guard<std::mutex> lk(mu_);
    return stopping_;
  }

  json stats() const {
    return {{"active", active_count_.load()},     {"queued", queued_.load()},
            {"max_batch", opts_.max_batch},       {"max_queue", opts_.max_queue},
            {"completed", completed_.load()},     {"cancelled", cancelled_.load()},
            {"steps", steps_.load()},             {"generated_tokens", generated_.load()},
            {"kv_cache_bytes", cache_bytes_.load()}};
  }
  json speculation_stats() const {
    if (!spec_) return nullptr;
    return {{"drafter", drafter_name_}, {"proposed", proposed_.load()}, {"accepted", accepted_.load()},
            {"passes", passes_.load()}};
  }

  const opt::DecodeOptions& decode_options() const { return dopts_; }

 private:
  struct Entry {
    std::shared_ptr<Request> req;
    size_t choice;
  };

  size_t free_slots_locked() const { return opts_.max_batch - std::min(opts_.max_batch, active_count_.load()); }

  void run() {
    for (;;) {
      std::vector<Entry> admitted;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stopping_ || !pending_.empty() || !active_.empty(); });
        if (stopping_) break;
        while (!pending_.empty() && active_.size() + admitted.size() < opts_.max_batch) {
          admitted.push_back(pending_.front());
          pending_.pop_front();
        }
        queued_ = pending_.size();
      }
      for (Entry& e : admitted) admit(e);
      drop_cancelled();
      if (active_.empty()) continue;
      step();
      if (opts_.step_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(opts_.step_delay_ms));
    }
    // shutting down: fail whatever is left
    std::deque<Entry> left;
    {
      std::lock_guard<std::mutex> lk(mu_);
      left.swap(pending_);
      queued_ = 0;
    }
    for (auto& [id, e] : active_) left.push_back(e);
    for (Entry& e : left) fail(e, "server shutting down");
    active_.clear();
    active_count_ = 0;
  }

  void admit(const Entry& e) {
    Choice& c = e.req->choices[e.choice];
    if (e.req->cancelled) {
      finish(e, nullptr, "cancelled");
      ++cancelled_;
      return;
    }
    opt::SeqId id = 0;
    try {
      opt::SequenceOptions so = c.opts;
      so.kv_cache = kv_cache_;
      if (c.speculative) so.speculation = spec_;
      id = batch_.add(c.prompt, so);
    } catch (const std::exception& ex) {  // validated before; should not happen
      fail(e, ex.what());
      return;
    }
    if (batch_.finished(id)) {  // max_new_tokens = 0
      finish(e, &id, "length");
      batch_.release(id);
      return;
    }
    active_.emplace(id, e);
    active_count_ = active_.size();
  }

  void drop_cancelled() {
    for (auto it = active_.begin(); it != active_.end();) {
      if (it->second.req->cancelled) {
        batch_.stop(it->first);  // frees the KV cache now
        finish(it->second, nullptr, "cancelled");
        batch_.release(it->first);
        ++cancelled_;
        it = active_.erase(it);
      } else {
        ++it;
      }
    }
    active_count_ = active_.size();
    cache_bytes_ = batch_.cache_bytes();
  }

  void step() {
    // each new token as the batch accepts it (a speculating sequence may get several in a step): to its stream;
    // false stops the sequence there (a stop string)
    std::vector<std::pair<opt::SeqId, std::string>> done;  // finished this step, with their finish reason
    auto on_token = [&](const opt::StepToken& st) {
      Entry& e = active_.at(st.seq);
      Choice& c = e.req->choices[e.choice];
      ++generated_;
      std::string piece = c.stream->push(st.token);
      bool finished = st.finished, more = true;
      std::string reason = st.reason == opt::FinishReason::length ? "length" : "stop";
      if (!finished && c.stream->stopped()) {  // a stop string: the text ends before it
        more = false;
        finished = true;
        reason = "stop";
      }
      if (finished) piece += c.stream->finish();
      {
        std::lock_guard<std::mutex> lk(e.req->m);
        if (!piece.empty()) c.out.push_back(piece);
        c.completion += piece;
        ++c.completion_tokens;
      }
      if (finished) done.emplace_back(st.seq, reason);
      else if (!piece.empty()) e.req->cv.notify_all();
      return more;
    };
    try {
      batch_.step(on_token);
    } catch (const std::exception& ex) {
      std::fprintf(stderr, "opt-serve: step failed: %s\n", ex.what());
      for (auto& [id, e] : active_) {
        fail(e, std::string("internal error: ") + ex.what());
        batch_.release(id);
      }
      active_.clear();
      active_count_ = 0;
      return;
    }
    ++steps_;
    for (auto& [id, reason] : done) {
      finish(active_.at(id), &id, reason);
      batch_.release(id);
      active_.erase(id);
    }
    active_count_ = active_.size();
    cache_bytes_ = batch_.cache_bytes();
    proposed_ = size_t(spec_stats_.proposed);
    accepted_ = size_t(spec_stats_.accepted);
    passes_ = size_t(spec_stats_.passes);
  }

  // Marks a choice done; `id` (when given) is its sequence in the batch, for its tokens.
  void finish(const Entry& e, const opt::SeqId* id, const std::string& reason) {
    Choice& c = e.req->choices[e.choice];
    {
      std::lock_guard<std::mutex> lk(e.req->m);
      c.done = true;
      c.finish_reason = reason;
      c.tokens = id ? batch_.tokens(*id) : c.prompt;
      --e.req->remaining;
    }
    if (reason != "cancelled") ++completed_;
    e.req->cv.notify_all();
  }

  void fail(const Entry& e, const std::string& why) {
    {
      std::lock_guard<std::mutex> lk(e.req->m);
      if (e.req->failure.empty()) e.req->failure = why;
    }
    finish(e, nullptr, "error");
  }

  opt::Tokenizer tok_;
  const ServerOptions& opts_;
  opt::DecodeOptions dopts_;
  opt::Batch batch_;  // the scheduler thread's alone
  opt::dtype kv_cache_;  // every sequence's KV cache element type
  std::shared_ptr<const opt::Speculation> spec_;  // null: plain decoding
  opt::SpeculativeStats spec_stats_;              // the scheduler thread's; copied to the atomics after each step
  std::string drafter_name_;
  std::map<opt::SeqId, Entry> active_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Entry> pending_;
  bool stopping_ = false;
  std::thread thread_;

  std::atomic<size_t> active_count_{0}, queued_{0}, completed_{0}, cancelled_{0}, steps_{0}, generated_{0},
      cache_bytes_{0}, proposed_{0}, accepted_{0}, passes_{0};
};

// ---- the server: model, tokenizer, scheduler, request parser -------------------------------------------------

struct Server {
  ServerOptions o;
  opt::Model model;
  opt::Tokenizer tok;
  std::unique_ptr<Scheduler> sched;
  std::unique_ptr<RequestParser> parser;  // request bodies -> sequences (opt_serve_request.hpp)
  int64_t context() const { return model.config().max_position_embeddings; }
};

// Runs a request: queue it, or throw 429 when the queue is full.
std::shared_ptr<Request> submit(Server& s, std::shared_ptr<Request> r) {
  if (s.sched->stopping()) throw ApiError{503, "the server is shutting down", "server_error", "", "shutting_down"};
  if (r->choices.size() > s.o.max_batch + s.o.max_queue)
    throw bad_request("the request has " + std::to_string(r->choices.size()) + " prompts; this server holds at most " +
                          std::to_string(s.o.max_batch + s.o.max_queue) + " sequences (--max-batch + --max-queue)",
                      "prompt");
  if (!s.sched->submit(r))
    throw ApiError{429,
                   "the server is busy: " + std::to_string(s.o.max_queue) +
                       " sequences are already waiting; retry later",
                   "rate_limit_error", "", "queue_full"};
  return r;
}

// Waits until every choice is done (non-streaming requests).
void wait_all(Server& s, Request& r) {
  std::unique_lock<std::mutex> lk(r.m);
  r.cv.wait(lk, [&] { return r.remaining == 0; });
  (void)s;
  if (!r.failure.empty()) throw ApiError{503, r.failure, "server_error", "", "unavailable"};
}

// ---- POST /generate: the seed's contract ------------------------------------------------------------------------

void handle_generate(Server& s, const httplib::Request& http, httplib::Response& res) {
  auto r = s.parser->parse_generate(http.body);
  submit(s, r);
  wait_all(s, *r);
  // exactly batch_decode(sequences, skip_special_tokens=True); ids the tokenizer lacks decode to nothing
  json texts = json::array();
  for (Choice& c : r->choices) {
    std::vector<int32_t> known;
    for (int32_t id : c.tokens)
      if (id >= 0 && size_t(id) < s.tok.vocab_size()) known.push_back(id);
    texts.push_back(s.tok.decode(known, s.sched->decode_options()));
  }
  res.set_content(json{{"texts", texts}}.dump(), "application/json");
}

// ---- POST /v1/completions -------------------------------------------------------------------------------------

json usage_of(const Request& r) {
  size_t p = 0, c = 0;
  for (const Choice& ch : r.choices) {
    p += ch.prompt.size();
    c += ch.completion_tokens;
  }
  return {{"prompt_tokens", p}, {"completion_tokens", c}, {"total_tokens", p + c}};
}

json chunk_json(const Server& s, const CompletionRequest& cr, json choices) {
  return {{"id", cr.id},        {"object", "text_completion"}, {"created", cr.created},
          {"model", s.o.model_name}, {"choices", std::move(choices)}};
}

void handle_completions(Server& s, const httplib::Request& http, httplib::Response& res) {
  auto cr = std::make_shared<CompletionRequest>(s.parser->parse_completion(http.body));
  submit(s, cr->req);

  if (!cr->stream) {
    wait_all(s, *cr->req);
    json choices = json::array();
    for (size_t i = 0; i < cr->req->choices.size(); ++i) {
      const Choice& c = cr->req->choices[i];
      choices.push_back({{"text", cr->echo[i] + c.completion},
                         {"index", i},
                         {"logprobs", nullptr},
                         {"finish_reason", c.finish_reason}});
    }
    json body = chunk_json(s, *cr, std::move(choices));
    body["usage"] = usage_of(*cr->req);
    res.set_content(body.dump(), "application/json");
    return;
  }

  // Streaming: one event per piece of text; a choice's last event carries its finish_reason.
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  auto sent_done = std::make_shared<std::vector<bool>>(cr->req->choices.size(), false);
  auto echoed = std::make_shared<bool>(false);
  Scheduler* sched = s.sched.get();
  res.set_chunked_content_provider(
      "text/event-stream",
      [&s, cr, sent_done, echoed](size_t, httplib::DataSink& sink) {
        Request& r = *cr->req;
        auto write = [&](const std::string& event) { return sink.write(event.data(), event.size()); };
        auto event = [&](size_t i, const std::string& text, const json& finish) {
          json ch = json::array({{{"text", text}, {"index", i}, {"logprobs", nullptr}, {"finish_reason", finish}}});
          return "data: " + chunk_json(s, *cr, std::move(ch)).dump() + "\n\n";
        };
        if (!*echoed) {
          *echoed = true;
          for (size_t i = 0; i < cr->echo.size(); ++i)
            if (!cr->echo[i].empty() && !write(event(i, cr->echo[i], nullptr))) return false;
        }
        std::vector<std::string> events;
        bool all_done = false;
        std::string failure;
        {
          std::unique_lock<std::mutex> lk(r.m);
          auto ready = [&] {
            if (r.remaining == 0) return true;
            for (size_t i = 0; i < r.choices.size(); ++i)
              if (!r.choices[i].out.empty() || (r.choices[i].done && !(*sent_done)[i])) return true;
            return false;
          };
          if (!r.cv.wait_for(lk, std::chrono::seconds(1), ready)) {
            lk.unlock();
            return write(": waiting\n\n");  // an SSE comment: finds a client that went away while queued
          }
          for (size_t i = 0; i < r.choices.size(); ++i) {
            Choice& c = r.choices[i];
            if ((*sent_done)[i]) continue;
            // one event per piece, as OpenAI sends one per token; the last one of a finished choice carries its
            // finish_reason (an empty text when the last token added none)
            const bool last = c.done;
            if (last && c.out.empty()) c.out.emplace_back();
            for (size_t k = 0; k < c.out.size(); ++k) {
              const bool fin = last && k + 1 == c.out.size();
              events.push_back(event(i, c.out[k], fin && c.finish_reason != "error" ? json(c.finish_reason) : json(nullptr)));
            }
            if (last) (*sent_done)[i] = true;
            c.out.clear();
          }
          all_done = r.remaining == 0;
          failure = r.failure;
        }
        for (auto& e : events)
          if (!write(e)) return false;
        if (all_done) {
          if (!failure.empty()) {
            const std::string err = "data: " + error_body({503, failure, "server_error", "", "unavailable"}) + "\n\n";
            if (!write(err)) return false;
          } else if (cr->include_usage) {
            json last = chunk_json(s, *cr, json::array());
            last["usage"] = usage_of(r);
            if (!write("data: " + last.dump() + "\n\n")) return false;
          }
          if (!write("data: [DONE]\n\n")) return false;
          sink.done();
        }
        return true;
      },
      [cr, sched](bool success) {
        // the client went away (or the connection failed): the scheduler stops its sequences at the next step
        if (!success) {
          cr->req->cancelled = true;
          sched->wake();
        }
      });
}

// ---- the rest ----------------------------------------------------------------------------------------------------

void handle_models(Server& s, httplib::Response& res) {
  json m = {{"id", s.o.model_name},
            {"object", "model"},
            {"created", 0},
            {"owned_by", "opt"},
            {"max_model_len", s.context()}};
  res.set_content(json{{"object", "list"}, {"data", json::array({m})}}.dump(), "application/json");
}

void handle_health(Server& s, httplib::Response& res) {
  json h = s.sched->stats();
  h["status"] = s.sched->stopping() ? "stopping" : "ok";
  h["model"] = s.o.model_name;
  h["context"] = s.context();
  if (json sp = s.sched->speculation_stats(); !sp.is_null()) h["speculative"] = sp;
  res.set_content(h.dump(), "application/json");
}

// Runs a handler, turning ApiError (and anything else) into a JSON error response.
template <class F>
httplib::Server::Handler guarded(F f) {
  return [f](const httplib::Request& req, httplib::Response& res) {
    try {
      f(req, res);
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const opt::input_error& e) {
      send_error(res, bad_request(e.what()));
    } catch (const opt::tokenizer_error& e) {
      send_error(res, bad_request(e.what()));
    } catch (const std::exception& e) {
      send_error(res, {500, std::string("internal error: ") + e.what(), "server_error", "", ""});
    }
  };
}

}  // namespace

int main(int argc, char** argv) {
  ServerOptions o;
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
  app.add_option("--http-threads", o.http_threads, "HTTP worker threads (0: max-batch + max-queue + 8)")
      ->capture_default_str();
  app.add_option("--max-body-bytes", o.max_body_bytes, "largest request body; beyond that: 413")
      ->capture_default_str()->check(CLI::Range(size_t(1), size_t(1) << 30));
  app.add_option("--max-tokens-limit", o.max_tokens_limit, "largest max_tokens a request may ask (0: the context)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--max-prompts", o.max_prompts, "prompts per request")->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--timeout", o.timeout_s, "socket read/write timeout, seconds")->capture_default_str()
      ->check(CLI::Range(1, 3600));
  app.add_option("--step-delay-ms", o.step_delay_ms, "sleep after each step (tests and demos)")
      ->capture_default_str()->check(CLI::Range(0, 10000));
  app.add_option("--kv-cache", o.kv_cache, "KV cache elements: f32 (exact), f16 or bf16 (half the memory)")
      ->capture_default_str()->check(kv_cache_validator());
  add_speculation_options(app, o.spec);
  CLI11_PARSE(app, argc, argv);

  // SIGINT/SIGTERM are taken by one thread with sigwait; every other thread blocks them. SIGPIPE: a client that
  // went away makes writes fail instead of killing the process.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::unique_ptr<Server> s;
  std::shared_ptr<opt::Drafter> drafter;
  std::string drafter_name;
  try {
    namespace fs = std::filesystem;
    const fs::path tdir = o.tokenizer_dir.empty() ? fs::path(o.model_dir) : fs::path(o.tokenizer_dir);
    if (o.model_name.empty()) o.model_name = fs::path(o.model_dir).lexically_normal().filename().string();
    if (o.model_name.empty()) o.model_name = fs::path(o.model_dir).lexically_normal().parent_path().filename().string();
    auto t0 = Clock::now();
    s.reset(new Server{o, opt::Model::load(o.model_dir), opt::Tokenizer::from_dir(tdir), nullptr, nullptr});
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
    std::fprintf(stderr, "opt-serve: %s\n", e.what());
    return 1;
  }
  s->sched = std::make_unique<Scheduler>(s->model, s->tok, s->o, std::move(drafter), drafter_name);

  httplib::Server http;
  const size_t http_threads = o.http_threads ? o.http_threads : o.max_batch + o.max_queue + 8;
  http.new_task_queue = [http_threads] { return new httplib::ThreadPool(http_threads); };
  http.set_payload_max_length(o.max_body_bytes);
  http.set_read_timeout(o.timeout_s, 0);
  http.set_write_timeout(o.timeout_s, 0);
  http.set_keep_alive_timeout(2);
  // cpp-httplib 0.11 does not apply the payload limit to chunked bodies (it reads them whole, however long): a
  // request body needs a Content-Length, checked against --max-body-bytes before a byte of it is read.
  http.set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
    if (req.get_header_value("Transfer-Encoding").empty()) return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, {411, "a request body needs a Content-Length (no Transfer-Encoding)", "invalid_request_error", "",
                     "length_required"});
    res.set_header("Connection", "close");
    return httplib::Server::HandlerResponse::Handled;
  });
  http.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;  // our own JSON error
    const int st = res.status;
    std::string msg = st == 404   ? "no such endpoint"
                      : st == 413 ? "the request body is too large"
                      : st == 405 ? "method not allowed"
                                  : "HTTP status " + std::to_string(st);
    const std::string type = st >= 500 ? "server_error" : "invalid_request_error";
    res.set_content(error_body({st, msg, type, "", ""}), "application/json");
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, {500, "internal error: " + what, "server_error", "", ""});
  });

  Server& srv = *s;
  http.Post("/generate", guarded([&srv](const httplib::Request& q, httplib::Response& r) { handle_generate(srv, q, r); }));
  http.Post("/v1/completions",
            guarded([&srv](const httplib::Request& q, httplib::Response& r) { handle_completions(srv, q, r); }));
  http.Get("/v1/models", guarded([&srv](const httplib::Request&, httplib::Response& r) { handle_models(srv, r); }));
  http.Get("/health", guarded([&srv](const httplib::Request&, httplib::Response& r) { handle_health(srv, r); }));
  http.Get("/", [](const httplib::Request&, httplib::Response& r) {
    r.set_content(opt_serve::page_html, "text/html; charset=utf-8");
  });
  http.Get("/favicon.ico", [](const httplib::Request&, httplib::Response& r) { r.status = 204; });

  int port = o.port;
  if (port == 0) port = http.bind_to_any_port(o.host);
  else if (!http.bind_to_port(o.host, port)) port = -1;
  if (port < 0) {
    std::fprintf(stderr, "opt-serve: cannot listen on %s:%d\n", o.host.c_str(), o.port);
    return 1;
  }
  s->sched->start();

  std::thread signals([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    std::fprintf(stderr, "opt-serve: %s, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    srv.sched->shutdown();  // running and waiting requests end with an error; streams close
    http.stop();
  });
  std::printf("opt-serve: listening on http://%s:%d\n", o.host.c_str(), port);
  std::fflush(stdout);
  const bool ok = http.listen_after_bind();
  // listen can also end on its own (a socket error): let the signal thread finish
  if (signals.joinable()) {
    if (!srv.sched->stopping()) pthread_kill(signals.native_handle(), SIGTERM);
    signals.join();
  }
  std::fprintf(stderr, "opt-serve: stopped\n");
  return ok ? 0 : 1;
}
