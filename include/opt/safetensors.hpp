// The safetensors format: parse and validate a file (memory-mapped, zero-copy), open a checkpoint that is one
// file or several shards with an index, and write files. Knows nothing about models.
//
// File layout: u64 little-endian N | N bytes of JSON header | data. The header maps tensor names to
// {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the start of data) and may hold a
// "__metadata__" object of string -> string. Every rule below is checked when a file is opened, so a view
// handed out by this header is always inside the mapping and of the size its dtype and shape say.
#pragma once
#include <simdjson.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "opt/detail/mmap.hpp"
#include "opt/dtype.hpp"
#include "opt/error.hpp"

OPT_NAMESPACE_BEGIN

inline std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// A tensor inside a mapped file: where its bytes are, and what they are. Valid while its file lives.
struct TensorView {
  std::string name;
  dtype type = dtype::F32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;
  size_t nbytes = 0;
  std::string file;  // the file it came from, for messages

  size_t numel() const noexcept {
    size_t n = 1;
    for (int64_t d : shape) n *= size_t(d);
    return n;
  }
};

class SafetensorsFile {
 public:
  // Memory-maps and validates `path`.
  static SafetensorsFile open(const std::filesystem::path& path) {
    SafetensorsFile f;
    f.map_ = std::make_shared<detail::MappedFile>(path);
    f.parse(f.map_->data(), f.map_->size(), f.map_->path());
    return f;
  }
  // Validates bytes held in memory (the file owns a copy). `name` is used in messages.
  static SafetensorsFile from_bytes(std::string bytes, const std::string& name = "<memory>") {
    SafetensorsFile f;
    f.owned_ = std::make_shared<std::string>(std::move(bytes));
    f.parse(reinterpret_cast<const std::byte*>(f.owned_->data()), f.owned_->size(), name);
    return f;
  }

