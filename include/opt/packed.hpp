// The stored packed-weight format: a model folder whose linear weights are already in the kernels' panel layout
// (PackedMatrix, kernels/matrix.hpp), quantized or not, so Model::load binds them straight into the file mapping
// (no copy, no quantizing at load). Here: its names and metadata, the checks a loader makes, the pack step, and a
// streaming writer (one tensor in memory at a time) used by convert_packed() and by random checkpoints.
//
// Format, version 2 (a valid safetensors checkpoint: model.safetensors, or shards + model.safetensors.index.json):
//   __metadata__ of every file:
//     "format": "pt", "opt.format": "packed", "opt.format_version": "2", "opt.panel_rows": "16" (ops::kPanel),
//     "opt.weight_group", "opt.lm_head_group": panels interleaved column by column in the linear weights' and the
//                             LM head's matrices (PackedMatrix::group; this build writes ops::panel_group(type):
//                             4 for I8 / I4, 2 for the float types, and reads any group from 1 to 64)
//     "opt.weight_type":  F32 | F16 | BF16 | I8 | I4   the linear weights' panels
//     "opt.weight_block": columns per scale (I8: 128 = ops::kQ8Block); "0" for the float types
//     "opt.lm_head_type", "opt.lm_head_block": the same for the tied LM head
//   <W>.panels  U8  [round_up(value_bytes, 64)]  the PackedMatrix value bytes (PackedMatrix::value_bytes(), the
//                                               last panel's padding rows included), then zeros to a multiple of 64
//   <W>.scales  F32 [scale_count]                the f32 scales (PackedMatrix::scale_count()); I8 / I4 only
//   for W = <prefix>layers.<i>.self_attn.{q,k,v,out}_proj.weight, <prefix>layers.<i>.fc1.weight, .fc2.weight,
//   <prefix>project_in.weight, <prefix>project_out.weight, and lm_head.weight (the tied LM head: embed_tokens'
//   values, packed). Every other tensor (embed_tokens, embed_positions, LayerNorms, biases) is stored as usual.
//   Alignment: each file's header block is padded to a multiple of 64 bytes and its tensors whose size is a
//   multiple of 64 (every .panels and .scales) come first, so each of those starts 64-byte aligned in a mapping.
//   The data has no holes, as safetensors requires.
// Version 1 (written before the panels were grouped) is version 2 without the two group keys: group 1, panel after
// panel. It still loads and gives the same bits; its decode reads each panel as a separate stream (slower).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "opt/error.hpp"
#include "opt/ops.hpp"
#include "opt/pytorch.hpp"
#include "opt/quantize.hpp"
#include "opt/safetensors.hpp"
#include "opt/thread_pool.hpp"

OPT_NAMESPACE_BEGIN

constexpr const char* kPackedFormatVersion = "2";
constexpr int64_t kPackedMaxGroup = 64;  // the largest opt.weight_group / opt.lm_head_group a reader accepts
constexpr size_t kPackedAlign = 64;  // bytes: a cache line, one AVX-512 vector; what PackedWeights allocates

inline std::string packed_panels_name(const std::string& weight) { return weight + ".panels"; }
inline std::string packed_scales_name(const std::string& weight) { return weight + ".scales"; }
inline size_t packed_padded_bytes(size_t n) { return (n + kPackedAlign - 1) / kPackedAlign * kPackedAlign; }

// The columns per scale this build's quantizer and kernels use for a packed type (0 for the float types), or
// nullopt with *why set for a type this build cannot run.
inline std::optional<int64_t> packed_block_of(dtype t, std::string* why = nullptr) {
  switch (t) {
    case dtype::F32: case dtype::F16: case dtype::BF16: return 0;
    case dtype::I8: return ops::kQ8Block;
    case dtype::I4: return ops::kQ4Block;
    default:
      if (why) *why = std::string(to_string(t)) + " is not a packed weight type (expected F32, F16, BF16, I8 or I4)";
      return std::nullopt;
  }
}
// The same, throwing input_error prefixed by `who` for a type this build cannot run.
inline int64_t packed_block(dtype t, const std::string& who) {
  std::string why;
  const std::optional<int64_t> b = packed_block_of(t, &why);
  if (!b) throw input_error(who + ": " + why);
  return *b;
}

