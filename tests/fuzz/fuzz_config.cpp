// libFuzzer: config.json. The bytes go through Config::from_json (after nlohmann parsing, as from_file does; only
// that parse may throw nlohmann's exceptions, the library only opt::error) and,
// from a scratch file (for one input in eight), through Config::from_file itself. A config that loads must pass validate() again and give
// sizes that do not overflow.
#include <unistd.h>

#include <opt/config.hpp>

#include "fuzz_common.hpp"

namespace {
void check(const opt::Config& c) {
  c.validate("again");
  if (c.head_dim() <= 0 || c.hidden_size % c.num_attention_heads != 0) __builtin_trap();
  // The products the loader and the caches compute stay far from overflow.
  const __int128 kv = __int128(c.num_hidden_layers) * c.max_position_embeddings * c.hidden_size;
  const __int128 emb = __int128(c.vocab_size) * c.word_embed_proj_dim;
  if (kv > (__int128(1) << 62) || emb > (__int128(1) << 62)) __builtin_trap();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  // Only parsing the fuzz input may throw nlohmann's errors; from_json throws opt::error or nothing (every library
  // error is an opt::error), so a nlohmann exception escaping it aborts the run.
  nlohmann::json j;
  bool parsed = true;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    parsed = false;
  }
  if (parsed) {
    try {
      check(opt::Config::from_json(j));
    } catch (const opt::error&) {
    }
  }
  if (size % 8 != 0) return 0;  // the file round trip is slow: one input in eight takes it
  static const std::filesystem::path scratch =
      std::filesystem::temp_directory_path() / ("opt_fuzz_config_" + std::to_string(::getpid()) + ".json");
  {
    std::ofstream out(scratch, std::ios::binary | std::ios::trunc);
    out.write(text.data(), std::streamsize(text.size()));
  }
  try {
    check(opt::Config::from_file(scratch));
  } catch (const opt::error&) {
  }
  return 0;
}