  const std::vector<TensorView>& tensors() const noexcept { return tensors_; }
  const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }
  const std::string& path() const noexcept { return path_; }
  const TensorView* find(std::string_view name) const {
    auto it = index_.find(std::string(name));
    return it == index_.end() ? nullptr : &tensors_[it->second];
  }
  // The memory-mapped bytes of the file ({nullptr, 0} when it was read into memory): views inside it may be
  // released with madvise and are read again from the file when touched.
  std::pair<const std::byte*, size_t> mapping() const noexcept {
    if (!map_) return {nullptr, 0};
    return {map_->data(), map_->size()};
  }
  // Bytes of the whole file (mapped or owned).
  size_t file_size() const noexcept { return map_ ? map_->size() : (owned_ ? owned_->size() : 0); }
  void will_need() const noexcept {
    if (map_) map_->will_need();
  }

 private:
  void parse(const std::byte* base, size_t size, const std::string& path) {
    path_ = path;
    if (size < 8)
      throw format_error(path + ": file is " + std::to_string(size) + " bytes, too short for the 8-byte header length");
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | uint64_t(std::to_integer<uint8_t>(base[i]));
    if (n > uint64_t(OPT_MAX_HEADER_BYTES))
      throw limit_error(path + ": header length " + std::to_string(n) + " exceeds the limit of " +
                         std::to_string(uint64_t(OPT_MAX_HEADER_BYTES)) + " bytes (OPT_MAX_HEADER_BYTES)");
    if (n > size - 8)
      throw format_error(path + ": header length " + std::to_string(n) + " goes beyond the file (" +
                         std::to_string(size) + " bytes)");
    if (n < 2) throw format_error(path + ": header of " + std::to_string(n) + " bytes cannot hold a JSON object");
    const char* hdr = reinterpret_cast<const char*>(base + 8);
    const std::byte* data = base + 8 + n;
    const size_t data_size = size - 8 - size_t(n);
    // The format pads the header with trailing spaces, which JSON allows. simdjson's DOM parser validates the
    // whole document (on-demand would skip what it does not visit).
    simdjson::dom::parser parser;
    struct Span { size_t begin, end, idx; };
    std::vector<Span> spans;
    try {
      simdjson::dom::element root = parser.parse(hdr, size_t(n));
      if (!root.is_object()) throw format_error(path + ": the JSON header is not an object");
      for (auto field : root.get_object()) {
        std::string key(field.key);
        simdjson::dom::element v = field.value;
        if (key == "__metadata__") {
          if (!v.is_object()) throw format_error(path + ": __metadata__ must be an object");
          for (auto m : v.get_object()) {
            if (!m.value.is_string())
              throw format_error(path + ": __metadata__[\"" + std::string(m.key) + "\"] must be a string");
            metadata_[std::string(m.key)] = std::string(std::string_view(m.value.get_string()));
          }
          continue;
        }
        if (index_.count(key)) throw format_error(path + ": tensor '" + key + "' appears twice in the header");
        if (tensors_.size() >= OPT_MAX_TENSORS)
          throw limit_error(path + ": more than " + std::to_string(OPT_MAX_TENSORS) + " tensors (OPT_MAX_TENSORS)");
        if (!v.is_object()) throw format_error(path + ": tensor '" + key + "' must be described by an object");
        TensorView t;
        t.name = key;
        t.file = path;
        bool has_dtype = false, has_shape = false, has_offsets = false;
        uint64_t begin = 0, end = 0;
        for (auto tf : v.get_object()) {
          std::string_view tk = tf.key;
          simdjson::dom::element tv = tf.value;
          if (tk == "dtype") {
            if (!tv.is_string()) throw format_error(path + ": tensor '" + key + "' dtype must be a string");
            std::string_view ds = tv.get_string();
            auto d = dtype_from_string(ds);
            if (!d) throw format_error(path + ": tensor '" + key + "' has unknown dtype '" + std::string(ds) + "'");
            t.type = *d;
            has_dtype = true;
          } else if (tk == "shape") {
            if (!tv.is_array()) throw format_error(path + ": tensor '" + key + "' shape must be an array");
            for (auto dim : tv.get_array()) {
              if (!dim.is_int64() && !dim.is_uint64())
                throw format_error(path + ": tensor '" + key + "' shape must hold integers");
              if (dim.is_uint64() && !dim.is_int64())
                throw format_error(path + ": tensor '" + key + "' has a dimension beyond 2^63");
              int64_t d = dim.get_int64();
              if (d < 0)
                throw format_error(path + ": tensor '" + key + "' has negative dimension " + std::to_string(d));
              if (t.shape.size() >= 16) throw format_error(path + ": tensor '" + key + "' has more than 16 dimensions");
              t.shape.push_back(d);
            }
            has_shape = true;
          } else if (tk == "data_offsets") {
            if (!tv.is_array()) throw format_error(path + ": tensor '" + key + "' data_offsets must be an array");
            int k = 0;
            for (auto o : tv.get_array()) {
              if (!o.is_uint64())
                throw format_error(path + ": tensor '" + key + "' data_offsets must hold non-negative integers");
              uint64_t x = o.get_uint64();
              if (k == 0) begin = x;
              else if (k == 1) end = x;
              ++k;
            }
            if (k != 2)
              throw format_error(path + ": tensor '" + key + "' data_offsets must hold 2 numbers, found " +
                                 std::to_string(k));
            has_offsets = true;
          } else {
            throw format_error(path + ": tensor '" + key + "' has unexpected key '" + std::string(tk) + "'");
          }
        }
        if (!has_dtype || !has_shape || !has_offsets)
          throw format_error(path + ": tensor '" + key + "' lacks " +
                             (!has_dtype ? "dtype" : !has_shape ? "shape" : "data_offsets"));
        if (begin > end || end > data_size)
          throw format_error(path + ": tensor '" + key + "' data_offsets [" + std::to_string(begin) + ", " +
                             std::to_string(end) + "] are outside the data section of " +
                             std::to_string(data_size) + " bytes");
        // numel * element size, with overflow checks
        uint64_t bytes = dtype_size(t.type);
        for (int64_t d : t.shape) {
          if (d != 0 && bytes > UINT64_MAX / uint64_t(d))
            throw format_error(path + ": tensor '" + key + "' shape " + shape_string(t.shape) + " overflows");
          bytes *= uint64_t(d);
        }
        if (bytes != end - begin)
          throw format_error(path + ": tensor '" + key + "' is " + to_string(t.type) + " " + shape_string(t.shape) +
                             " = " + std::to_string(bytes) + " bytes, but data_offsets span " +
                             std::to_string(end - begin) + " bytes");
        t.data = data + begin;
        t.nbytes = size_t(bytes);
        spans.push_back({size_t(begin), size_t(end), tensors_.size()});
        index_[key] = tensors_.size();
        tensors_.push_back(std::move(t));
      }
    } catch (const simdjson::simdjson_error& e) {
      throw format_error(path + ": malformed JSON header: " + e.what());
    }
    // Empty tensors take no bytes and overlap nothing; each non-empty span must start at or after the furthest
    // end seen so far (comparing neighbours only would miss A=[0,100) and C=[50,60) around an empty B=[10,10)).
    std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
    const Span* furthest = nullptr;
    for (const Span& b : spans) {
      if (b.end == b.begin) continue;
      if (furthest && b.begin < furthest->end)
        throw format_error(path + ": tensors '" + tensors_[furthest->idx].name + "' and '" + tensors_[b.idx].name +
                           "' overlap (bytes " + std::to_string(b.begin) + ".." +
                           std::to_string(std::min(furthest->end, b.end)) + ")");
      if (!furthest || b.end > furthest->end) furthest = &b;
    }
  }

  std::shared_ptr<detail::MappedFile> map_;
  std::shared_ptr<std::string> owned_;
  std::string path_;
  std::vector<TensorView> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

