// opt-serve's request parsing: a JSON body in, the sequences to run (or an ApiError) out. No HTTP here, so the
// same code runs in the server and under libFuzzer (tests/fuzz/fuzz_serve_request.cpp).
//
// The promise the fuzz target checks: for any body, parsing either returns requests whose every choice fits the
// model (ids in [0, vocab), prompt + max tokens <= context, 1..max_prompts choices), or throws ApiError (or
// opt::input_error / opt::tokenizer_error, which the server also answers with 400); and error_body() of any error
// is valid JSON.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <opt/generate.hpp>
#include <opt/logprobs.hpp>
#include <opt/tokenizer.hpp>
#include <string>
#include <vector>

namespace opt_serve {

using json = nlohmann::json;

// ---- errors -----------------------------------------------------------------------------------------------------

// A request the server refuses, with its HTTP status and OpenAI-style type.
struct ApiError {
  int status;
  std::string message, type, param, code;
};

inline ApiError bad_request(std::string message, std::string param = "") {
  return {400, std::move(message), "invalid_request_error", std::move(param), ""};
}

// {"error": {"message", "type", "param", "code"}}. Messages quote the client's JSON through dump(), so they are
// valid UTF-8; a message that is not (an exception's text) has its bad bytes replaced rather than failing.
inline std::string error_body(const ApiError& e) {
  json err = {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}};
  return json{{"error", err}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

// ---- requests ---------------------------------------------------------------------------------------------------

// A generated token's log-probabilities ("logprobs"), with the text it added and where that text starts.
struct TokenLogprobs {
  opt::PositionLogprobs lp;  // of the model's raw distribution (opt/logprobs.hpp)
  std::string piece;         // the text this token added to the completion (may be empty)
  size_t text_offset = 0;    // code points of the choice's text (echo included) before the piece
};

// One prompt of a request: what the scheduler runs, and what it hands back.
struct Choice {
  // set by the HTTP thread before submission, then read-only
  std::vector<int32_t> prompt;
  opt::SequenceOptions opts;
  std::vector<std::string> stop;
  bool speculative = true;  // "speculative": false opts out of the server's speculative decoding
  int64_t logprobs = -1;    // "logprobs": N, the N likeliest tokens at each position (-1: no logprobs)
  bool echo_logprobs = false;  // echo with logprobs: the prompt's log-probabilities too
  size_t echo_chars = 0;       // code points of the echoed prompt text (the generated tokens' text_offset base)
  // the scheduler's alone
  std::unique_ptr<opt::TextStream> stream;
  // guarded by Request::m
  std::vector<opt::PositionLogprobs> prompt_lp;  // echo_logprobs: prompt[i + 1] given the ones before (at admission)
  std::vector<TokenLogprobs> lp;   // logprobs >= 0: one per generated token (their text is here, not in `out`)
  size_t lp_sent = 0;              // entries of lp already streamed
  std::vector<std::string> out;    // pieces of text (one per token that completed some) not yet streamed
  std::string completion;          // the whole completion so far
  std::vector<int32_t> tokens;     // prompt + new ids, when done
  size_t completion_tokens = 0;
  std::chrono::steady_clock::time_point first_token_at;  // when its first token came (completion_tokens > 0)
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
  std::chrono::steady_clock::time_point arrived;  // set by the HTTP layer before submission
  std::function<void()> on_update;  // the HTTP layer's wake-up (guarded by m); called by notify()

  // Wakes whoever waits for this request's progress (new text, a choice done): the condition variable and the
  // hook. Called by the scheduler without holding m.
  void notify() {
    std::function<void()> hook;
    {
      std::lock_guard<std::mutex> lk(m);
      hook = on_update;
    }
    cv.notify_all();
    if (hook) hook();
  }
};

// A parsed POST /v1/completions.
struct CompletionRequest {
  std::shared_ptr<Request> req;
  std::vector<std::string> echo;  // per choice: the prompt text to prepend (echo = true)
  size_t n = 1;                   // choices per prompt: choice i is prompt i / n's
  bool stream = false, include_usage = false;
  std::string id;
  int64_t created = 0;
};

// What a request may ask of this server.
struct RequestRules {
  int64_t context = 0;           // the model's max_position_embeddings: prompt (with BOS) + new tokens
  int64_t vocab_size = 0;        // ids a client may send: [0, vocab_size)
  int64_t max_tokens_limit = 0;  // largest max_tokens / max_new_tokens (0: the context)
  size_t max_prompts = 32;       // prompts per request
};

// ---- field readers ----------------------------------------------------------------------------------------------

inline json parse_body(const std::string& body) {
  if (body.empty()) throw bad_request("the request body is empty; expected a JSON object");
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded()) throw bad_request("the request body is not valid JSON");
  if (!j.is_object()) throw bad_request("the request body must be a JSON object");
  return j;
}

// An integer field within [lo, hi]; `def` when absent or null. 3.0 counts as an integer.
inline int64_t get_int(const json& j, const char* key, int64_t def, int64_t lo, int64_t hi) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  auto out_of_range = [&] {
    return bad_request(std::string("'") + key + "' = " + it->dump() + " is out of range [" + std::to_string(lo) +
                           ", " + std::to_string(hi) + "]",
                       key);
  };
  if (it->is_number_unsigned()) {
    const uint64_t u = it->get<uint64_t>();
    if (u > uint64_t(INT64_MAX) || int64_t(u) < lo || int64_t(u) > hi) throw out_of_range();
    return int64_t(u);
  }
  if (it->is_number_integer()) {
    const int64_t v = it->get<int64_t>();
    if (v < lo || v > hi) throw out_of_range();
    return v;
  }
  if (it->is_number_float()) {
    const double d = it->get<double>();
    if (!std::isfinite(d) || d != std::floor(d))
      throw bad_request(std::string("'") + key + "' must be an integer, got " + it->dump(), key);
    // compare as doubles first: casting a double beyond int64 is undefined behaviour
    if (d < double(lo) || d > double(hi) || d >= 9223372036854775808.0 || d < -9223372036854775808.0)
      throw out_of_range();
    const int64_t v = int64_t(d);
    if (v < lo || v > hi) throw out_of_range();  // double(hi) may round up past hi
    return v;
  }
  throw bad_request(std::string("'") + key + "' must be an integer, got " + it->dump(), key);
}