// How a folder's linear weights and LM head are packed: the opt.* keys of __metadata__.
struct PackedScheme {
  dtype weight = dtype::I8;
  int64_t weight_block = ops::kQ8Block;
  dtype lm_head = dtype::F32;
  int64_t lm_head_block = 0;
  // PackedMatrix::group of the weights' and the LM head's matrices; 0: ops::panel_group of the type (what this
  // build writes); 1 in a version-1 folder
  int64_t weight_group = 0, lm_head_group = 0;
  int64_t weight_group_or_default() const noexcept { return weight_group ? weight_group : ops::panel_group(weight); }
  int64_t lm_head_group_or_default() const noexcept {
    return lm_head_group ? lm_head_group : ops::panel_group(lm_head);
  }

  std::map<std::string, std::string> metadata() const {
    return {{"format", "pt"},
            {"opt.format", "packed"},
            {"opt.format_version", kPackedFormatVersion},
            {"opt.panel_rows", std::to_string(ops::kPanel)},
            {"opt.weight_group", std::to_string(weight_group_or_default())},
            {"opt.lm_head_group", std::to_string(lm_head_group_or_default())},
            {"opt.weight_type", to_string(weight)},
            {"opt.weight_block", std::to_string(weight_block)},
            {"opt.lm_head_type", to_string(lm_head)},
            {"opt.lm_head_block", std::to_string(lm_head_block)}};
  }
  bool operator==(const PackedScheme& o) const noexcept {
    return weight == o.weight && weight_block == o.weight_block && lm_head == o.lm_head &&
           lm_head_block == o.lm_head_block && weight_group_or_default() == o.weight_group_or_default() &&
           lm_head_group_or_default() == o.lm_head_group_or_default();
  }
  bool operator!=(const PackedScheme& o) const noexcept { return !(*this == o); }
  std::string describe() const {
    auto one = [](dtype t, int64_t b) {
      return std::string(to_string(t)) + (ops::has_scales(t) ? " (block " + std::to_string(b) + ")" : "");
    };
    std::string d = "weights " + one(weight, weight_block) + ", LM head " + one(lm_head, lm_head_block);
    const int64_t wg = weight_group_or_default(), hg = lm_head_group_or_default();
    if (wg != ops::panel_group(weight) || hg != ops::panel_group(lm_head))  // only where not this build's own
      d += " (in panel groups of " + std::to_string(wg) + " and " + std::to_string(hg) + ")";
    return d;
  }

  // The scheme a file's metadata declares: nullopt when it has no "opt.format" (an ordinary checkpoint); throws
  // format_error naming the file and key for a version, panel size, type or block this build does not read.
  static std::optional<PackedScheme> from_metadata(const std::map<std::string, std::string>& md,
                                                   const std::string& file) {
    auto it = md.find("opt.format");
    if (it == md.end()) return std::nullopt;
    auto key = [&](const std::string& k) -> const std::string& {
      auto f = md.find(k);
      if (f == md.end()) throw format_error(file + ": __metadata__ has opt.format but lacks \"" + k + "\"");
      return f->second;
    };
    auto expect = [&](const std::string& k, const std::string& want) {
      const std::string& v = key(k);
      if (v != want)
        throw format_error(file + ": __metadata__[\"" + k + "\"] is \"" + v + "\", expected \"" + want + "\"");
    };
    expect("opt.format", "packed");
    const std::string& version = key("opt.format_version");
    if (version != "1" && version != kPackedFormatVersion)
      throw format_error(file + ": __metadata__[\"opt.format_version\"] is \"" + version + "\", expected \"1\" or \"" +
                         kPackedFormatVersion + "\"");
    expect("opt.panel_rows", std::to_string(ops::kPanel));
    // "opt.weight_group" / "opt.lm_head_group": 1 in version 1, which has neither
    auto group = [&](const std::string& k) -> int64_t {
      if (version == "1") return 1;
      const std::string& g = key(k);
      int64_t v = 0;
      for (char ch : g) v = ch >= '0' && ch <= '9' && v <= kPackedMaxGroup ? v * 10 + (ch - '0') : -1;
      if (g.empty() || g.size() > 3 || v < 1 || v > kPackedMaxGroup)
        throw format_error(file + ": __metadata__[\"" + k + "\"] is \"" + g + "\", expected an integer from 1 to " +
                           std::to_string(kPackedMaxGroup));
      return v;
    };
    auto type = [&](const std::string& k) {
      const std::string& v = key(k);
      const std::optional<dtype> t = v == "I4" ? std::optional<dtype>(dtype::I4) : dtype_from_string(v);
      if (!t || !(*t == dtype::F32 || *t == dtype::F16 || *t == dtype::BF16 || *t == dtype::I8 || *t == dtype::I4))
        throw format_error(file + ": __metadata__[\"" + k + "\"] is \"" + v +
                           "\", expected one of F32, F16, BF16, I8, I4");
      return *t;
    };
    auto block = [&](const std::string& type_key, const std::string& k, dtype t) {
      std::string why;
      const std::optional<int64_t> want = packed_block_of(t, &why);
      if (!want) throw format_error(file + ": __metadata__[\"" + type_key + "\"]: " + why);
      expect(k, std::to_string(*want));
      return *want;
    };
    PackedScheme s;
    s.weight = type("opt.weight_type");
    s.weight_block = block("opt.weight_type", "opt.weight_block", s.weight);
    s.lm_head = type("opt.lm_head_type");
    s.lm_head_block = block("opt.lm_head_type", "opt.lm_head_block", s.lm_head);
    s.weight_group = group("opt.weight_group");
    s.lm_head_group = group("opt.lm_head_group");
    return s;
  }
};

