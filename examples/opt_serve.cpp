// opt-serve: an HTTP server for OPT models with continuous batching.
//
//   opt-serve -m MODEL_DIR [-t TOKENIZER_DIR] [--host 127.0.0.1] [--port 8080] [--max-batch 16] [--threads N]
//             [--max-queue 64] [--max-body-bytes 1048576] [--max-tokens-limit N] [--max-prompts 32]
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
#include <opt/tokenizer.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "opt_serve_page.hpp"

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct ServerOptions {
  std::string model_dir, tokenizer_dir, host = "127.0.0.1", model_name;
  int port = 8080;
  size_t max_batch = 16, max_queue = 64, threads = 0, http_threads = 0, max_prompts = 32;
  size_t max_body_bytes = 1 << 20;
  int64_t max_tokens_limit = 0;  // 0: the model's context
  int timeout_s = 30;
  int step_delay_ms = 0;  // testing and demos: sleep after each step so streams can be watched
};

// ---- errors -----------------------------------------------------------------------------------------------------

// A request the server refuses, with its HTTP status and OpenAI-style type.
struct ApiError {
  int status;
  std::string message, type, param, code;
};

ApiError bad_request(std::string message, std::string param = "") {
  return {400, std::move(message), "invalid_request_error", std::move(param), ""};
}

std::string error_body(const ApiError& e) {
  json err = {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}};
  return json{{"error", err}}.dump();
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.status == 429 || e.status == 503) res.set_header("Retry-After", "1");
  res.set_content(error_body(e), "application/json");
}

// ---- requests and the scheduler ------------------------------------------------------------------------------------

// One prompt of a request: what the scheduler runs, and what it hands back.
struct Choice {
  // set by the HTTP thread before submission, then read-only
  std::vector<int32_t> prompt;
  opt::SequenceOptions opts;
  std::vector<std::string> stop;
  // the scheduler's alone
  std::unique_ptr<opt::TextStream> stream;
  // guarded by Request::m
  std::vector<std::string> out;    // pieces of text (one per token that completed some) not yet streamed
  std::string completion;          // the whole completion so far
  std::vector<int32_t> tokens;     // prompt + new ids, when done
  size_t completion_tokens = 0;
  bool done = false;
  std::string finish_reason;       // "stop" or "length" (or "cancelled")
};

// One HTTP request: one or more choices, run as independent sequences.
struct Request {
  std::vector<Choice> choices;
  std::atomic<bool> cancelled{false};  // the client went away
  std::mutex m;
  std::condition_variable cv;
  size_t remaining = 0;  // choices not done (guarded by m)
  std::string failure;   // set when the server gave up on the request (shutdown, internal error)
};

