// PyTorch checkpoints (torch.save's zip archive of a pickled state dict, e.g. the hub's pytorch_model.bin):
// read them as opt::TensorView, and convert a checkpoint (PyTorch or safetensors) to safetensors.
//
// A torch.save archive is a zip of STORED entries: <prefix>/data.pkl (the state dict, pickled), one record
// <prefix>/data/<key> per storage, and <prefix>/version. The pickle is read by a restricted unpickler
// (detail/unpickle.hpp) that runs nothing: only OrderedDict, tensor-rebuild calls and storage tags are allowed.
// Every tensor is validated against its storage (dtype, numel, offset, strides, record size) when the file is
// opened. A tensor that is contiguous in its storage is a zero-copy view into the mapped file; any other strided
// view is copied into memory the PytorchFile owns (at most as many bytes as the file has, in total).
//
// Layouts:
//   PytorchFile::open(file)             one archive (pytorch_model.bin, *.pt, *.pth)
//   PytorchCheckpoint::open(path)       a file, or a directory holding pytorch_model.bin, or shards listed by
//                                       pytorch_model.bin.index.json (the hub's layout for larger models)
//   convert_checkpoint(in, out_dir)     PyTorch or safetensors in, OUTPUT_DIR/model.safetensors (or shards plus
//                                       model.safetensors.index.json) out, with an optional float cast, plus a
//                                       copy of config.json, generation_config.json and the tokenizer files.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "opt/detail/fp16.hpp"
#include "opt/detail/mmap.hpp"
#include "opt/detail/unpickle.hpp"
#include "opt/detail/zip.hpp"
#include "opt/error.hpp"
#include "opt/safetensors.hpp"

OPT_NAMESPACE_BEGIN

struct PytorchOptions {
  // Check every storage record's CRC-32 while opening (reads all the weights once). data.pkl is always checked.
  bool verify_crc = false;
};

class PytorchFile {
 public:
  // Memory-maps and validates a torch.save archive.
  static PytorchFile open(const std::filesystem::path& path, const PytorchOptions& opts = {}) {
    PytorchFile f;
    f.map_ = std::make_shared<detail::MappedFile>(path);
    f.parse(f.map_->data(), f.map_->size(), f.map_->path(), opts);
    return f;
  }
  // Validates an archive held in memory (the file owns a copy). `name` is used in messages.
  // The memory-mapped bytes of the file ({nullptr, 0} when it was read into memory): views inside it may be
  // released with madvise and are read again from the file when touched.
  std::pair<const std::byte*, size_t> mapping() const noexcept {
    if (!map_) return {nullptr, 0};
    return {map_->data(), map_->size()};
  }
  static PytorchFile from_bytes(std::string bytes, const std::string& name = "<memory>",
                                const PytorchOptions& opts = {}) {
    PytorchFile f;
    f.owned_ = std::make_shared<std::string>(std::move(bytes));
    f.parse(reinterpret_cast<const std::byte*>(f.owned_->data()), f.owned_->size(), name, opts);
    return f;
  }

  // The state dict's tensors, in the order the pickle lists them.
  const std::vector<TensorView>& tensors() const noexcept { return tensors_; }
  const TensorView* find(std::string_view name) const {
    auto it = index_.find(std::string(name));
    return it == index_.end() ? nullptr : &tensors_[it->second];
  }
  const std::string& path() const noexcept { return path_; }
  // Bytes copied out of the archive for tensors that are not contiguous in their storage.
  size_t copied_bytes() const noexcept { return copied_bytes_; }

