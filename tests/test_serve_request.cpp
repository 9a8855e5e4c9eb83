// opt-serve's request parsing (examples/opt_serve/request.hpp), without HTTP: limits, defaults, errors, and the
// replay of every input the fuzz target (tests/fuzz/fuzz_serve_request.cpp) ever found.
#include <opt/tokenizer.hpp>

#include "fuzz/serve_request_check.hpp"
#include "shared.hpp"

namespace {

using opt_serve::ApiError;
using opt_serve::RequestParser;
using opt_serve::RequestRules;

const opt::Tokenizer& tokenizer() {
  static const opt::Tokenizer tok = opt::Tokenizer::from_files(opt_test::shared_dir() / "tokenizer" / "vocab.json",
                                                              opt_test::shared_dir() / "tokenizer" / "merges.txt");
  return tok;
}

// The ApiError a body gives, or a failed check.
template <class F>
ApiError error_of(F parse) {
  try {
    parse();
  } catch (const ApiError& e) {
    return e;
  }
  FAIL("no ApiError");
  return {};
}

}  // namespace

TEST_CASE("the fuzz target's findings keep the parsing promise") {
  const RequestParser p(tokenizer(), RequestRules{64, 50272, 48, 4}, 12345);  // as in fuzz_serve_request.cpp
  const auto dir = std::filesystem::path(OPT_SOURCE_DIR) / "tests" / "fuzz" / "regressions" / "serve_request";
  REQUIRE(std::filesystem::is_directory(dir));
  size_t n = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    INFO(f.path().string());
    CHECK(opt_fuzz::check_serve_request(p, opt_test::read_text(f.path())) == "");
    ++n;
  }
  CHECK(n > 0);
}

TEST_CASE("default token budgets respect the server's limit and the context") {
  const RequestParser p(tokenizer(), RequestRules{64, 50272, 10, 4}, 1);
  // regression (fuzz_serve_request): the defaults 50 and 16 went past --max-tokens-limit
  CHECK(p.parse_generate(R"({"prompts": ["a"]})")->choices[0].opts.max_new_tokens == 10);
  const RequestParser q(tokenizer(), RequestRules{64, 50272, 5, 4}, 1);
  CHECK(q.parse_completion(R"({"prompt": "a"})").req->choices[0].opts.max_new_tokens == 5);
  // without a limit: 50 and 16, shrunk to what the context leaves
  const RequestParser r(tokenizer(), RequestRules{64, 50272, 0, 4}, 1);
  CHECK(r.rules().max_tokens_limit == 64);
  auto g = r.parse_generate(R"({"prompts": ["Hello"]})");  // </s> Hello: 2 tokens
  CHECK(g->choices[0].prompt == std::vector<int32_t>{2, 31414});
  CHECK(g->choices[0].opts.max_new_tokens == 50);
  CHECK(r.parse_completion(R"({"prompt": "Hello"})").req->choices[0].opts.max_new_tokens == 16);
  std::string ids = "[2";
  for (int i = 0; i < 59; ++i) ids += ",100";
  ids += "]";  // 60 tokens: 4 left
  CHECK(r.parse_completion(R"({"prompt": )" + ids + "}").req->choices[0].opts.max_new_tokens == 4);
  // an explicit budget that does not fit is an error
  const ApiError e = error_of([&] { r.parse_completion(R"({"max_tokens": 5, "prompt": )" + ids + "}"); });
  CHECK(e.status == 400);
  CHECK(e.param == "max_tokens");
  CHECK(e.message.find("maximum context length is 64") != std::string::npos);
  CHECK(error_of([&] { p.parse_generate(R"({"prompts": ["a"], "max_new_tokens": 11})"); }).param == "max_new_tokens");
}