class Scheduler {
 public:
  Scheduler(const opt::Model& model, const opt::Tokenizer& tok, const ServerOptions& o)
      : tok_(tok), opts_(o), batch_(model, o.threads) {
    dopts_.skip_special_tokens = true;
    dopts_.clean_up_tokenization_spaces = true;
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
      id = batch_.add(c.prompt, c.opts);
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
    std::vector<opt::SeqLogits> logits;
    try {
      logits = batch_.compute();
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
    for (const opt::SeqLogits& l : logits) {
      Entry& e = active_.at(l.seq);
      Choice& c = e.req->choices[e.choice];
      const opt::StepToken st = batch_.accept(l.seq, batch_.choose(l));
      ++generated_;
      std::string piece = c.stream->push(st.token);
      bool finished = st.finished;
      std::string reason = st.reason == opt::FinishReason::length ? "length" : "stop";
      if (!finished && c.stream->stopped()) {  // a stop string: the text ends before it
        batch_.stop(l.seq);
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
      if (finished) {
        finish(e, &l.seq, reason);
        batch_.release(l.seq);
        active_.erase(l.seq);
      } else if (!piece.empty()) {
        e.req->cv.notify_all();
      }
    }
    active_count_ = active_.size();
    cache_bytes_ = batch_.cache_bytes();
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
  std::map<opt::SeqId, Entry> active_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Entry> pending_;
  bool stopping_ = false;
  std::thread thread_;

  std::atomic<size_t> active_count_{0}, queued_{0}, completed_{0}, cancelled_{0}, steps_{0}, generated_{0},
      cache_bytes_{0};
};

// ---- request parsing ------------------------------------------------------------------------------------------

struct Server {
  ServerOptions o;
  opt::Model model;
  opt::Tokenizer tok;
  std::unique_ptr<Scheduler> sched;
  std::atomic<uint64_t> next_id{1};
  uint64_t seed_base = std::random_device{}();
  int64_t context() const { return model.config().max_position_embeddings; }
  int64_t max_tokens_limit() const {
    return o.max_tokens_limit > 0 ? std::min(o.max_tokens_limit, context()) : context();
  }
};

json parse_body(const httplib::Request& req) {
  if (req.body.empty()) throw bad_request("the request body is empty; expected a JSON object");
  json j = json::parse(req.body, nullptr, false);
  if (j.is_discarded()) throw bad_request("the request body is not valid JSON");
  if (!j.is_object()) throw bad_request("the request body must be a JSON object");
  return j;
}

// An integer field within [lo, hi]; `def` when absent or null.
int64_t get_int(const json& j, const char* key, int64_t def, int64_t lo, int64_t hi) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  double v = 0;
  if (it->is_number_integer()) {
    if (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(INT64_MAX)) v = 1e300;
    else v = double(it->get<int64_t>());
  } else if (it->is_number_float() && std::isfinite(it->get<double>()) &&
             it->get<double>() == std::floor(it->get<double>())) {
    v = it->get<double>();
  } else {
    throw bad_request(std::string("'") + key + "' must be an integer, got " + it->dump(), key);
  }
  if (v < double(lo) || v > double(hi))
    throw bad_request(std::string("'") + key + "' = " + it->dump() + " is out of range [" + std::to_string(lo) + ", " +
                          std::to_string(hi) + "]",
                      key);
  return int64_t(v);
}

double get_number(const json& j, const char* key, double def, double lo, double hi, bool lo_open = false) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_number()) throw bad_request(std::string("'") + key + "' must be a number, got " + it->dump(), key);
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi || (lo_open && v == lo))
    throw bad_request(std::string("'") + key + "' = " + it->dump() + " is out of range " + (lo_open ? "(" : "[") +
                          std::to_string(lo) + ", " + std::to_string(hi) + "]",
                      key);
  return v;
}

bool get_bool(const json& j, const char* key, bool def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_boolean()) throw bad_request(std::string("'") + key + "' must be true or false, got " + it->dump(), key);
  return it->get<bool>();
}

// Prompt ids from a text or from ids given by the client.
std::vector<int32_t> prompt_ids(const Server& s, const json& p, const char* param) {
  std::vector<int32_t> ids;
  if (p.is_string()) {
    ids = s.tok.encode(p.get<std::string>(), true);
  } else if (p.is_array()) {
    const int64_t V = s.model.config().vocab_size;
    for (const json& v : p) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= V)
        throw bad_request(std::string("'") + param + "': token ids must be integers in [0, " + std::to_string(V) +
                              "), got " + v.dump(),
                          param);
      ids.push_back(int32_t(v.get<int64_t>()));
    }
    if (ids.empty()) throw bad_request(std::string("'") + param + "': an empty list of token ids", param);
  } else {
    throw bad_request(std::string("'") + param + "' must be a string or a list of token ids, got " + p.dump(), param);
  }
  return ids;
}

// Checks prompt + max_tokens against the context and sets the choice's token budget. An explicit max_tokens
// that does not fit is an error; the default shrinks to what fits.
void fit_context(const Server& s, Choice& c, int64_t max_tokens, bool explicit_max, const char* param) {
  const int64_t ctx = s.context(), len = int64_t(c.prompt.size());
  if (len >= ctx)
    throw bad_request("this model's maximum context length is " + std::to_string(ctx) + " tokens; the prompt has " +
                          std::to_string(len) + " tokens (with BOS), which leaves no room to generate",
                      "prompt");
  if (len + max_tokens > ctx) {
    if (explicit_max)
      throw bad_request("this model's maximum context length is " + std::to_string(ctx) + " tokens; the prompt has " +
                            std::to_string(len) + " tokens (with BOS) and " + param + " is " +
                            std::to_string(max_tokens) + ", " + std::to_string(len + max_tokens) + " in all",
                        param);
    max_tokens = ctx - len;
  }
  c.opts.max_new_tokens = max_tokens;
}

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
  json j = parse_body(http);
  auto pit = j.find("prompts");
  if (pit == j.end() || !pit->is_array())
    throw bad_request("'prompts' must be a list of strings", "prompts");
  if (pit->empty()) throw bad_request("'prompts' is empty", "prompts");
  if (pit->size() > s.o.max_prompts)
    throw bad_request("'prompts' has " + std::to_string(pit->size()) + " prompts; at most " +
                          std::to_string(s.o.max_prompts) + " per request",
                      "prompts");
  const bool explicit_max = j.contains("max_new_tokens") && !j["max_new_tokens"].is_null();
  const int64_t max_new = get_int(j, "max_new_tokens", 50, 0, s.max_tokens_limit());
  auto r = std::make_shared<Request>();
  r->choices.resize(pit->size());
  for (size_t i = 0; i < pit->size(); ++i) {
    const json& p = (*pit)[i];
    if (!p.is_string()) throw bad_request("'prompts' must be a list of strings, got " + p.dump(), "prompts");
    Choice& c = r->choices[i];
    c.prompt = s.tok.encode(p.get<std::string>(), true);
    c.opts.stop_at_eos = true;  // greedy: default SamplingOptions
    fit_context(s, c, max_new, explicit_max, "max_new_tokens");
  }
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