// A [rows, cols] matrix of type t in panels (groups of `group`), without data: value_bytes() and scale_count() are
// its stored sizes.
inline PackedMatrix packed_layout(dtype t, int64_t block, int64_t rows, int64_t cols, int64_t group) {
  PackedMatrix m;
  m.type = t, m.rows = rows, m.cols = cols, m.block = ops::has_scales(t) ? block : 0, m.group = group;
  return m;
}

// The stored matrix `weight` (its .panels and, for I8 / I4, .scales tensors) as a PackedMatrix viewing the
// mapping, after checking dtype, shape, size against the [rows, cols] config.json gives, and 64-byte alignment.
// Throws tensor_error naming the tensor, what was expected and what was found.
inline PackedMatrix packed_view(const std::string& weight, const TensorView& panels, const TensorView* scales,
                                dtype t, int64_t block, int64_t rows, int64_t cols, int64_t group) {
  PackedMatrix m = packed_layout(t, block, rows, cols, group);
  const std::string what = " (" + std::string(to_string(t)) + " [" + std::to_string(rows) + ", " +
                           std::to_string(cols) + "] in panels of " + std::to_string(ops::kPanel) + " rows)";
  auto check = [&](const TensorView& v, dtype want, size_t numel, const char* kind) {
    if (v.type != want)
      throw tensor_error(v.file + ": tensor '" + v.name + "' has dtype " + to_string(v.type) + ", expected " +
                         to_string(want) + " (the " + kind + " of " + weight + what + ")");
    if (v.shape != std::vector<int64_t>{int64_t(numel)})
      throw tensor_error(v.file + ": tensor '" + v.name + "' has shape " + shape_string(v.shape) + ", expected [" +
                         std::to_string(numel) + "] (the " + kind + " of " + weight + what + " from config.json)");
    if (reinterpret_cast<uintptr_t>(v.data) % kPackedAlign != 0)
      throw tensor_error(v.file + ": tensor '" + v.name + "' is not " + std::to_string(kPackedAlign) +
                         "-byte aligned in the file (address mod " + std::to_string(kPackedAlign) + " = " +
                         std::to_string(reinterpret_cast<uintptr_t>(v.data) % kPackedAlign) +
                         "); the kernels read it in place");
  };
  check(panels, dtype::U8, packed_padded_bytes(m.value_bytes()), "panel bytes");
  m.data = panels.data;
  if (ops::has_scales(t)) {
    if (!scales) throw tensor_error(panels.file + ": missing tensor '" + packed_scales_name(weight) + "'" + what);
    check(*scales, dtype::F32, m.scale_count(), "scales");
    m.scale = reinterpret_cast<const float*>(scales->data);
  }
  return m;
}

// src (F32, F16 or BF16, row-major) in panels of type `to`: a float type is src's own (the caller casts first),
// I8 / I4 quantize (quantize_int8 / quantize_int4, as LoadOptions::quantize does at load) and pack.
inline PackedWeights pack_as(const MatrixRef& src, dtype to, ThreadPool* pool) {
  (void)packed_block(to, "pack");
  if (to == dtype::I8) return ops::pack(quantize_int8(src, pool).ref(), pool);
  if (to == dtype::I4) return ops::pack(quantize_int4(src, pool).ref(), pool);
  if (src.type != to)
    throw input_error(std::string("pack: a ") + to_string(src.type) + " matrix cannot be packed as " + to_string(to) +
                      " (cast it first)");
  return ops::pack(src, pool);
}

// ---- writing -----------------------------------------------------------------------------------------------