namespace detail {
// The "weight_map" of a shard index (*.index.json) held in memory: shard file -> tensor names. Shard names must
// be plain file names inside the checkpoint directory. `source` prefixes messages.
inline std::map<std::string, std::vector<std::string>> parse_weight_map(std::string_view json,
                                                                        const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json.begin(), json.end());
  } catch (const nlohmann::json::exception& e) {
    throw format_error(source + ": malformed JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw format_error(source + ": expected an object with a \"weight_map\" object");
  std::map<std::string, std::vector<std::string>> by_file;
  for (auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string()) throw format_error(source + ": weight_map[\"" + name + "\"] must be a file name");
    std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f.find('\\') != std::string::npos || f == "." || f == "..")
      throw format_error(source + ": weight_map[\"" + name + "\"] = \"" + f + "\" is not a plain file name");
    by_file[f].push_back(name);
  }
  return by_file;
}

// The same, read from the file `index`.
inline std::map<std::string, std::vector<std::string>> read_weight_map(const std::filesystem::path& index) {
  std::error_code ec;
  if (std::filesystem::is_directory(index, ec)) throw io_error(index.string() + ": is a directory, expected a JSON file");
  if (std::filesystem::exists(index, ec) && !std::filesystem::is_regular_file(index, ec))
    throw io_error(index.string() + ": not a regular file");
  std::ifstream in(index, std::ios::binary);
  if (!in) throw io_error(index.string() + ": cannot open");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw io_error(index.string() + ": read failed");
  return parse_weight_map(text, index.string());
}
}  // namespace detail

namespace detail {
// The files of one checkpoint (a single file, or the shards an index lists) with one name -> tensor map across
// them; names must be unique across the shards. File is SafetensorsFile or PytorchFile.
template <class File>
class ShardSet {
 public:
  const TensorView* find(std::string_view name) const {
    auto it = index_.find(std::string(name));
    return it == index_.end() ? nullptr : it->second;
  }
  // Every tensor of every file, in file order.
  std::vector<const TensorView*> tensors() const {
    std::vector<const TensorView*> v;
    for (auto& f : files_)
      for (auto& t : f.tensors()) v.push_back(&t);
    return v;
  }
  const std::vector<File>& files() const noexcept { return files_; }
  void add(File f) {
    files_.push_back(std::move(f));
    index_.clear();  // views point into the files, which moved only as handles: rebuild the name map
    for (auto& file : files_)
      for (auto& t : file.tensors()) {
        auto [it, fresh] = index_.emplace(t.name, &t);
        if (!fresh) throw format_error(t.file + ": tensor '" + t.name + "' is also in " + it->second->file);
      }
  }

 protected:
  // dir/single, or else the shards listed by dir/index (each listed name must be in its shard).
  template <class Open>
  void open_dir(const std::filesystem::path& dir, const char* single, const char* index, Open&& open_file) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path one = dir / single, idx = dir / index;
    if (fs::exists(one, ec)) {
      add(open_file(one));
      return;
    }
    if (!fs::exists(idx, ec))
      throw io_error(dir.string() + ": found neither " + single + " nor " + index);
    for (auto& [file, names] : read_weight_map(idx)) {
      add(open_file(dir / file));
      const File& f = files_.back();
      for (auto& n : names)
        if (!f.find(n)) throw tensor_error(idx.string() + ": weight_map puts '" + n + "' in " + file + ", which lacks it");
    }
  }

 private:
  std::vector<File> files_;
  std::unordered_map<std::string, const TensorView*> index_;
};
}  // namespace detail

// A checkpoint: one model.safetensors, or shards listed by model.safetensors.index.json.
class Checkpoint : public detail::ShardSet<SafetensorsFile> {
 public:
  // `path` is a directory holding model.safetensors or model.safetensors.index.json, or a .safetensors file.
  static Checkpoint open(const std::filesystem::path& path) {
    namespace fs = std::filesystem;
    Checkpoint c;
    std::error_code ec;
    if (fs::is_regular_file(path, ec) && path.extension() == ".safetensors") {
      c.add(SafetensorsFile::open(path));
      return c;
    }
    if (!fs::is_directory(path, ec)) throw io_error(path.string() + ": no such model directory");
    c.open_dir(path, "model.safetensors", "model.safetensors.index.json",
               [](const fs::path& p) { return SafetensorsFile::open(p); });
    return c;
  }
};