 private:
  void parse(const std::byte* base, size_t size, const std::string& path, const PytorchOptions& opts) {
    path_ = path;
    if (size >= 2 && std::to_integer<uint8_t>(base[0]) == 0x80 && std::to_integer<uint8_t>(base[1]) <= 5)
      throw format_error(path + ": a raw pickle, not a zip archive: the legacy torch.save format (before torch 1.6) "
                                "is not supported; re-save it with a newer torch");
    detail::ZipArchive zip(base, size, path);
    // The archive's records share one top-level folder, whose name varies ("archive", the file's stem ...).
    const detail::ZipEntry* pkl = nullptr;
    for (auto& e : zip.entries()) {
      size_t slash = e.name.find('/');
      if (slash != std::string::npos && e.name.compare(slash, std::string::npos, "/data.pkl") == 0) {
        if (pkl) throw format_error(path + ": two pickles in the archive: '" + pkl->name + "' and '" + e.name + "'");
        pkl = &e;
      }
    }
    if (!pkl) throw format_error(path + ": zip archive without a <name>/data.pkl entry: not a torch.save file");
    const std::string prefix = pkl->name.substr(0, pkl->name.size() - 8);  // "<name>/"
    if (const detail::ZipEntry* bo = zip.find(prefix + "byteorder")) {
      std::string_view order = zip.read(*bo, true);
      if (order != "little")
        throw format_error(path + ": byteorder is '" + std::string(order.substr(0, 16)) +
                           "', only little-endian archives are supported");
    }
    detail::StateDict sd = detail::unpickle_state_dict(zip.read(*pkl, true), path + ": " + pkl->name);

    // Storage records: found, stored, of the size their dtype and numel say.
    std::vector<const std::byte*> base_of(sd.storages.size());
    for (size_t s = 0; s < sd.storages.size(); ++s) {
      const detail::PickleStorage& st = sd.storages[s];
      std::string rec = prefix + "data/" + st.key;
      const detail::ZipEntry* e = zip.find(rec);
      if (!e) throw format_error(path + ": storage key '" + st.key + "' has no record '" + rec + "' in the archive");
      uint64_t esize = dtype_size(st.type);
      if (st.numel > UINT64_MAX / esize || st.numel * esize != e->size)
        throw format_error(path + ": storage '" + st.key + "' holds " + std::to_string(st.numel) + " " +
                           to_string(st.type) + " elements but its record '" + rec + "' has " +
                           std::to_string(e->size) + " bytes");
      base_of[s] = reinterpret_cast<const std::byte*>(zip.read(*e, opts.verify_crc).data());
    }

    copies_ = std::make_shared<std::vector<std::vector<std::byte>>>();
    tensors_.reserve(sd.tensors.size());
    for (detail::PickleTensor& pt : sd.tensors) {
      const detail::PickleStorage& st = sd.storages[pt.storage];
      const size_t esize = dtype_size(st.type);
      TensorView t;
      t.name = pt.name;
      t.type = st.type;
      t.shape = pt.shape;
      t.file = path;
      auto bad = [&](const std::string& why) {
        return format_error(path + ": tensor '" + pt.name + "' (" + to_string(st.type) + " " + shape_string(pt.shape) +
                            ", offset " + std::to_string(pt.offset) + ", stride " + shape_string(pt.stride) +
                            ") " + why);
      };
      // numel, and the largest element index it touches, with overflow checks against the storage size.
      uint64_t numel = 1;
      bool empty = false;
      for (int64_t d : pt.shape) empty |= d == 0;
      uint64_t last = uint64_t(pt.offset);
      if (!empty) {
        for (size_t k = 0; k < pt.shape.size(); ++k) {
          uint64_t d = uint64_t(pt.shape[k]), s = uint64_t(pt.stride[k]);
          if (numel > UINT64_MAX / d) throw bad("has too many elements");
          numel *= d;
          if (s != 0 && d - 1 > (UINT64_MAX - last) / s) throw bad("reaches beyond 2^64 elements");
          last += (d - 1) * s;
        }
        if (last >= st.numel)
          throw bad("reaches element " + std::to_string(last) + " but its storage '" + st.key + "' has " +
                    std::to_string(st.numel) + " elements");
      } else {
        numel = 0;
        if (uint64_t(pt.offset) > st.numel)
          throw bad("starts past the end of its storage '" + st.key + "' (" + std::to_string(st.numel) + " elements)");
      }
      if (numel > SIZE_MAX / esize) throw bad("has more bytes than memory can address");
      t.nbytes = size_t(numel * esize);
      const std::byte* src = base_of[pt.storage];
      if (numel == 0) {
        t.data = src;
      } else if (contiguous(pt.shape, pt.stride)) {
        t.data = src + size_t(pt.offset) * esize;
      } else {
        if (t.nbytes > size - std::min<size_t>(size, copied_bytes_))
          throw limit_error(path + ": tensor '" + pt.name + "' is a strided view of " + std::to_string(t.nbytes) +
                            " bytes; copying it would exceed the file's size in total (overlapping strides?)");
        copies_->emplace_back(t.nbytes);
        strided_copy(src + size_t(pt.offset) * esize, pt.shape, pt.stride, esize, copies_->back().data());
        copied_bytes_ += t.nbytes;
        t.data = copies_->back().data();
      }
      index_.emplace(t.name, tensors_.size());  // names are unique (the unpickler checked)
      tensors_.push_back(std::move(t));
    }
  }

