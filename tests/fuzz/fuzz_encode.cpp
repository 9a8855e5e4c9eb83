// libFuzzer: arbitrary bytes into the real OPT tokenizer (../shared/tokenizer, loaded once). encode never throws
// for text; ids are in the vocabulary; and for valid UTF-8, decode(encode(s)) without cleanup gives s back.
#include <opt/tokenizer.hpp>

#include "fuzz_common.hpp"

namespace {
const opt::Tokenizer& tok() {
  static const opt::Tokenizer t = opt::Tokenizer::from_dir(opt_fuzz::shared_dir() / "tokenizer");
  return t;
}
bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1f : n == 3 ? c & 0x0f : c & 0x07;
    for (size_t k = 1; k < n; ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff))
      return false;
    i += n;
  }
  return true;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const opt::Tokenizer& t = tok();
  std::vector<int32_t> ids = t.encode(text, false);
  for (int32_t id : ids)
    if (id < 0 || size_t(id) >= t.vocab_size()) __builtin_trap();
  const std::string back = t.decode(ids, {false, false});
  if (valid_utf8(text) && back != text) __builtin_trap();
  std::vector<int32_t> with_bos = t.encode(text, true);
  if (with_bos.empty() || with_bos[0] != t.bos_token_id()) __builtin_trap();
  (void)t.decode(with_bos, {true, true});
  return 0;
}