TEST_CASE("bad fields name themselves") {
  const RequestParser p(tokenizer(), RequestRules{64, 50272, 48, 4}, 1);
  CHECK(error_of([&] { p.parse_completion(""); }).message.find("empty") != std::string::npos);
  CHECK(error_of([&] { p.parse_completion("[1]"); }).message.find("JSON object") != std::string::npos);
  CHECK(error_of([&] { p.parse_completion("{"); }).message.find("not valid JSON") != std::string::npos);
  CHECK(error_of([&] { p.parse_completion(R"({"prompt": [2, 50272]})"); }).message.find("[0, 50272)") !=
        std::string::npos);
  CHECK(error_of([&] { p.parse_completion(R"({"prompt": [2, 18446744073709551615]})"); }).param == "prompt");
  CHECK(error_of([&] { p.parse_completion(R"({"prompt": ["a","b","c","d","e"]})"); }).message.find("at most 4") !=
        std::string::npos);
  CHECK(error_of([&] { p.parse_completion(R"({"prompt": "a", "top_p": 0})"); }).param == "top_p");
  CHECK(error_of([&] { p.parse_completion(R"({"prompt": "a", "stop": ["a","b","c","d","e"]})"); }).param == "stop");
  CHECK(error_of([&] { p.parse_completion(R"({"prompt": "a", "stop": ""})"); }).param == "stop");
  CHECK(error_of([&] { p.parse_completion(R"({"prompt": "a", "n": 0})"); }).param == "n");
  CHECK(error_of([&] { p.parse_completion(R"({"prompt": ["a", "b"], "n": 3})"); }).param == "n");  // 6 > 4
  CHECK(error_of([&] { p.parse_completion(R"({"prompt": "a", "max_tokens": 2.5})"); }).param == "max_tokens");
  CHECK(error_of([&] { p.parse_completion(R"({"prompt": "a", "stream_options": {}})"); }).param == "stream_options");
  // integers as doubles: 3.0 is 3; 2^63 and beyond are out of range (casting them would be undefined behaviour)
  CHECK(p.parse_completion(R"({"prompt": "a", "max_tokens": 3.0})").req->choices[0].opts.max_new_tokens == 3);
  for (const char* seed : {"9223372036854775808.0", "1e300", "-1e300", "18446744073709551616"})
    CHECK(error_of([&] { p.parse_completion(std::string(R"({"prompt": "a", "seed": )") + seed + "}"); }).param ==
          "seed");
  CHECK(p.parse_completion(R"({"prompt": "a", "seed": -9223372036854775808})").req->choices[0].opts.sampling.seed ==
        uint64_t(1) << 63);
}

TEST_CASE("a seed gives each choice its own stream; echo returns the prompt") {
  const RequestParser p(tokenizer(), RequestRules{64, 50272, 48, 4}, 1);
  auto cr = p.parse_completion(R"({"prompt": ["a", [2, 31414]], "seed": 7, "echo": true, "stop": "x"})");
  REQUIRE(cr.req->choices.size() == 2);
  CHECK(cr.req->choices[0].opts.sampling.seed == 7);
  CHECK(cr.req->choices[1].opts.sampling.seed == 8);
  CHECK(cr.echo == std::vector<std::string>{"a", "Hello"});
  CHECK(cr.req->choices[1].stop == std::vector<std::string>{"x"});
  CHECK(opt_serve::error_body(opt_serve::bad_request(std::string("bad \xff byte"))).find("bad") != std::string::npos);
}

TEST_CASE("n choices per prompt, logprobs, penalties and logit_bias reach the choices' options") {
  const RequestParser p(tokenizer(), RequestRules{64, 50272, 48, 6}, 1);
  auto cr = p.parse_completion(R"({"prompt": ["a", [2, 31414]], "n": 3, "seed": 7, "logprobs": 2, "echo": true,
                                   "presence_penalty": 0.5, "frequency_penalty": -1,
                                   "logit_bias": {"5": 2, "9": -100}})");
  REQUIRE(cr.req->choices.size() == 6);
  CHECK(cr.n == 3);
  for (size_t i = 0; i < 6; ++i) {
    const opt_serve::Choice& c = cr.req->choices[i];
    CHECK(c.prompt == cr.req->choices[i < 3 ? 0 : 3].prompt);  // prompt i / n
    CHECK(c.opts.sampling.seed == 7 + i);
    CHECK(c.logprobs == 2);
    CHECK(c.echo_logprobs);
    CHECK(c.opts.sampling.presence_penalty == 0.5f);
    CHECK(c.opts.sampling.frequency_penalty == -1.0f);
    CHECK(c.opts.sampling.logit_bias == std::vector<std::pair<int32_t, float>>{{5, 2.0f}, {9, -100.0f}});
  }
  CHECK(cr.req->choices[3].prompt == std::vector<int32_t>{2, 31414});
  CHECK(cr.echo == std::vector<std::string>{"a", "a", "a", "Hello", "Hello", "Hello"});
  CHECK(cr.req->choices[0].echo_chars == 1);
  // without the options: no logprobs, no bias, no penalties; logprobs 0 is the chosen token's only
  auto plain = p.parse_completion(R"({"prompt": "a"})");
  CHECK(plain.req->choices[0].logprobs == -1);
  CHECK(!plain.req->choices[0].opts.sampling.processes_logits());
  CHECK(p.parse_completion(R"({"prompt": "a", "logprobs": 0})").req->choices[0].logprobs == 0);
  CHECK(!p.parse_completion(R"({"prompt": "a", "logprobs": 0})").req->choices[0].echo_logprobs);
  for (const char* bad : {R"("logit_bias": {"50272": 1})", R"("logit_bias": {"01x": 1})", R"("logit_bias": {"": 1})",
                          R"("logit_bias": {"3": 100.5})", R"("logit_bias": {"3": null})", R"("logit_bias": 3)",
                          R"("logit_bias": {"99999999999": 1})"})
    CHECK(error_of([&] { p.parse_completion(std::string(R"({"prompt": "a", )") + bad + "}"); }).param ==
          "logit_bias");
  CHECK(error_of([&] { p.parse_completion(R"({"prompt": "a", "logprobs": 21})"); }).param == "logprobs");
  CHECK(error_of([&] { p.parse_completion(R"({"prompt": "a", "presence_penalty": 2.01})"); }).param ==
        "presence_penalty");
  const ApiError e = error_of([&] { p.parse_completion(R"({"prompt": ["a", "b", "c"], "n": 3})"); });
  CHECK(e.param == "n");
  CHECK(e.message.find("9 choices; at most 6") != std::string::npos);
}

