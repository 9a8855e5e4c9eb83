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
    opt_fuzz::check_views(f);
  } catch (const opt::error&) {
  }
  return 0;
}
