// libFuzzer: a torch data.pkl through the restricted unpickler (detail::unpickle_state_dict). When it yields a
// state dict, the harness writes an archive with that pickle and a record of the right size for every storage
// (zeros; at most 1 MB in all) and opens it with PytorchFile, which then checks offsets, strides and sizes
// against the storages and copies strided views.
#include <opt/pytorch.hpp>

#include "fuzz_common.hpp"

namespace {
void put_le(std::string& b, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) b.push_back(char((v >> (8 * i)) & 0xff));
}
// A zip of stored entries, as torch.save writes it (no alignment padding).
std::string make_zip(const std::vector<std::pair<std::string, std::string>>& items) {
  std::string out, cd;
  for (auto& [name, body] : items) {
    const uint64_t crc = opt::detail::crc32(reinterpret_cast<const std::byte*>(body.data()), body.size());
    const uint64_t off = out.size(), n = body.size();
    put_le(out, 0x04034b50, 4); put_le(out, 20, 2); put_le(out, 0, 2); put_le(out, 0, 2); put_le(out, 0, 4);
    put_le(out, crc, 4); put_le(out, n, 4); put_le(out, n, 4); put_le(out, name.size(), 2); put_le(out, 0, 2);
    out += name + body;
    put_le(cd, 0x02014b50, 4); put_le(cd, 20, 2); put_le(cd, 20, 2); put_le(cd, 0, 2); put_le(cd, 0, 2);
    put_le(cd, 0, 4); put_le(cd, crc, 4); put_le(cd, n, 4); put_le(cd, n, 4); put_le(cd, name.size(), 2);
    put_le(cd, 0, 2); put_le(cd, 0, 2); put_le(cd, 0, 2); put_le(cd, 0, 2); put_le(cd, 0, 4); put_le(cd, off, 4);
    cd += name;
  }
  const uint64_t cd_off = out.size();
  out += cd;
  put_le(out, 0x06054b50, 4); put_le(out, 0, 4); put_le(out, items.size(), 2); put_le(out, items.size(), 2);
  put_le(out, cd.size(), 4); put_le(out, cd_off, 4); put_le(out, 0, 2);
  return out;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string pkl(reinterpret_cast<const char*>(data), size);
  opt::detail::StateDict sd;
  try {
    sd = opt::detail::unpickle_state_dict(pkl, "data.pkl");
  } catch (const opt::error&) {
    return 0;
  }
  std::vector<std::pair<std::string, std::string>> items{{"archive/data.pkl", pkl}};
  uint64_t total = 0;
  for (const opt::detail::PickleStorage& st : sd.storages) {
    const uint64_t esize = opt::dtype_size(st.type);
    if (st.numel > (uint64_t(1) << 20) / esize) return 0;
    total += st.numel * esize;
    if (total > (uint64_t(1) << 20)) return 0;
    items.push_back({"archive/data/" + st.key, std::string(size_t(st.numel * esize), '\0')});
  }
  try {
    opt::PytorchFile f = opt::PytorchFile::from_bytes(make_zip(items), "wrapped.bin");
    opt_fuzz::check_views(f);
  } catch (const opt::error&) {
  }
  return 0;
}
