// libFuzzer: model.safetensors.index.json (and pytorch_model.bin.index.json), through detail::parse_weight_map,
// the in-memory half of Checkpoint::open's index reading. Every shard name it returns must be a plain file name.
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto m = opt::detail::parse_weight_map(std::string_view(reinterpret_cast<const char*>(data), size), "index.json");
    for (auto& [file, names] : m) {
      if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos ||
          file.find('\\') != std::string::npos || names.empty())
        __builtin_trap();
    }
  } catch (const opt::error&) {
  }
  return 0;
}
