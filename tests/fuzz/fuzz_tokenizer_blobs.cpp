// libFuzzer: vocab.json and merges.txt. The input is split at its first NUL byte: vocab.json before, merges.txt
// after. A tokenizer that loads must encode and decode a fixed text without crashing.
#include <cstring>
#include <opt/tokenizer.hpp>

#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* p = reinterpret_cast<const char*>(data);
  const char* nul = static_cast<const char*>(std::memchr(p, 0, size));
  const size_t split = nul ? size_t(nul - p) : size;
  const std::string_view vocab(p, split);
  const std::string_view merges = nul ? std::string_view(p + split + 1, size - split - 1) : std::string_view();
  try {
    opt::Tokenizer t = opt::Tokenizer::from_blobs(vocab, merges);
    std::vector<int32_t> ids = t.encode("Hello world</s> caf\xc3\xa9 \xff 12345  \n\t<pad>");
    (void)t.decode(ids);
    (void)t.decode(ids, {true, false});
  } catch (const opt::error&) {
  }
  return 0;
}