struct CompletionRequest {
  std::shared_ptr<Request> req;
  std::vector<std::string> echo;  // per choice: the prompt text to prepend (echo = true)
  bool stream = false, include_usage = false;
  std::string id;
  int64_t created = 0;
};

CompletionRequest parse_completion(Server& s, const json& j) {
  CompletionRequest cr;
  if (auto it = j.find("model"); it != j.end() && !it->is_string() && !it->is_null())
    throw bad_request("'model' must be a string", "model");
  if (get_int(j, "n", 1, INT64_MIN, INT64_MAX) != 1)
    throw bad_request("only n = 1 is supported; send the prompt several times (with different seeds) instead", "n");
  if (get_int(j, "best_of", 1, INT64_MIN, INT64_MAX) != 1) throw bad_request("only best_of = 1 is supported", "best_of");
  if (auto it = j.find("logprobs"); it != j.end() && !it->is_null() && !(it->is_number() && it->get<double>() == 0))
    throw bad_request("logprobs are not supported", "logprobs");
  if (auto it = j.find("suffix"); it != j.end() && !it->is_null()) throw bad_request("suffix is not supported", "suffix");
  for (const char* k : {"presence_penalty", "frequency_penalty"})
    if (get_number(j, k, 0.0, -2.0, 2.0) != 0.0) throw bad_request(std::string(k) + " is not supported", k);
  if (auto it = j.find("logit_bias"); it != j.end() && !it->is_null() && !(it->is_object() && it->empty()))
    throw bad_request("logit_bias is not supported", "logit_bias");

  cr.stream = get_bool(j, "stream", false);
  if (auto it = j.find("stream_options"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) throw bad_request("'stream_options' must be an object", "stream_options");
    if (!cr.stream) throw bad_request("'stream_options' is only allowed with stream = true", "stream_options");
    cr.include_usage = get_bool(*it, "include_usage", false);
  }
  const bool echo = get_bool(j, "echo", false);

  opt::SequenceOptions so;
  so.stop_at_eos = true;
  const double temperature = get_number(j, "temperature", 1.0, 0.0, 2.0);
  so.sampling.temperature = float(temperature);
  so.sampling.do_sample = temperature > 0;
  so.sampling.top_p = float(get_number(j, "top_p", 1.0, 0.0, 1.0, true));
  so.sampling.top_k = get_int(j, "top_k", 0, 0, s.model.config().vocab_size);
  so.sampling.repetition_penalty = float(get_number(j, "repetition_penalty", 1.0, 0.0, 100.0, true));
  const bool has_seed = j.contains("seed") && !j["seed"].is_null();
  const int64_t seed = get_int(j, "seed", 0, INT64_MIN, INT64_MAX);
  try {
    so.sampling.validate();
  } catch (const opt::error& e) {
    throw bad_request(e.what());
  }

  std::vector<std::string> stop;
  if (auto it = j.find("stop"); it != j.end() && !it->is_null()) {
    if (it->is_string()) stop.push_back(it->get<std::string>());
    else if (it->is_array()) {
      if (it->size() > 4) throw bad_request("'stop' has " + std::to_string(it->size()) + " strings; at most 4", "stop");
      for (const json& v : *it) {
        if (!v.is_string()) throw bad_request("'stop' must be a string or a list of strings, got " + v.dump(), "stop");
        stop.push_back(v.get<std::string>());
      }
    } else {
      throw bad_request("'stop' must be a string or a list of strings, got " + it->dump(), "stop");
    }
    for (auto& st : stop)
      if (st.empty() || st.size() > 256) throw bad_request("stop strings must have 1 to 256 bytes", "stop");
  }

  // prompt: "text", ["text", ...], [ids], [[ids], ...]
  auto pit = j.find("prompt");
  if (pit == j.end() || pit->is_null()) throw bad_request("'prompt' is required", "prompt");
  std::vector<json> prompts;
  if (pit->is_string()) prompts.push_back(*pit);
  else if (pit->is_array()) {
    if (pit->empty()) throw bad_request("'prompt' is an empty list", "prompt");
    if ((*pit)[0].is_number()) prompts.push_back(*pit);  // one prompt as ids
    else
      for (const json& p : *pit) prompts.push_back(p);
  } else {
    throw bad_request("'prompt' must be a string, a list of strings, or token ids, got " + pit->dump(), "prompt");
  }
  if (prompts.size() > s.o.max_prompts)
    throw bad_request("'prompt' has " + std::to_string(prompts.size()) + " prompts; at most " +
                          std::to_string(s.o.max_prompts) + " per request",
                      "prompt");
  const bool explicit_max = j.contains("max_tokens") && !j["max_tokens"].is_null();
  const int64_t max_tokens = get_int(j, "max_tokens", 16, 0, s.max_tokens_limit());

  cr.req = std::make_shared<Request>();
  cr.req->choices.resize(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    Choice& c = cr.req->choices[i];
    c.prompt = prompt_ids(s, prompts[i], "prompt");
    c.opts = so;
    // each choice its own random stream: the seed, or a fresh one; a given seed gives the same text alone or
    // in any batch
    c.opts.sampling.seed = has_seed ? uint64_t(seed) + i : s.seed_base + s.next_id.fetch_add(1) * 0x9E3779B97F4A7C15ull;
    c.stop = stop;
    fit_context(s, c, max_tokens, explicit_max, "max_tokens");
    if (echo) {
      std::vector<int32_t> known;
      for (int32_t id : c.prompt)
        if (id >= 0 && size_t(id) < s.tok.vocab_size()) known.push_back(id);
      opt::DecodeOptions d;
      d.skip_special_tokens = true;
      d.clean_up_tokenization_spaces = false;
      cr.echo.push_back(prompts[i].is_string() ? prompts[i].get<std::string>() : s.tok.decode(known, d));
    } else {
      cr.echo.emplace_back();
    }
  }
  cr.id = "cmpl-" + std::to_string(s.seed_base % 1000000) + "-" + std::to_string(s.next_id.fetch_add(1));
  cr.created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
                   .count();
  return cr;
}

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
  const json j = parse_body(http);
  auto cr = std::make_shared<CompletionRequest>(parse_completion(s, j));
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
  app.add_option("-m,--model", o.model_dir, "model folder (config.json + safetensors)")->required();
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
  try {
    namespace fs = std::filesystem;
    const fs::path tdir = o.tokenizer_dir.empty() ? fs::path(o.model_dir) : fs::path(o.tokenizer_dir);
    if (o.model_name.empty()) o.model_name = fs::path(o.model_dir).lexically_normal().filename().string();
    if (o.model_name.empty()) o.model_name = fs::path(o.model_dir).lexically_normal().parent_path().filename().string();
    auto t0 = Clock::now();
    s.reset(new Server{o, opt::Model::load(o.model_dir), opt::Tokenizer::from_dir(tdir), nullptr});
    std::fprintf(stderr, "opt-serve: loaded %s in %.0f ms (context %lld, vocab %lld)\n", o.model_dir.c_str(),
                 std::chrono::duration<double, std::milli>(Clock::now() - t0).count(),
                 (long long)s->context(), (long long)s->model.config().vocab_size);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "opt-serve: %s\n", e.what());
    return 1;
  }
  s->sched = std::make_unique<Scheduler>(s->model, s->tok, s->o);

  httplib::Server http;
  const size_t http_threads = o.http_threads ? o.http_threads : o.max_batch + o.max_queue + 8;
  http.new_task_queue = [http_threads] { return new httplib::ThreadPool(http_threads); };
  http.set_payload_max_length(o.max_body_bytes);
  http.set_read_timeout(o.timeout_s, 0);
  http.set_write_timeout(o.timeout_s, 0);
  http.set_keep_alive_timeout(2);
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
