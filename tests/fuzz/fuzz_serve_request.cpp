// libFuzzer: opt-serve's request parsing (examples/opt_serve/request.hpp). Every input is a request body, given to
// both endpoints' parsers (POST /generate and POST /v1/completions) with the real OPT tokenizer, a small context
// (64, so that the context checks are reached) and a max_tokens limit of 48. serve_request_check.hpp says what a
// body must give; a body that breaks it traps. Findings go to tests/fuzz/regressions/serve_request/, which
// test_serve_request replays.
#include <opt/tokenizer.hpp>

#include "fuzz_common.hpp"
#include "serve_request_check.hpp"

namespace {
const opt_serve::RequestParser& parser() {
  static const opt::Tokenizer tok = opt::Tokenizer::from_files(opt_fuzz::shared_dir() / "tokenizer" / "vocab.json",
                                                              opt_fuzz::shared_dir() / "tokenizer" / "merges.txt");
  static const opt_serve::RequestParser p(tok, opt_serve::RequestRules{64, 50272, 48, 4}, 12345);
  return p;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string broken =
      opt_fuzz::check_serve_request(parser(), std::string(reinterpret_cast<const char*>(data), size));
  if (!broken.empty()) {
    std::fprintf(stderr, "fuzz_serve_request: %s\n", broken.c_str());
    __builtin_trap();
  }
  return 0;
}