TEST_CASE("\"speculative\": true by default, false opts every choice out, anything else is a 400") {
  const RequestParser p(tokenizer(), RequestRules{64, 50272, 48, 4}, 1);
  CHECK(p.parse_generate(R"({"prompts": ["a", "b"]})")->choices[1].speculative);
  const auto off = p.parse_generate(R"({"prompts": ["a", "b"], "speculative": false})");  // (held: the loop reads it)
  for (const auto& c : off->choices) CHECK_FALSE(c.speculative);
  CHECK(p.parse_completion(R"({"prompt": "a"})").req->choices[0].speculative);
  CHECK_FALSE(p.parse_completion(R"({"prompt": ["a", "b"], "speculative": false})").req->choices[1].speculative);
  CHECK(error_of([&] { p.parse_generate(R"({"prompts": ["a"], "speculative": 1})"); }).param == "speculative");
  CHECK(error_of([&] { p.parse_completion(R"({"prompt": "a", "speculative": "no"})"); }).param == "speculative");
}

TEST_CASE("tokenize and detokenize: llama.cpp's shapes, a round trip, errors naming the field") {
  const RequestParser p(tokenizer(), RequestRules{64, 50272, 0, 4}, 1);
  CHECK(p.tokenize(R"({"prompt": "Hello"})") == R"({"tokens":[2,31414]})");
  CHECK(p.tokenize(R"({"content": "Hello", "add_special": false})") == R"({"tokens":[31414]})");
  CHECK(p.detokenize(R"({"tokens": [2, 31414]})") == R"({"prompt":"Hello"})");
  const std::string text = "  a , b\n\u00e9\u00e8 \xf0\x9f\x98\x80 ,.";
  const auto ids = nlohmann::json::parse(p.tokenize(nlohmann::json{{"prompt", text}}.dump()))["tokens"];
  CHECK(nlohmann::json::parse(p.detokenize(nlohmann::json{{"tokens", ids}}.dump()))["prompt"] == text);
  // half a character (the first byte of the emoji's 4): U+FFFD, still valid JSON
  const auto bytes = nlohmann::json::parse(p.tokenize(R"({"prompt": "\ud83d\ude00", "add_special": false})"));
  CHECK(!bytes["tokens"].empty());
  CHECK(p.detokenize(nlohmann::json{{"tokens", {bytes["tokens"][0]}}}.dump()).find("\"prompt\"") != std::string::npos);
  for (const char* body : {R"({})", R"({"prompt": 3})", R"([1])", "nope"})
    CHECK(error_of([&] { p.tokenize(body); }).status == 400);
  CHECK(error_of([&] { p.tokenize("{}"); }).param == "prompt");
  for (const char* body : {R"({})", R"({"tokens": "x"})", R"({"tokens": [-1]})", R"({"tokens": [1.5]})",
                           R"({"tokens": [99999999]})", R"({"tokens": [18446744073709551615]})"})
    CHECK(error_of([&] { p.detokenize(body); }).param == "tokens");
}
