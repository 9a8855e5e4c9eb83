// libFuzzer: a safetensors file (8-byte length, JSON header, data) held in memory. Either a typed opt::error or
// a file whose every tensor view lies inside the buffer and has the size its dtype and shape say.
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    opt::SafetensorsFile f = opt::SafetensorsFile::from_bytes(std::string(reinterpret_cast<const char*>(data), size));
    opt_fuzz::check_views(f);
    // The same bytes as a checkpoint of one file (the name map over every tensor).
    opt::Checkpoint c;
    c.add(std::move(f));
    for (const opt::TensorView* t : c.tensors())
      if (c.find(t->name) != t) __builtin_trap();
  } catch (const opt::error&) {
  }
  return 0;
}