// ---- writing ---------------------------------------------------------------------------------------------
struct TensorData {
  std::string name;
  dtype type = dtype::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // numel * dtype_size bytes
};

// The header block of a safetensors file holding `tensors` in the given order: the u64 length and the JSON,
// padded with spaces so the block is a multiple of `align` bytes (8, or 64 so that data a multiple of 64 bytes
// from the data start is 64-byte aligned in a mapping). The data follows it, tensor after tensor, without holes.
inline std::string safetensors_header(const std::vector<TensorData>& tensors,
                                      const std::map<std::string, std::string>& metadata = {}, size_t align = 8) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  size_t off = 0;
  for (auto& t : tensors) {
    size_t n = dtype_size(t.type);
    for (int64_t d : t.shape) {
      if (d < 0) throw input_error("safetensors writer: tensor '" + t.name + "' has a negative dimension");
      n *= size_t(d);
    }
    h[t.name] = {{"dtype", to_string(t.type)}, {"shape", t.shape}, {"data_offsets", {off, off + n}}};
    off += n;
  }
  std::string json = h.dump();
  if (align < 8 || align % 8) throw input_error("safetensors writer: alignment " + std::to_string(align) +
                                                " is not a multiple of 8");
  while ((8 + json.size()) % align) json.push_back(' ');
  std::string out;
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out.push_back(char((n >> (8 * i)) & 0xff));
  return out + json;
}

inline size_t tensor_nbytes(const TensorData& t) {
  size_t n = dtype_size(t.type);
  for (int64_t d : t.shape) n *= size_t(d);
  return n;
}

// The whole file in memory (tests, small files).
inline std::string safetensors_bytes(const std::vector<TensorData>& tensors,
                                     const std::map<std::string, std::string>& metadata = {}) {
  std::string out = safetensors_header(tensors, metadata);
  for (auto& t : tensors) out.append(static_cast<const char*>(t.data), tensor_nbytes(t));
  return out;
}

// ---- shards, as transformers writes them ------------------------------------------------------------------------
// Where each shard starts, for tensors of the given sizes in order: a new shard begins when the next tensor would
// take the current one past max_bytes (a tensor larger than that gets a shard of its own; 0: one shard). The last
// entry is the tensor count, so shard s holds [starts[s], starts[s + 1]).
inline std::vector<size_t> shard_starts(const std::vector<uint64_t>& bytes, uint64_t max_bytes) {
  std::vector<size_t> starts{0};
  uint64_t cur = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (max_bytes > 0 && cur > 0 && cur + bytes[i] > max_bytes) {
      starts.push_back(i);
      cur = 0;
    }
    cur += bytes[i];
  }
  starts.push_back(bytes.size());
  return starts;
}

// "model-00001-of-00003.safetensors" for shard i (from 1) of n.
inline std::string shard_file_name(size_t i, size_t n) {
  auto pad = [](size_t v) {
    std::string s = std::to_string(v);
    return std::string(s.size() < 5 ? 5 - s.size() : 0, '0') + s;
  };
  return "model-" + pad(i) + "-of-" + pad(n) + ".safetensors";
}

// Writes a model.safetensors.index.json: {"metadata": {"total_size": ...}, "weight_map": {tensor: shard file}}.
inline void write_shard_index(const std::filesystem::path& path, const nlohmann::ordered_json& weight_map,
                              uint64_t total_size) {
  const nlohmann::ordered_json j = {{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw io_error(path.string() + ": cannot open for writing");
  out << j.dump(2) << '\n';
  out.flush();
  if (!out) throw io_error(path.string() + ": write failed");
}

// Streams the file to disk without building it in memory (header block padded to a multiple of `align`).
inline void save_safetensors(const std::filesystem::path& path, const std::vector<TensorData>& tensors,
                             const std::map<std::string, std::string>& metadata = {}, size_t align = 8) {
  std::string header = safetensors_header(tensors, metadata, align);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw io_error(path.string() + ": cannot open for writing");
  out.write(header.data(), std::streamsize(header.size()));
  for (auto& t : tensors) out.write(static_cast<const char*>(t.data), std::streamsize(tensor_nbytes(t)));
  out.flush();
  if (!out) throw io_error(path.string() + ": write failed");
}

OPT_NAMESPACE_END
