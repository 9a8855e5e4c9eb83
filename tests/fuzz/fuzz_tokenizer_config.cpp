// libFuzzer: tokenizer_config.json and special_tokens_map.json, applied over a small fixed vocabulary by
// Tokenizer::from_blobs (as from_dir applies them). The input is split at its first NUL byte: tokenizer_config.json
// before, special_tokens_map.json after. Applying may fail with an opt::error; a tokenizer that builds must encode
// and decode a fixed text.
#include <cstring>
#include <opt/tokenizer.hpp>

#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* p = reinterpret_cast<const char*>(data);
  const char* nul = static_cast<const char*>(std::memchr(p, 0, size));
  const size_t split = nul ? size_t(nul - p) : size;
  try {
    opt::Tokenizer t = opt::Tokenizer::from_blobs(
        R"({"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "H": 4, "e": 5, "l": 6, "o": 7, "He": 8, "ll": 9,
            "Hell": 10, "Hello": 11, "\u0120": 12, "w": 13, "r": 14, "d": 15})",
        "#version: 0.2\nH e\nl l\nHe ll\nHell o\n", std::string_view(p, split),
        nul ? std::string_view(p + split + 1, size - split - 1) : std::string_view());
    std::vector<int32_t> ids = t.encode("Hello world</s> <pad><s>x\xff");
    (void)t.decode(ids);
    (void)t.decode(ids, {true, false});
    opt::BatchEncoding be = t.encode_batch({"Hello", "Hello Hello </s>"});
    (void)be;
  } catch (const opt::error&) {
  }
  return 0;
}
