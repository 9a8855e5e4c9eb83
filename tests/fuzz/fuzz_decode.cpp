// libFuzzer: arbitrary id sequences into the real OPT tokenizer's decode and StreamDecoder. Byte 0 picks
// skip_special_tokens / clean_up_tokenization_spaces; every 3 bytes after it give an id (mostly inside the
// vocabulary, sometimes anywhere in int32). Ids outside the tokenizer are a tokenizer_error; otherwise the
// streamed pieces concatenate to exactly decode(ids).
#include <opt/tokenizer.hpp>

#include "fuzz_common.hpp"

namespace {
const opt::Tokenizer& tok() {
  static const opt::Tokenizer t = opt::Tokenizer::from_dir(opt_fuzz::shared_dir() / "tokenizer");
  return t;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const opt::Tokenizer& t = tok();
  opt::DecodeOptions o;
  o.skip_special_tokens = data[0] & 1;
  o.clean_up_tokenization_spaces = data[0] & 2;
  std::vector<int32_t> ids;
  for (size_t i = 1; i + 3 <= size; i += 3) {
    const uint32_t v = uint32_t(data[i]) | uint32_t(data[i + 1]) << 8 | uint32_t(data[i + 2]) << 16;
    if (v & 0x800000u)  // rare: anything, including negative ids and ids just past the vocabulary
      ids.push_back(int32_t((v & 0x7fffffu) * 2654435761u));
    else
      ids.push_back(int32_t(v % 50280u));
  }
  std::string whole;
  bool bad_id = false;
  try {
    whole = t.decode(ids, o);
  } catch (const opt::tokenizer_error&) {
    bad_id = true;
  }
  opt::StreamDecoder sd(t, o);
  std::string streamed;
  try {
    for (int32_t id : ids) streamed += sd.push(id);
    streamed += sd.flush();
  } catch (const opt::tokenizer_error&) {
    if (!bad_id) __builtin_trap();
    return 0;
  }
  if (bad_id || streamed != whole) __builtin_trap();
  return 0;
}