  // Row-major strides, ignoring dimensions of size 1 (their stride is arbitrary).
  static bool contiguous(const std::vector<int64_t>& shape, const std::vector<int64_t>& stride) {
    int64_t expect = 1;
    for (size_t k = shape.size(); k-- > 0;) {
      if (shape[k] == 1) continue;
      if (stride[k] != expect) return false;
      expect *= shape[k];
    }
    return true;
  }
  static void strided_copy(const std::byte* src, const std::vector<int64_t>& shape, const std::vector<int64_t>& stride,
                           size_t esize, std::byte* dst) {
    const size_t nd = shape.size();
    std::vector<int64_t> idx(nd, 0);
    for (;;) {
      int64_t off = 0;
      for (size_t k = 0; k < nd; ++k) off += idx[k] * stride[k];
      std::memcpy(dst, src + size_t(off) * esize, esize);
      dst += esize;
      size_t k = nd;
      while (k > 0) {
        --k;
        if (++idx[k] < shape[k]) break;
        idx[k] = 0;
        if (k == 0) return;
      }
      if (nd == 0) return;
    }
  }

  std::shared_ptr<detail::MappedFile> map_;
  std::shared_ptr<std::string> owned_;
  std::shared_ptr<std::vector<std::vector<std::byte>>> copies_;
  size_t copied_bytes_ = 0;
  std::string path_;
  std::vector<TensorView> tensors_;
  std::unordered_map<std::string, size_t> index_;
};

// One archive, or the shards of pytorch_model.bin.index.json. Tensor names are unique across the shards.
class PytorchCheckpoint : public detail::ShardSet<PytorchFile> {
 public:
  // `path` is an archive file, or a directory holding pytorch_model.bin or pytorch_model.bin.index.json.
  static PytorchCheckpoint open(const std::filesystem::path& path, const PytorchOptions& opts = {}) {
    namespace fs = std::filesystem;
    PytorchCheckpoint c;
    std::error_code ec;
    if (!fs::is_directory(path, ec)) {
      if (!fs::exists(path, ec)) throw io_error(path.string() + ": no such file or directory");
      c.add(PytorchFile::open(path, opts));
      return c;
    }
    c.open_dir(path, "pytorch_model.bin", "pytorch_model.bin.index.json",
               [&](const fs::path& p) { return PytorchFile::open(p, opts); });
    return c;
  }
};

// ---- conversion to safetensors -----------------------------------------------------------------------------

struct ConvertOptions {
  // Cast every floating-point tensor (F64, F32, F16, BF16) to this type (F32, F16 or BF16), rounding to
  // nearest even; values beyond F16's range become +-Inf, as in torch. Integer and bool tensors are kept.
  std::optional<dtype> cast;
  // 0: one model.safetensors. Otherwise shards of at most this many bytes of tensor data (a larger tensor gets
  // a shard of its own) named model-00001-of-0000N.safetensors, plus model.safetensors.index.json.
  uint64_t max_shard_bytes = 0;
  // Check the CRC-32 of every storage record of a PyTorch input.
  bool verify_crc = true;
};

struct ConvertResult {
  std::string source_format;                    // "pytorch" or "safetensors"
  std::vector<std::filesystem::path> inputs;    // the weight files read
  std::vector<std::filesystem::path> written;   // the files written (shards, index)
  std::vector<std::string> copied;              // config and tokenizer files copied
  size_t tensors = 0;
  uint64_t bytes = 0;                           // tensor data written
};

// Files copied beside the weights when the input directory has them.
inline const std::vector<std::string>& convert_side_files() {
  static const std::vector<std::string> names = {
      "config.json",     "generation_config.json", "vocab.json",          "merges.txt",
      "tokenizer.json",  "tokenizer_config.json",  "special_tokens_map.json", "added_tokens.json"};
  return names;
}

namespace detail {

inline bool is_float(dtype t) noexcept {
  return t == dtype::F64 || t == dtype::F32 || t == dtype::F16 || t == dtype::BF16;
}

inline float load_float(dtype t, const std::byte* p) noexcept {
  switch (t) {
    case dtype::F32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case dtype::F16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return f16_to_f32(h);
    }
    case dtype::BF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return bf16_to_f32(h);
    }
    default: {  // F64
      double d;
      std::memcpy(&d, p, 8);
      return float(d);
    }
  }
}

inline void store_float(dtype t, float f, std::byte* p) noexcept {
  if (t == dtype::F32) {
    std::memcpy(p, &f, 4);
  } else {
    uint16_t h = t == dtype::F16 ? f32_to_f16(f) : f32_to_bf16(f);
    std::memcpy(p, &h, 2);
  }
}