// Tensors written together, known by name, type and shape before their bytes exist: one plain tensor, or a packed
// weight's panels and scales. produce() computes them and passes their bytes to emit, in order and in full.
struct WriteJob {
  std::vector<TensorData> tensors;  // data unused
  std::function<void(const std::function<void(const void*, size_t)>& emit)> produce;
  uint64_t bytes() const {
    uint64_t n = 0;
    for (const TensorData& t : tensors) n += tensor_nbytes(t);
    return n;
  }
};

// The job writing W's panels (and scales) as packed type t with the given producer of the PackedWeights.
inline WriteJob packed_job(const std::string& weight, dtype t, int64_t rows, int64_t cols,
                           std::function<PackedWeights()> make) {
  const PackedMatrix m = packed_layout(t, packed_block(t, weight), rows, cols, ops::panel_group(t));
  WriteJob j;
  j.tensors.push_back({packed_panels_name(weight), dtype::U8, {int64_t(packed_padded_bytes(m.value_bytes()))}, {}});
  if (ops::has_scales(t))
    j.tensors.push_back({packed_scales_name(weight), dtype::F32, {int64_t(m.scale_count())}, nullptr});
  j.produce = [weight, m, make = std::move(make)](const std::function<void(const void*, size_t)>& emit) {
    const PackedWeights w = make();
    const PackedMatrix& v = w.view();
    if (v.type != m.type || v.rows != m.rows || v.cols != m.cols || v.block != m.block || v.group != m.group ||
        w.values.size() < m.value_bytes() || w.scales.size() != m.scale_count())
      throw input_error("packed writer: '" + weight + "' was packed to an unexpected layout");
    emit(w.values.data(), m.value_bytes());
    static const std::byte zeros[kPackedAlign] = {};
    emit(zeros, packed_padded_bytes(m.value_bytes()) - m.value_bytes());
    if (m.scale_count()) emit(w.scales.data(), m.scale_count() * 4);
  };
  return j;
}

struct WriteResult {
  std::vector<std::filesystem::path> written;  // shards (or model.safetensors) and the index
  uint64_t bytes = 0;                          // tensor data
  size_t tensors = 0;
};

// Writes the jobs as dir/model.safetensors, or, beyond max_shard_bytes of data (0: never), as shards
// model-0000k-of-0000n.safetensors plus model.safetensors.index.json, each file written to a temporary name and
// renamed when complete, with `metadata` and the alignment the packed format needs. Jobs run one at a time, in
// order within each shard (those whose tensors are all multiples of 64 bytes first), so memory holds one job's
// tensors. A stale file of the other form (single / index) is removed.
inline WriteResult write_jobs(const std::filesystem::path& dir, const std::vector<WriteJob>& jobs,
                              const std::map<std::string, std::string>& metadata, uint64_t max_shard_bytes) {
  namespace fs = std::filesystem;
  WriteResult r;
  std::vector<uint64_t> sizes;
  for (const WriteJob& j : jobs) r.bytes += sizes.emplace_back(j.bytes()), r.tensors += j.tensors.size();
  const std::vector<size_t> starts = shard_starts(sizes, max_shard_bytes);
  const size_t n = starts.size() - 1;
  auto name = [&](size_t k) { return n == 1 ? std::string("model.safetensors") : shard_file_name(k + 1, n); };
  std::error_code ec;
  fs::remove(dir / "model.safetensors.index.json", ec);
  if (n > 1) fs::remove(dir / "model.safetensors", ec);
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (size_t k = 0; k < n; ++k) {
    std::vector<size_t> order;
    for (int aligned = 1; aligned >= 0; --aligned)
      for (size_t i = starts[k]; i < starts[k + 1]; ++i) {
        bool all = true;
        for (const TensorData& t : jobs[i].tensors) all = all && tensor_nbytes(t) % kPackedAlign == 0;
        if (all == bool(aligned)) order.push_back(i);
      }
    std::vector<TensorData> desc;
    for (size_t i : order)
      for (const TensorData& t : jobs[i].tensors) {
        desc.push_back(t);
        weight_map[t.name] = name(k);
      }
    const std::string header = safetensors_header(desc, metadata, kPackedAlign);
    const fs::path path = dir / name(k);
    fs::path tmp = path;
    tmp += ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      if (!out) throw io_error(tmp.string() + ": cannot open for writing");
      out.write(header.data(), std::streamsize(header.size()));
      for (size_t i : order) {
        uint64_t wrote = 0;
        jobs[i].produce([&](const void* p, size_t b) {
          out.write(static_cast<const char*>(p), std::streamsize(b));
          wrote += b;
        });
        if (wrote != sizes[i])
          throw input_error("packed writer: '" + jobs[i].tensors.front().name + "' produced " + std::to_string(wrote) +
                            " bytes, its header says " + std::to_string(sizes[i]));
      }
      out.flush();
      if (!out) {
        out.close();
        fs::remove(tmp, ec);
        throw io_error(tmp.string() + ": write failed (disk full?)");
      }
    }
    fs::rename(tmp, path, ec);
    if (ec)
      throw io_error(path.string() + ": cannot rename " + tmp.filename().string() + " into place: " + ec.message());
    r.written.push_back(path);
  }
  if (n > 1) {
    write_shard_index(dir / "model.safetensors.index.json", weight_map, r.bytes);
    r.written.push_back(dir / "model.safetensors.index.json");
  }
  return r;
}

