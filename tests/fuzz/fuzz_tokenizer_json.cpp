// libFuzzer: a Hugging Face tokenizer.json. A tokenizer that loads must encode and decode a fixed text.
#include <opt/tokenizer.hpp>

#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    opt::Tokenizer t = opt::Tokenizer::from_tokenizer_json(std::string_view(reinterpret_cast<const char*>(data), size));
    std::vector<int32_t> ids = t.encode("Hello world</s> caf\xc3\xa9 \xff 12345  \n\t<pad>");
    (void)t.decode(ids);
    (void)t.decode(ids, {true, false});
    opt::StreamDecoder sd(t);
    for (int32_t id : ids) (void)sd.push(id);
    (void)sd.flush();
  } catch (const opt::error&) {
  }
  return 0;
}