inline double get_number(const json& j, const char* key, double def, double lo, double hi, bool lo_open = false) {
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

inline bool get_bool(const json& j, const char* key, bool def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_boolean()) throw bad_request(std::string("'") + key + "' must be true or false, got " + it->dump(), key);
  return it->get<bool>();
}

// Unicode code points in UTF-8 text (what Python's len() counts, the unit of OpenAI's text_offset): the bytes that
// are not continuation bytes.
inline size_t code_points(const std::string& s) {
  size_t n = 0;
  for (unsigned char ch : s) n += (ch & 0xC0) != 0x80;
  return n;
}

// ---- the parser -------------------------------------------------------------------------------------------------

// Turns request bodies into requests for one model and tokenizer. Thread-safe: HTTP threads share one.
class RequestParser {
 public:
  RequestParser(const opt::Tokenizer& tok, RequestRules rules, uint64_t seed_base)
      : tok_(tok), rules_(rules), seed_base_(seed_base) {
    if (rules_.context <= 0 || rules_.vocab_size <= 0 || rules_.max_prompts == 0)
      throw std::invalid_argument("RequestRules: context, vocab_size and max_prompts must be positive");
    if (rules_.max_tokens_limit <= 0 || rules_.max_tokens_limit > rules_.context)
      rules_.max_tokens_limit = rules_.context;
  }

  const RequestRules& rules() const { return rules_; }

  // POST /tokenize (llama.cpp's shape): {"prompt": "text", "add_special": true} -> {"tokens": [ids]}: the ids the
  // server runs for that prompt (BOS first; without it when add_special is false). "content" (llama.cpp's name)
  // is taken for "prompt".
  std::string tokenize(const std::string& body) const {
    const json j = parse_body(body);
    auto it = j.find("prompt");
    if (it == j.end()) it = j.find("content");
    if (it == j.end() || !it->is_string()) throw bad_request("'prompt' must be a string", "prompt");
    const bool special = get_bool(j, "add_special", true);
    return json{{"tokens", tok_.encode(it->get<std::string>(), special)}}.dump();
  }