// ---- conversion ----------------------------------------------------------------------------------------------

struct PackedConvertOptions {
  // The linear weights' packed type: I8 (or I4) quantizes; nullopt keeps their float type (after `cast`), only
  // repacked, which must then be one type for all of them.
  std::optional<dtype> quantize;
  // the LM head quantized too (I4 with quantize = I4, else I8), else packed in the embedding's float type (after
  // `cast`): what LoadOptions::quantize with quantize_lm_head (lm_head_int8) makes
  bool lm_head_int8 = false;
  std::optional<dtype> cast;   // every float tensor cast to F32, F16 or BF16 first (quantization reads the cast)
  uint64_t max_shard_bytes = 0;
  bool verify_crc = true;
};

namespace detail {
// Does `name` (a tensor of an OPT checkpoint) hold a linear weight the kernels run in panels?
inline bool is_linear_weight(const std::string& name) {
  auto ends = [&](const char* s) {
    const size_t n = std::strlen(s);
    return name.size() >= n && name.compare(name.size() - n, n, s) == 0;
  };
  if (ends("project_in.weight") || ends("project_out.weight")) return true;
  if (name.find("layers.") == std::string::npos) return false;
  for (const char* s : {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                        "self_attn.out_proj.weight", ".fc1.weight", ".fc2.weight"})
    if (ends(s)) return true;
  return false;
}

// t's values as a row-major matrix of type `to` (F32, F16 or BF16): a view of the mapping when t already is that
// type and aligned for it, else a converted copy in `buf`.
inline MatrixRef matrix_as(const TensorView& t, dtype to, std::vector<std::byte>& buf) {
  if (t.shape.size() != 2) throw tensor_error(t.file + ": tensor '" + t.name + "' has shape " + shape_string(t.shape) +
                                              ", expected a 2-D weight");
  if (!is_float(t.type))
    throw tensor_error(t.file + ": tensor '" + t.name + "' has dtype " + to_string(t.type) + ", expected a float type");
  const void* data = t.data;
  if (t.type != to || reinterpret_cast<uintptr_t>(t.data) % dtype_size(to) != 0) {
    const size_t n = t.numel(), in = dtype_size(t.type), out = dtype_size(to);
    buf.resize(n * out);
    for (size_t i = 0; i < n; ++i) store_float(to, load_float(t.type, t.data + i * in), buf.data() + i * out);
    data = buf.data();
  }
  return MatrixRef{to, data, t.shape[0], t.shape[1]};
}
}  // namespace detail

