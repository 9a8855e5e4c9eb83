// opt-serve's endpoints without HTTP: what each one answers, as a Reply (status, body, headers), and the events of
// a streamed completion. The HTTP layer (http.hpp) reads requests, routes them here and writes the replies.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <opt/model.hpp>
#include <opt/tokenizer.hpp>
#include <string>
#include <utility>
#include <vector>

#include "metrics.hpp"
#include "options.hpp"
#include "request.hpp"
#include "scheduler.hpp"

namespace opt_serve {

// ---- the server: model, tokenizer, scheduler, request parser -------------------------------------------------

struct Server {
  Server(ServerOptions opts, opt::Model m, opt::Tokenizer t)
      : o(std::move(opts)), model(std::move(m)), tok(std::move(t)) {}
  ServerOptions o;
  opt::Model model;
  opt::Tokenizer tok;
  std::unique_ptr<Scheduler> sched;
  std::unique_ptr<RequestParser> parser;  // request bodies -> sequences (request.hpp)
  Metrics metrics;
  std::string api_key;                   // empty: no key needed
  std::atomic<size_t> connections{0};    // open HTTP connections (http.hpp)
  int64_t context() const { return model.config().max_position_embeddings; }
};

// An answer: status, body, content type and extra headers.
struct Reply {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;
};

inline Reply json_reply(const json& j) { return {200, j.dump(), "application/json", {}}; }

inline Reply error_reply(const ApiError& e) {
  Reply r{e.status, error_body(e), "application/json", {}};
  if (e.status == 429 || e.status == 503) r.headers.emplace_back("Retry-After", "1");
  if (e.status == 401) r.headers.emplace_back("WWW-Authenticate", "Bearer");
  return r;
}

// Runs `f` (returning a Reply), turning ApiError (and anything else) into a JSON error reply.
template <class F>
Reply guarded(F&& f) {
  try {
    return f();
  } catch (const ApiError& e) {
    return error_reply(e);
  } catch (const opt::input_error& e) {
    return error_reply(bad_request(e.what()));
  } catch (const opt::tokenizer_error& e) {
    return error_reply(bad_request(e.what()));
  } catch (const std::exception& e) {
    return error_reply({500, std::string("internal error: ") + e.what(), "server_error", "", ""});
  }
}

// Runs a request: queue it, or throw 429 when the queue is full.
inline std::shared_ptr<Request> submit(Server& s, std::shared_ptr<Request> r) {
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
  uint64_t n = 0;
  for (const Choice& c : r->choices) n += c.prompt.size();
  s.metrics.count_prompt_tokens(n);
  return r;
}

// A request whose choices are all done: its failure as a 503, if the server gave up on it.
inline void check_done(const Request& r) {
  if (!r.failure.empty()) throw ApiError{503, r.failure, "server_error", "", "unavailable"};
}

// The time to first token of each choice that got one, from the request's arrival; done requests only.
inline void observe_first_tokens(Server& s, Request& r) {
  std::lock_guard<std::mutex> lk(r.m);
  for (const Choice& c : r.choices)
    if (c.completion_tokens > 0)
      s.metrics.ttft_seconds.observe(std::chrono::duration<double>(c.first_token_at - r.arrived).count());
}

// ---- POST /generate: the seed's contract ------------------------------------------------------------------------

inline Reply generate_reply(Server& s, Request& r) {
  check_done(r);
  // exactly batch_decode(sequences, skip_special_tokens=True); ids the tokenizer lacks decode to nothing
  json texts = json::array();
  for (Choice& c : r.choices) {
    std::vector<int32_t> known;
    for (int32_t id : c.tokens)
      if (id >= 0 && size_t(id) < s.tok.vocab_size()) known.push_back(id);
    texts.push_back(s.tok.decode(known, s.sched->decode_options()));
  }
  return json_reply(json{{"texts", texts}});
}

// ---- POST /v1/completions -------------------------------------------------------------------------------------

inline json usage_of(const Request& r) {
  size_t p = 0, c = 0;
  for (const Choice& ch : r.choices) {
    p += ch.prompt.size();
    c += ch.completion_tokens;
  }
  return {{"prompt_tokens", p}, {"completion_tokens", c}, {"total_tokens", p + c}};
}

inline json chunk_json(const Server& s, const CompletionRequest& cr, json choices) {
  return {{"id", cr.id},        {"object", "text_completion"}, {"created", cr.created},
          {"model", s.o.model_name}, {"choices", std::move(choices)}};
}

inline Reply completion_reply(Server& s, CompletionRequest& cr) {
  check_done(*cr.req);
  json choices = json::array();
  for (size_t i = 0; i < cr.req->choices.size(); ++i) {
    const Choice& c = cr.req->choices[i];
    choices.push_back({{"text", cr.echo[i] + c.completion},
                       {"index", i},
                       {"logprobs", nullptr},
                       {"finish_reason", c.finish_reason}});
  }
  json body = chunk_json(s, cr, std::move(choices));
  body["usage"] = usage_of(*cr.req);
  return json_reply(body);
}

// Where a streamed completion is: echo sent, which choices sent their last event.
struct StreamState {
  bool echoed = false;
  std::vector<bool> sent_done;
};

// Appends to `out` the server-sent events ready now: one event per piece of text, as OpenAI sends one per token; a
// choice's last event carries its finish_reason (an empty text when the last token added none). Returns true when
// the stream is over ("data: [DONE]" appended).
inline bool stream_events(const Server& s, CompletionRequest& cr, StreamState& st, std::string& out) {
  Request& r = *cr.req;
  auto event = [&](size_t i, const std::string& text, const json& finish) {
    json ch = json::array({{{"text", text}, {"index", i}, {"logprobs", nullptr}, {"finish_reason", finish}}});
    return "data: " + chunk_json(s, cr, std::move(ch)).dump() + "\n\n";
  };
  if (st.sent_done.size() != r.choices.size()) st.sent_done.assign(r.choices.size(), false);
  if (!st.echoed) {
    st.echoed = true;
    for (size_t i = 0; i < cr.echo.size(); ++i)
      if (!cr.echo[i].empty()) out += event(i, cr.echo[i], nullptr);
  }
  bool all_done = false;
  std::string failure;
  {
    std::lock_guard<std::mutex> lk(r.m);
    for (size_t i = 0; i < r.choices.size(); ++i) {
      Choice& c = r.choices[i];
      if (st.sent_done[i]) continue;
      const bool last = c.done;
      if (last && c.out.empty()) c.out.emplace_back();
      for (size_t k = 0; k < c.out.size(); ++k) {
        const bool fin = last && k + 1 == c.out.size();
        out += event(i, c.out[k], fin && c.finish_reason != "error" ? json(c.finish_reason) : json(nullptr));
      }
      if (last) st.sent_done[i] = true;
      c.out.clear();
    }
    all_done = r.remaining == 0;
    failure = r.failure;
  }
  if (!all_done) return false;
  if (!failure.empty()) {
    out += "data: " + error_body({503, failure, "server_error", "", "unavailable"}) + "\n\n";
  } else if (cr.include_usage) {
    json last = chunk_json(s, cr, json::array());
    last["usage"] = usage_of(r);
    out += "data: " + last.dump() + "\n\n";
  }
  out += "data: [DONE]\n\n";
  return true;
}

// ---- the rest ----------------------------------------------------------------------------------------------------

inline Reply models_reply(const Server& s) {
  json m = {{"id", s.o.model_name},
            {"object", "model"},
            {"created", 0},
            {"owned_by", "opt"},
            {"max_model_len", s.context()}};
  return json_reply(json{{"object", "list"}, {"data", json::array({m})}});
}

inline Reply health_reply(const Server& s) {
  json h = s.sched->stats();
  h["status"] = s.sched->stopping() ? "stopping" : "ok";
  h["model"] = s.o.model_name;
  h["context"] = s.context();
  if (json sp = s.sched->speculation_stats(); !sp.is_null()) h["speculative"] = sp;
  if (json pc = s.sched->prefix_cache_stats(); !pc.is_null()) h["prefix_cache"] = pc;
  return json_reply(h);
}

// GET /metrics: the Prometheus text format.
inline Reply metrics_reply(const Server& s) {
  const json st = s.sched->stats();
  std::string out;
  s.metrics.write_counters(out);
  write_metric(out, "opt_serve_generated_tokens_total", "counter", "tokens generated",
               st["generated_tokens"].get<double>());
  write_metric(out, "opt_serve_steps_total", "counter", "steps of the batch", st["steps"].get<double>());
  write_metric(out, "opt_serve_sequences_completed_total", "counter", "sequences that ran to their end",
               st["completed"].get<double>());
  write_metric(out, "opt_serve_sequences_cancelled_total", "counter", "sequences dropped because their client left",
               st["cancelled"].get<double>());
  write_metric(out, "opt_serve_queue_depth", "gauge", "sequences waiting for a slot", st["queued"].get<double>());
  write_metric(out, "opt_serve_running_sequences", "gauge", "sequences in the batch", st["active"].get<double>());
  write_metric(out, "opt_serve_max_batch", "gauge", "--max-batch", st["max_batch"].get<double>());
  write_metric(out, "opt_serve_kv_cache_bytes", "gauge", "bytes of the running sequences' KV caches",
               st["kv_cache_bytes"].get<double>());
  write_metric(out, "opt_serve_connections", "gauge", "open HTTP connections", double(s.connections.load()));
  if (const json sp = s.sched->speculation_stats(); !sp.is_null()) {
    write_metric(out, "opt_serve_draft_tokens_proposed_total", "counter", "tokens the drafter proposed",
                 sp["proposed"].get<double>());
    write_metric(out, "opt_serve_draft_tokens_accepted_total", "counter", "proposed tokens the model kept",
                 sp["accepted"].get<double>());
    write_metric(out, "opt_serve_speculative_passes_total", "counter", "verification passes with proposals",
                 sp["passes"].get<double>());
  }
  if (const json pc = s.sched->prefix_cache_stats(); !pc.is_null()) {
    write_metric(out, "opt_serve_prefix_cache_hits_total", "counter", "sequences that started from a cached prefix",
                 pc["hits"].get<double>());
    write_metric(out, "opt_serve_prefix_cache_misses_total", "counter", "sequences that found no cached prefix",
                 pc["misses"].get<double>());
    write_metric(out, "opt_serve_prefix_cache_hit_tokens_total", "counter", "prompt tokens taken from the cache",
                 pc["hit_tokens"].get<double>());
    write_metric(out, "opt_serve_prefix_cache_evictions_total", "counter", "cached blocks evicted for room",
                 pc["evictions"].get<double>());
    write_metric(out, "opt_serve_prefix_cache_bytes", "gauge", "bytes of KV the prefix cache holds",
                 pc["bytes"].get<double>());
  }
  s.sched->step_seconds().write(out, "opt_serve_step_seconds", "time of one step of the batch");
  s.metrics.ttft_seconds.write(out, "opt_serve_time_to_first_token_seconds",
                               "a sequence's first token, from its request's arrival");
  s.metrics.latency_seconds.write(out, "opt_serve_request_latency_seconds",
                                  "a generation request answered, from its arrival to its last byte");
  return {200, std::move(out), "text/plain; version=0.0.4; charset=utf-8", {}};
}

}  // namespace opt_serve