  // POST /detokenize: {"tokens": [ids]} -> {"prompt": "text"}: special tokens skipped and spaces left as they are,
  // so that detokenize(tokenize(text)) is the text. Bytes that are not whole UTF-8 (ids cut inside a character)
  // come out as U+FFFD.
  std::string detokenize(const std::string& body) const {
    const json j = parse_body(body);
    auto it = j.find("tokens");
    if (it == j.end() || !it->is_array()) throw bad_request("'tokens' must be a list of token ids", "tokens");
    std::vector<int32_t> ids;
    for (const json& v : *it) {
      if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) ||
          v.get<int64_t>() < 0 || v.get<int64_t>() >= int64_t(tok_.vocab_size()))
        throw bad_request("'tokens': token ids must be integers in [0, " + std::to_string(tok_.vocab_size()) +
                              "), got " + v.dump(),
                          "tokens");
      ids.push_back(int32_t(v.get<int64_t>()));
    }
    opt::DecodeOptions d;
    d.skip_special_tokens = true;
    d.clean_up_tokenization_spaces = false;
    return json{{"prompt", tok_.decode(ids, d)}}.dump(-1, ' ', false, json::error_handler_t::replace);
  }

  // POST /generate: {"prompts": ["text", ...], "max_new_tokens": 50, "speculative": true}; greedy, stop at EOS.
  std::shared_ptr<Request> parse_generate(const std::string& body) const {
    const json j = parse_body(body);
    auto pit = j.find("prompts");
    if (pit == j.end() || !pit->is_array()) throw bad_request("'prompts' must be a list of strings", "prompts");
    if (pit->empty()) throw bad_request("'prompts' is empty", "prompts");
    if (pit->size() > rules_.max_prompts)
      throw bad_request("'prompts' has " + std::to_string(pit->size()) + " prompts; at most " +
                            std::to_string(rules_.max_prompts) + " per request",
                        "prompts");
    const bool explicit_max = j.contains("max_new_tokens") && !j["max_new_tokens"].is_null();
    // the default (50, as transformers' examples) is capped by the server's limit; an explicit value is checked
    const int64_t max_new = get_int(j, "max_new_tokens", std::min<int64_t>(50, rules_.max_tokens_limit), 0,
                                    rules_.max_tokens_limit);
    const bool speculative = get_bool(j, "speculative", true);
    auto r = std::make_shared<Request>();
    r->choices.resize(pit->size());
    for (size_t i = 0; i < pit->size(); ++i) {
      const json& p = (*pit)[i];
      if (!p.is_string()) throw bad_request("'prompts' must be a list of strings, got " + p.dump(), "prompts");
      Choice& c = r->choices[i];
      c.prompt = tok_.encode(p.get<std::string>(), true);
      c.opts.stop_at_eos = true;  // greedy: default SamplingOptions
      c.speculative = speculative;
      fit_context(c, max_new, explicit_max, "max_new_tokens");
    }
    return r;
  }

  // POST /v1/completions (OpenAI): prompt (string, list of strings, ids or lists of ids), max_tokens, temperature,
  // top_p, top_k, repetition_penalty, presence_penalty, frequency_penalty, logit_bias, stop, seed, echo, n,
  // logprobs, stream, stream_options; and "speculative" (false: no speculative decoding for this request).
  CompletionRequest parse_completion(const std::string& body) const {
    const json j = parse_body(body);
    CompletionRequest cr;
    if (auto it = j.find("model"); it != j.end() && !it->is_string() && !it->is_null())
      throw bad_request("'model' must be a string", "model");
    // n choices per prompt, each its own sequence; every choice counts against --max-prompts
    const size_t n = size_t(get_int(j, "n", 1, 1, int64_t(rules_.max_prompts)));
    if (get_int(j, "best_of", 1, INT64_MIN, INT64_MAX) != 1)
      throw bad_request("only best_of = 1 is supported", "best_of");
    // logprobs: N (0 .. 20), the N likeliest tokens at each position, as vLLM (OpenAI's legacy limit is 5)
    const int64_t logprobs = get_int(j, "logprobs", -1, 0, kMaxLogprobs);
    if (auto it = j.find("suffix"); it != j.end() && !it->is_null())
      throw bad_request("suffix is not supported", "suffix");

    cr.stream = get_bool(j, "stream", false);
    if (auto it = j.find("stream_options"); it != j.end() && !it->is_null()) {
      if (!it->is_object()) throw bad_request("'stream_options' must be an object", "stream_options");
      if (!cr.stream) throw bad_request("'stream_options' is only allowed with stream = true", "stream_options");
      cr.include_usage = get_bool(*it, "include_usage", false);
    }
    const bool echo = get_bool(j, "echo", false);
    const bool speculative = get_bool(j, "speculative", true);

    opt::SequenceOptions so;
    so.stop_at_eos = true;
    const double temperature = get_number(j, "temperature", 1.0, 0.0, 2.0);
    so.sampling.temperature = float(temperature);
    so.sampling.do_sample = temperature > 0;
    so.sampling.top_p = float(get_number(j, "top_p", 1.0, 0.0, 1.0, true));
    so.sampling.top_k = get_int(j, "top_k", 0, 0, rules_.vocab_size);
    so.sampling.repetition_penalty = float(get_number(j, "repetition_penalty", 1.0, 0.0, 100.0, true));
    so.sampling.presence_penalty = float(get_number(j, "presence_penalty", 0.0, -2.0, 2.0));
    so.sampling.frequency_penalty = float(get_number(j, "frequency_penalty", 0.0, -2.0, 2.0));
    so.sampling.logit_bias = logit_bias(j);
    const bool has_seed = j.contains("seed") && !j["seed"].is_null();
    const int64_t seed = get_int(j, "seed", 0, INT64_MIN, INT64_MAX);
    try {
      so.sampling.validate();
    } catch (const opt::error& e) {
      throw bad_request(e.what());
    }

    std::vector<std::string> stop;
    if (auto it = j.find("stop"); it != j.end() && !it->is_null()) {
      if (it->is_string()) {
        stop.push_back(it->get<std::string>());
      } else if (it->is_array()) {
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
    if (pit->is_string()) {
      prompts.push_back(*pit);
    } else if (pit->is_array()) {
      if (pit->empty()) throw bad_request("'prompt' is an empty list", "prompt");
      if ((*pit)[0].is_number()) {
        prompts.push_back(*pit);  // one prompt as ids
      } else {
        for (const json& p : *pit) prompts.push_back(p);
      }
    } else {
      throw bad_request("'prompt' must be a string, a list of strings, or token ids, got " + pit->dump(), "prompt");
    }
    if (prompts.size() > rules_.max_prompts)
      throw bad_request("'prompt' has " + std::to_string(prompts.size()) + " prompts; at most " +
                            std::to_string(rules_.max_prompts) + " per request",
                        "prompt");
    if (prompts.size() * n > rules_.max_prompts)
      throw bad_request(std::to_string(prompts.size()) + " prompts with n = " + std::to_string(n) + " make " +
                            std::to_string(prompts.size() * n) + " choices; at most " +
                            std::to_string(rules_.max_prompts) + " per request",
                        "n");
    const bool explicit_max = j.contains("max_tokens") && !j["max_tokens"].is_null();
    // the default (16, as OpenAI's) is capped by the server's limit; an explicit value is checked
    const int64_t max_tokens = get_int(j, "max_tokens", std::min<int64_t>(16, rules_.max_tokens_limit), 0,
                                       rules_.max_tokens_limit);

    // choice i is prompt i / n's (OpenAI's order); n = 1: one choice per prompt
    const size_t total = prompts.size() * n;
    cr.n = n;
    cr.req = std::make_shared<Request>();
    cr.req->choices.resize(total);
    const uint64_t first = next_id_.fetch_add(total + 1);
    for (size_t i = 0; i < total; ++i) {
      Choice& c = cr.req->choices[i];
      c.prompt = i % n == 0 ? prompt_ids(prompts[i / n], "prompt") : cr.req->choices[i - 1].prompt;
      c.opts = so;
      // each choice its own random stream: the seed + the choice's index, or a fresh one; a given seed gives the
      // same text alone or in any batch
      c.opts.sampling.seed = has_seed ? uint64_t(seed) + i : seed_base_ + (first + i) * 0x9E3779B97F4A7C15ull;
      c.stop = stop;
      c.speculative = speculative;
      c.logprobs = logprobs;
      c.echo_logprobs = echo && logprobs >= 0;
      fit_context(c, max_tokens, explicit_max, "max_tokens");
      if (echo) {
        std::vector<int32_t> known;
        for (int32_t id : c.prompt)
          if (id >= 0 && size_t(id) < tok_.vocab_size()) known.push_back(id);
        opt::DecodeOptions d;
        d.skip_special_tokens = true;
        d.clean_up_tokenization_spaces = false;
        const json& p = prompts[i / n];
        cr.echo.push_back(p.is_string() ? p.get<std::string>() : tok_.decode(known, d));
        c.echo_chars = code_points(cr.echo.back());
      } else {
        cr.echo.emplace_back();
      }
    }
    cr.id = "cmpl-" + std::to_string(seed_base_ % 1000000) + "-" + std::to_string(first + total);
    cr.created =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    return cr;
  }

 private:
  static constexpr int64_t kMaxLogprobs = 20;

  // "logit_bias": {"id": bias, ...}, ids in [0, vocab) as decimal strings, biases in [-100, 100] (OpenAI's).
  std::vector<std::pair<int32_t, float>> logit_bias(const json& j) const {
    std::vector<std::pair<int32_t, float>> out;
    auto it = j.find("logit_bias");
    if (it == j.end() || it->is_null()) return out;
    if (!it->is_object())
      throw bad_request("'logit_bias' must be an object of token ids to biases, got " + it->dump(), "logit_bias");
    for (auto& [key, v] : it->items()) {
      const bool digits = !key.empty() && key.size() <= 10 &&
                          std::all_of(key.begin(), key.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
      const int64_t id = digits ? std::stoll(key) : -1;
      if (id < 0 || id >= rules_.vocab_size)
        throw bad_request("'logit_bias': keys must be token ids in [0, " + std::to_string(rules_.vocab_size) +
                              "), got " + json(key).dump(),
                          "logit_bias");
      if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < -100 || v.get<double>() > 100)
        throw bad_request("'logit_bias': the bias of " + key + " must be a number in [-100, 100], got " + v.dump(),
                          "logit_bias");
      out.emplace_back(int32_t(id), float(v.get<double>()));
    }
    return out;
  }

  // Prompt ids from a text or from ids given by the client.
  std::vector<int32_t> prompt_ids(const json& p, const char* param) const {
    std::vector<int32_t> ids;
    if (p.is_string()) {
      ids = tok_.encode(p.get<std::string>(), true);
    } else if (p.is_array()) {
      if (p.size() > size_t(rules_.context))
        throw bad_request("this model's maximum context length is " + std::to_string(rules_.context) +
                              " tokens; the prompt has " + std::to_string(p.size()) + " token ids",
                          param);
      for (const json& v : p) {
        if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) ||
            v.get<int64_t>() < 0 || v.get<int64_t>() >= rules_.vocab_size)
          throw bad_request(std::string("'") + param + "': token ids must be integers in [0, " +
                                std::to_string(rules_.vocab_size) + "), got " + v.dump(),
                            param);
        ids.push_back(int32_t(v.get<int64_t>()));
      }
      if (ids.empty()) throw bad_request(std::string("'") + param + "': an empty list of token ids", param);
    } else {
      throw bad_request(std::string("'") + param + "' must be a string or a list of token ids, got " + p.dump(),
                        param);
    }
    return ids;
  }

  // Checks prompt + max_tokens against the context and sets the choice's token budget. An explicit max_tokens
  // that does not fit is an error; the default shrinks to what fits.
  void fit_context(Choice& c, int64_t max_tokens, bool explicit_max, const char* param) const {
    const int64_t ctx = rules_.context, len = int64_t(c.prompt.size());
    if (len >= ctx)
      throw bad_request("this model's maximum context length is " + std::to_string(ctx) +
                            " tokens; the prompt has " + std::to_string(len) +
                            " tokens (with BOS), which leaves no room to generate",
                        "prompt");
    if (len + max_tokens > ctx) {
      if (explicit_max)
        throw bad_request("this model's maximum context length is " + std::to_string(ctx) +
                              " tokens; the prompt has " + std::to_string(len) + " tokens (with BOS) and " + param +
                              " is " + std::to_string(max_tokens) + ", " + std::to_string(len + max_tokens) +
                              " in all",
                          param);
      max_tokens = ctx - len;
    }
    c.opts.max_new_tokens = max_tokens;
  }

  const opt::Tokenizer& tok_;
  RequestRules rules_;
  uint64_t seed_base_;
  mutable std::atomic<uint64_t> next_id_{1};
};

}  // namespace opt_serve