// Writes `src` as `to` (a float type), converting in chunks.
inline void write_cast(std::ofstream& out, const TensorView& src, dtype to) {
  const size_t n = src.numel(), in_size = dtype_size(src.type), out_size = dtype_size(to);
  constexpr size_t chunk = 1u << 16;
  std::vector<std::byte> buf(chunk * out_size);
  for (size_t i = 0; i < n; i += chunk) {
    size_t m = std::min(chunk, n - i);
    for (size_t k = 0; k < m; ++k) store_float(to, load_float(src.type, src.data + (i + k) * in_size), &buf[k * out_size]);
    out.write(reinterpret_cast<const char*>(buf.data()), std::streamsize(m * out_size));
  }
}

// Writes one safetensors file (to a temporary name, renamed when complete) holding `tensors` as `types`.
inline void write_safetensors_file(const std::filesystem::path& path, const std::vector<const TensorView*>& tensors,
                                   const std::vector<dtype>& types) {
  std::vector<TensorData> desc;
  for (size_t i = 0; i < tensors.size(); ++i) desc.push_back({tensors[i]->name, types[i], tensors[i]->shape, nullptr});
  std::string header = safetensors_header(desc, {{"format", "pt"}});
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw io_error(tmp.string() + ": cannot open for writing");
    out.write(header.data(), std::streamsize(header.size()));
    for (size_t i = 0; i < tensors.size(); ++i) {
      const TensorView& t = *tensors[i];
      if (types[i] == t.type)
        out.write(reinterpret_cast<const char*>(t.data), std::streamsize(t.nbytes));
      else
        write_cast(out, t, types[i]);
    }
    out.flush();
    if (!out) {
      out.close();
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      throw io_error(tmp.string() + ": write failed (disk full?)");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw io_error(path.string() + ": cannot rename " + tmp.filename().string() + " into place: " + ec.message());
}

// The checkpoint convert_checkpoint reads (see there): PyTorch or safetensors, and the directory of its side
// files; fills r.source_format and r.inputs.
struct ConvertInput {
  std::optional<PytorchCheckpoint> pt;
  std::optional<Checkpoint> st;
  std::filesystem::path dir;
  std::vector<const TensorView*> tensors() const { return pt ? pt->tensors() : st->tensors(); }
};

inline ConvertInput open_convert_input(const std::filesystem::path& input, bool verify_crc, ConvertResult& r) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const bool is_dir = fs::is_directory(input, ec);
  if (!is_dir && !fs::exists(input, ec)) throw io_error(input.string() + ": no such file or directory");
  ConvertInput in;
  in.dir = is_dir ? input : (input.has_parent_path() ? input.parent_path() : fs::path("."));

  PytorchOptions popts;
  popts.verify_crc = verify_crc;
  if (is_dir) {
    if (fs::exists(input / "pytorch_model.bin", ec) || fs::exists(input / "pytorch_model.bin.index.json", ec))
      in.pt = PytorchCheckpoint::open(input, popts);
    else if (fs::exists(input / "model.safetensors", ec) || fs::exists(input / "model.safetensors.index.json", ec))
      in.st = Checkpoint::open(input);
    else
      throw io_error(input.string() + ": found none of pytorch_model.bin, pytorch_model.bin.index.json, "
                                      "model.safetensors, model.safetensors.index.json");
  } else if (input.extension() == ".safetensors") {
    in.st = Checkpoint::open(input);
  } else {
    in.pt = PytorchCheckpoint::open(input, popts);
  }
  if (in.pt) {
    r.source_format = "pytorch";
    for (auto& f : in.pt->files()) r.inputs.emplace_back(f.path());
  } else {
    r.source_format = "safetensors";
    for (auto& f : in.st->files()) r.inputs.emplace_back(f.path());
  }
  return in;
}

// Copies the side files (convert_side_files()) of in_dir that exist into output_dir; config.json's "torch_dtype"
// follows a cast.
inline void copy_side_files(const std::filesystem::path& in_dir, const std::filesystem::path& output_dir,
                            const std::optional<dtype>& cast, ConvertResult& r) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const std::string& name : convert_side_files()) {
    fs::path from = in_dir / name, to = output_dir / name;
    if (!fs::is_regular_file(from, ec)) continue;
    if (fs::exists(to, ec) && fs::equivalent(from, to, ec)) continue;  // converting into the input's directory
    if (name == "config.json" && cast) {
      // Keep config.json's "torch_dtype" in step with the cast (key order and other values preserved).
      std::ifstream in(from, std::ios::binary);
      nlohmann::ordered_json j;
      try {
        j = nlohmann::ordered_json::parse(in);
      } catch (const nlohmann::json::exception& e) {
        throw format_error(from.string() + ": malformed JSON: " + e.what());
      }
      if (!j.is_object()) throw format_error(from.string() + ": expected a JSON object");
      j["torch_dtype"] = *cast == dtype::F32 ? "float32" : *cast == dtype::F16 ? "float16" : "bfloat16";
      std::ofstream out(to, std::ios::binary | std::ios::trunc);
      out << j.dump(2) << '\n';
      out.flush();
      if (!out) throw io_error(to.string() + ": write failed");
      r.copied.push_back(name);
      continue;
    }
    if (!fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec))
      throw io_error(to.string() + ": cannot copy " + from.string() + ": " + ec.message());
    r.copied.push_back(name);
  }
}

}  // namespace detail

