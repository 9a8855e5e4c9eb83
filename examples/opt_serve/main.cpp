// opt-serve: an HTTP server for OPT models with continuous batching.
//
//   opt-serve -m MODEL_DIR [-t TOKENIZER_DIR] [--host 127.0.0.1] [--port 8080] [--max-batch 16] [--threads N]
//             [--max-queue 64] [--max-body-bytes 1048576] [--max-tokens-limit N] [--max-prompts 32]
//             [--kv-cache f32|f16|bf16]
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

#include "../kv_cache_option.hpp"
#include "options.hpp"
#include "page.hpp"
#include "request.hpp"
#include "scheduler.hpp"

namespace {

using json = nlohmann::json;
using namespace opt_serve;
using Clock = std::chrono::steady_clock;

// ---- errors -----------------------------------------------------------------------------------------------------

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.status == 429 || e.status == 503) res.set_header("Retry-After", "1");
  res.set_content(error_body(e), "application/json");
}

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