// Converts the checkpoint at `input` (anything convert_checkpoint reads: safetensors, one file or shards, or
// pytorch_model.bin) to the stored packed format in `output_dir`, with the side files (config.json, tokenizer).
// Holds one weight (its source, its quantized and packed forms) at a time besides the mapped input. lm_head.weight
// in the input is dropped (transformers ties it to embed_tokens; the packed LM head is made from embed_tokens).
inline ConvertResult convert_packed(const std::filesystem::path& input, const std::filesystem::path& output_dir,
                                    const PackedConvertOptions& opts = {}) {
  namespace fs = std::filesystem;
  if (opts.cast && *opts.cast != dtype::F32 && *opts.cast != dtype::F16 && *opts.cast != dtype::BF16)
    throw input_error(std::string("convert: cannot cast to ") + to_string(*opts.cast) + ", expected F32, F16 or BF16");
  if (opts.quantize) (void)packed_block(*opts.quantize, "convert");
  ConvertResult r;
  const detail::ConvertInput in = detail::open_convert_input(input, opts.verify_crc, r);
  std::vector<const TensorView*> tensors = in.tensors();
  if (tensors.empty()) throw tensor_error(input.string() + ": the checkpoint holds no tensors");
  std::error_code ec;
  fs::create_directories(output_dir, ec);
  if (!fs::is_directory(output_dir, ec))
    throw io_error(output_dir.string() + ": cannot create the output directory" + (ec ? ": " + ec.message() : ""));
  if (fs::equivalent(in.dir, output_dir, ec))
    throw input_error(output_dir.string() + ": is the input directory; convert into another one");
  std::sort(tensors.begin(), tensors.end(), [](const TensorView* a, const TensorView* b) { return a->name < b->name; });
  auto float_type = [&](const TensorView& t) { return opts.cast && detail::is_float(t.type) ? *opts.cast : t.type; };

  const TensorView* embed = nullptr;
  std::optional<dtype> linear_type;  // the linear weights' float type, for a float packing
  for (const TensorView* t : tensors) {
    const std::string& n = t->name;
    if (n.size() >= 19 && n.compare(n.size() - 19, 19, "embed_tokens.weight") == 0) embed = t;
    if (!detail::is_linear_weight(n)) continue;
    if (!detail::is_float(t->type) || float_type(*t) == dtype::F64 || t->shape.size() != 2)
      throw tensor_error(t->file + ": tensor '" + n + "' is " + to_string(t->type) + " " + shape_string(t->shape) +
                         ", expected a 2-D F32, F16 or BF16 weight (F64 needs a cast)");
    if (linear_type && *linear_type != float_type(*t) && !opts.quantize)
      throw input_error(t->file + ": tensor '" + n + "' is " + to_string(float_type(*t)) + ", others " +
                        to_string(*linear_type) + ": a float packing needs one type (pass a cast)");
    linear_type = float_type(*t);
  }
  if (!embed) throw tensor_error(input.string() + ": no embed_tokens.weight: not an OPT checkpoint");
  if (!linear_type)
    throw tensor_error(input.string() + ": no linear layer weights (q_proj, fc1, ...): not an OPT checkpoint");
  if (float_type(*embed) == dtype::F64) throw input_error(embed->file + ": F64 weights: pass a cast");
  PackedScheme scheme;
  scheme.weight = opts.quantize ? *opts.quantize : *linear_type;
  scheme.weight_block = packed_block(scheme.weight, "convert");
  scheme.lm_head = !opts.lm_head_int8 ? float_type(*embed) : opts.quantize == dtype::I4 ? dtype::I4 : dtype::I8;
  scheme.lm_head_block = packed_block(scheme.lm_head, "convert");

  ThreadPool pool;
  std::vector<WriteJob> jobs;
  auto pack_job = [&](const TensorView* t, const std::string& name, dtype to) {
    const dtype src = float_type(*t);
    jobs.push_back(packed_job(name, to, t->shape[0], t->shape[1], [t, src, to, &pool] {
      std::vector<std::byte> buf;
      return pack_as(detail::matrix_as(*t, src, buf), to, &pool);
    }));
  };
  for (const TensorView* t : tensors) {
    if (t->name == "lm_head.weight") continue;
    if (detail::is_linear_weight(t->name)) {
      pack_job(t, t->name, scheme.weight);
      continue;
    }
    WriteJob j;
    const dtype to = float_type(*t);
    j.tensors.push_back({t->name, to, t->shape, nullptr});
    j.produce = [t, to](const std::function<void(const void*, size_t)>& emit) {
      if (to == t->type) return emit(t->data, t->nbytes);
      constexpr size_t chunk = 1u << 16;
      const size_t n = t->numel(), in_size = dtype_size(t->type), out_size = dtype_size(to);
      std::vector<std::byte> buf(chunk * out_size);
      for (size_t i = 0; i < n; i += chunk) {
        const size_t m = std::min(chunk, n - i);
        for (size_t k = 0; k < m; ++k)
          detail::store_float(to, detail::load_float(t->type, t->data + (i + k) * in_size), &buf[k * out_size]);
        emit(buf.data(), m * out_size);
      }
    };
    jobs.push_back(std::move(j));
  }
  pack_job(embed, "lm_head.weight", scheme.lm_head);
  const WriteResult w = write_jobs(output_dir, jobs, scheme.metadata(), opts.max_shard_bytes);
  r.written = w.written;
  r.bytes = w.bytes;
  r.tensors = tensors.size();
  detail::copy_side_files(in.dir, output_dir, opts.cast, r);
  return r;
}

OPT_NAMESPACE_END
