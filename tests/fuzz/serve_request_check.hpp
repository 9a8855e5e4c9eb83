// What opt-serve's request parsing promises for any body (examples/opt_serve/request.hpp), as one check shared by
// the fuzz target (fuzz_serve_request.cpp) and the unit test that replays its findings (test_serve_request.cpp).
//
// A body either parses into requests the scheduler can run as they are (1..max_prompts choices, ids in the
// vocabulary, prompt + max tokens within the context and the server's limit, valid sampling options, stop strings
// of 1..256 bytes, echo text that is valid UTF-8), or it throws what the server answers with 400: ApiError,
// opt::input_error or opt::tokenizer_error, whose JSON error body must serialize. Anything else is a server 500.
#pragma once
#include <string>

#include "../../examples/opt_serve/request.hpp"

namespace opt_fuzz {

// "" when `body` keeps the promise with both endpoints' parsers, else what broke it.
inline std::string check_serve_request(const opt_serve::RequestParser& p, const std::string& body) {
  const opt_serve::RequestRules& rules = p.rules();
  std::string broken;
  auto check_request = [&](const opt_serve::Request& r) {
    if (r.choices.empty() || r.choices.size() > rules.max_prompts) return "choices outside 1..max_prompts";
    for (const opt_serve::Choice& c : r.choices) {
      if (c.prompt.empty()) return "an empty prompt";
      for (int32_t id : c.prompt)
        if (id < 0 || id >= rules.vocab_size) return "a prompt id outside the vocabulary";
      const int64_t len = int64_t(c.prompt.size()), n = c.opts.max_new_tokens;
      if (n < 0 || n > rules.max_tokens_limit) return "max new tokens outside 0..max_tokens_limit";
      if (len + n > rules.context) return "prompt + max new tokens beyond the context";
      if (c.stop.size() > 4) return "more than 4 stop strings";
      for (const std::string& s : c.stop)
        if (s.empty() || s.size() > 256) return "a stop string outside 1..256 bytes";
      if (!c.opts.stop_at_eos) return "stop_at_eos off";
      if (c.logprobs < -1 || c.logprobs > 20) return "logprobs outside -1..20";
      if (c.echo_logprobs && c.logprobs < 0) return "echo logprobs without logprobs";
      c.opts.sampling.validate(rules.vocab_size);  // throws opt::input_error (a logit_bias id too): reported below
    }
    return "";
  };
  auto check_error = [&](const opt_serve::ApiError& e) -> std::string {
    if (e.status != 400 || e.message.empty()) return "an error that is not a 400 with a message";
    const nlohmann::json j = nlohmann::json::parse(opt_serve::error_body(e), nullptr, false);
    if (j.is_discarded() || !j.contains("error") || !j["error"]["message"].is_string())
      return "an error body that is not JSON";
    return "";
  };
  auto run = [&](const char* endpoint, auto parse) {
    std::string what;
    try {
      what = parse();
    } catch (const opt_serve::ApiError& e) {
      what = check_error(e);
    } catch (const opt::input_error& e) {
      what = check_error(opt_serve::bad_request(e.what()));
    } catch (const opt::tokenizer_error& e) {
      what = check_error(opt_serve::bad_request(e.what()));
    } catch (const std::exception& e) {
      what = std::string("an exception the server answers with 500: ") + e.what();
    }
    if (!what.empty() && broken.empty()) broken = std::string(endpoint) + ": " + what;
  };
  run("/generate", [&]() -> std::string { return check_request(*p.parse_generate(body)); });
  run("/v1/completions", [&]() -> std::string {
    const opt_serve::CompletionRequest cr = p.parse_completion(body);
    std::string what = check_request(*cr.req);
    if (!what.empty()) return what;
    if (cr.echo.size() != cr.req->choices.size()) return "echo texts do not match the choices";
    if (cr.include_usage && !cr.stream) return "include_usage without stream";
    // responses carry the echo text and the id: dump() throws on invalid UTF-8 (a 500)
    (void)nlohmann::json(cr.echo).dump();
    (void)nlohmann::json(cr.id).dump();
    return "";
  });
  return broken;
}

}  // namespace opt_fuzz
