// Shared helpers for the libFuzzer targets: where ../shared is, and touching every byte a view claims so that
// AddressSanitizer sees any read outside the buffer.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <opt/safetensors.hpp>

namespace opt_fuzz {

// OPT_FUZZ_SHARED_DIR (environment) overrides the OPT_SHARED_DIR the build was configured with.
inline std::filesystem::path shared_dir() {
  if (const char* e = std::getenv("OPT_FUZZ_SHARED_DIR")) return e;
  return OPT_SHARED_DIR;
}

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) {
    std::fprintf(stderr, "fuzz setup: cannot open %s (set OPT_FUZZ_SHARED_DIR)\n", p.string().c_str());
    std::abort();
  }
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Reads the first and last byte of the view and folds every byte of small views, so that ASan checks the bounds
// the parser promised.
inline uint32_t touch(const opt::TensorView& t) {
  const auto* p = reinterpret_cast<const volatile unsigned char*>(t.data);
  if (t.nbytes == 0) return 0;
  uint32_t h = p[0] + p[t.nbytes - 1];
  if (t.nbytes <= 4096)
    for (size_t i = 0; i < t.nbytes; ++i) h = h * 31 + p[i];
  return h;
}

// Every view of a parsed file (SafetensorsFile, PytorchFile): its size is what dtype and shape say, find() gives
// it back by name, and its bytes are readable. Traps otherwise.
template <class File>
void check_views(const File& f) {
  volatile uint32_t sink = 0;
  for (const opt::TensorView& t : f.tensors()) {
    size_t bytes = opt::dtype_size(t.type);
    for (int64_t d : t.shape) bytes *= size_t(d);
    if (bytes != t.nbytes || f.find(t.name) != &t) __builtin_trap();
    sink = sink + touch(t);
  }
}

}  // namespace opt_fuzz
