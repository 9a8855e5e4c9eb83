// libFuzzer: a torch.save archive (zip of stored entries + data.pkl) held in memory, through PytorchFile. Every
// tensor view lies inside the buffer (or in a copy the reader owns) and has the size its dtype and shape say.
// data.pkl's CRC-32 is always checked, so mutations reach the zip structure and the storage records here; the
// pickle itself is fuzzed by fuzz_unpickle.
#include <opt/pytorch.hpp>

#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    opt::PytorchOptions o;
    o.verify_crc = size & 1;  // both paths
    opt::PytorchFile f = opt::PytorchFile::from_bytes(std::string(reinterpret_cast<const char*>(data), size), "f", o);
    volatile uint32_t sink = 0;
    for (const opt::TensorView& t : f.tensors()) {
      size_t bytes = opt::dtype_size(t.type);
      for (int64_t d : t.shape) bytes *= size_t(d);
      if (bytes != t.nbytes || f.find(t.name) != &t) __builtin_trap();
      sink = sink + opt_fuzz::touch(t);
    }
  } catch (const opt::error&) {
  }
  return 0;
}