// Converts the checkpoint at `input` to safetensors in `output_dir` (created if needed).
// `input` is a directory or a file. A directory is read as pytorch_model.bin, else pytorch_model.bin.index.json
// (+ shards), else model.safetensors, else model.safetensors.index.json (+ shards); a file as safetensors when it
// ends in .safetensors, else as a torch.save archive. Tensors are written sorted by name with
// __metadata__ {"format": "pt"} (what transformers expects). Side files (convert_side_files()) are copied from
// the input's directory when present. When writing one file, a stale model.safetensors.index.json in
// `output_dir` is removed (and model.safetensors when writing shards), so the output is never ambiguous.
// With a cast, config.json's "torch_dtype" is set to the new type. A safetensors input cannot be converted into
// its own directory.
inline ConvertResult convert_checkpoint(const std::filesystem::path& input, const std::filesystem::path& output_dir,
                                        const ConvertOptions& opts = {}) {
  namespace fs = std::filesystem;
  if (opts.cast && *opts.cast != dtype::F32 && *opts.cast != dtype::F16 && *opts.cast != dtype::BF16)
    throw input_error(std::string("convert: cannot cast to ") + to_string(*opts.cast) + ", expected F32, F16 or BF16");
  ConvertResult r;
  std::error_code ec;
  const detail::ConvertInput in = detail::open_convert_input(input, opts.verify_crc, r);
  const fs::path& in_dir = in.dir;
  const bool st = in.st.has_value();
  std::vector<const TensorView*> tensors = in.tensors();
  if (tensors.empty()) throw tensor_error(input.string() + ": the checkpoint holds no tensors");

  fs::create_directories(output_dir, ec);
  if (!fs::is_directory(output_dir, ec))
    throw io_error(output_dir.string() + ": cannot create the output directory" + (ec ? ": " + ec.message() : ""));
  if (st && fs::equivalent(in_dir, output_dir, ec))
    throw input_error(output_dir.string() + ": is the input directory; converting safetensors in place would "
                                            "overwrite the input");

  std::sort(tensors.begin(), tensors.end(), [](const TensorView* a, const TensorView* b) { return a->name < b->name; });
  std::vector<dtype> types;
  for (const TensorView* t : tensors) {
    dtype to = opts.cast && detail::is_float(t->type) ? *opts.cast : t->type;
    types.push_back(to);
    r.bytes += uint64_t(t->numel()) * dtype_size(to);
  }
  r.tensors = tensors.size();

  // Partition into shards, in name order.
  std::vector<uint64_t> sizes;
  for (size_t i = 0; i < tensors.size(); ++i) sizes.push_back(uint64_t(tensors[i]->numel()) * dtype_size(types[i]));
  const std::vector<size_t> starts = shard_starts(sizes, opts.max_shard_bytes);
  const size_t nshards = starts.size() - 1;
  const fs::path single = output_dir / "model.safetensors";
  const fs::path index = output_dir / "model.safetensors.index.json";
  if (nshards == 1) {
    detail::write_safetensors_file(single, tensors, types);
    r.written.push_back(single);
    if (fs::exists(index, ec)) fs::remove(index, ec);
  } else {
    nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
    for (size_t s = 0; s < nshards; ++s) {
      std::string name = shard_file_name(s + 1, nshards);
      std::vector<const TensorView*> part(tensors.begin() + std::ptrdiff_t(starts[s]),
                                          tensors.begin() + std::ptrdiff_t(starts[s + 1]));
      std::vector<dtype> part_types(types.begin() + std::ptrdiff_t(starts[s]),
                                    types.begin() + std::ptrdiff_t(starts[s + 1]));
      detail::write_safetensors_file(output_dir / name, part, part_types);
      r.written.push_back(output_dir / name);
      for (const TensorView* t : part) weight_map[t->name] = name;
    }
    write_shard_index(index, weight_map, r.bytes);
    r.written.push_back(index);
    if (fs::exists(single, ec)) fs::remove(single, ec);
  }

  detail::copy_side_files(in_dir, output_dir, opts.cast, r);
  return r;
}

OPT_NAMESPACE_END
