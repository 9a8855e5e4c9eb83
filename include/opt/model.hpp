// opt::Model: OPTForCausalLM (transformers' modeling_opt.py) over weights loaded from a Hugging Face folder.
// The model is const after load and can be shared by many sequences and threads; everything mutable lives in
// caller-owned objects: a KvCache per sequence and a Workspace (scratch + thread pool) per calling thread.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <deque>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "opt/detail/eigen.hpp"

#include "opt/config.hpp"
#include "opt/error.hpp"
#include "opt/ops.hpp"
#include "opt/packed.hpp"
#include "opt/quantize.hpp"
#include "opt/pytorch.hpp"
#include "opt/safetensors.hpp"
#include "opt/thread_pool.hpp"

OPT_NAMESPACE_BEGIN

struct LinearWeights {
  MatrixRef weight;             // [out_features, in_features] as stored in the checkpoint (none when stored packed)
  PackedMatrix packed;          // the same in the kernels' panel layout (int8 / int4 when quantized): what runs
  const float* bias = nullptr;  // [out_features], null when enable_bias is false
};

struct LayerNormWeights {
  const float* weight = nullptr;  // [dim], null when layer_norm_elementwise_affine is false
  const float* bias = nullptr;    // [dim]
};

struct DecoderLayerWeights {
  LinearWeights q_proj, k_proj, v_proj, out_proj;  // [hidden, hidden]
  LayerNormWeights self_attn_layer_norm;           // [hidden]
  LinearWeights fc1;                               // [ffn_dim, hidden]
  LinearWeights fc2;                               // [hidden, ffn_dim]
  LayerNormWeights final_layer_norm;               // [hidden]
};

// The embed_positions row of a position (the count of real tokens before a token: cumsum(attention_mask) - 1, the
// cache size): OPT's learned positional embedding is offset by 2 (OPTLearnedPositionalEmbedding in transformers).
constexpr int64_t position_row(int64_t position) noexcept { return position + 2; }

struct ModelWeights {
  MatrixRef embed_tokens;             // [vocab, word_embed_proj_dim]; also the tied lm_head
  MatrixRef embed_positions;          // [max_position_embeddings + 2, hidden]
  MatrixRef project_in;               // [hidden, word_embed_proj_dim], only when the two differ
  MatrixRef project_out;              // [word_embed_proj_dim, hidden], only when the two differ
  PackedMatrix project_in_packed, project_out_packed;  // the two above in panels
  LayerNormWeights final_layer_norm;  // [hidden], only with do_layer_norm_before && !_remove_final_layer_norm
  std::vector<DecoderLayerWeights> layers;
  PackedMatrix lm_head_packed;        // [vocab, word_embed_proj_dim]: embed_tokens in panels (quantized with
                                      // LoadOptions::quantize_lm_head)
  const PackedMatrix& lm_head() const noexcept { return lm_head_packed; }
};

// What one tensor of the checkpoint should be: its name under the decoder (no prefix), its shape, and where it
// goes. The single list of tensors (for_each_tensor) drives loading, shape checks and missing/unexpected reports.
struct TensorSlot {
  std::string name;
  std::vector<int64_t> shape;
  MatrixRef* matrix = nullptr;  // 2-D weights stay in their stored dtype (F32/F16/BF16)
  const float** vec = nullptr;  // 1-D parameters are held as float
  PackedMatrix* packed = nullptr;  // linear weights: their panels (a stored packed folder has only these, packed.hpp)
  int64_t layer = -1;        // the decoder layer it belongs to; -1: none (the embeddings or the head)
  bool embeddings = false;   // part of the embeddings (embed_tokens, embed_positions, project_in)
  bool head = false;         // part of the head (final_layer_norm, project_out, embed_tokens as the tied LM head)
};

template <class F>
void for_each_tensor(const Config& c, ModelWeights& w, F&& visit) {
  const int64_t H = c.hidden_size, E = c.word_embed_proj_dim, V = c.vocab_size, F_ = c.ffn_dim;
  int64_t layer = -1;
  bool embeddings = false, head = false;
  const auto part = [&](TensorSlot s) {
    s.layer = layer, s.embeddings = embeddings, s.head = head;
    visit(s);
  };
  embeddings = head = true;
  part(TensorSlot{"embed_tokens.weight", {V, E}, &w.embed_tokens, nullptr});
  head = false;
  part(TensorSlot{"embed_positions.weight", {c.max_position_embeddings + 2, H}, &w.embed_positions, nullptr});
  if (c.has_projections()) {
    part(TensorSlot{"project_in.weight", {H, E}, &w.project_in, nullptr, &w.project_in_packed});
    embeddings = false, head = true;
    part(TensorSlot{"project_out.weight", {E, H}, &w.project_out, nullptr, &w.project_out_packed});
  }
  embeddings = false, head = true;
  auto ln = [&](const std::string& name, LayerNormWeights& l) {
    if (!c.layer_norm_elementwise_affine) return;
    part(TensorSlot{name + ".weight", {H}, nullptr, &l.weight});
    part(TensorSlot{name + ".bias", {H}, nullptr, &l.bias});
  };
  auto lin = [&](const std::string& name, LinearWeights& l, int64_t out, int64_t in) {
    part(TensorSlot{name + ".weight", {out, in}, &l.weight, nullptr, &l.packed});
    if (c.enable_bias) part(TensorSlot{name + ".bias", {out}, nullptr, &l.bias});
  };
  if (c.has_final_layer_norm()) ln("final_layer_norm", w.final_layer_norm);
  head = false;
  w.layers.resize(size_t(c.num_hidden_layers));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    layer = i;
    const std::string p = "layers." + std::to_string(i) + ".";
    DecoderLayerWeights& L = w.layers[size_t(i)];
    lin(p + "self_attn.q_proj", L.q_proj, H, H);
    lin(p + "self_attn.k_proj", L.k_proj, H, H);
    lin(p + "self_attn.v_proj", L.v_proj, H, H);
    lin(p + "self_attn.out_proj", L.out_proj, H, H);
    ln(p + "self_attn_layer_norm", L.self_attn_layer_norm);
    lin(p + "fc1", L.fc1, F_, H);
    lin(p + "fc2", L.fc2, H, F_);
    ln(p + "final_layer_norm", L.final_layer_norm);
  }
}

// The element types a KvCache may hold, by the name the command-line programs take: "f32" (the default: exact),
// "f16" or "bf16" (half the bytes; each key and value rounded to nearest even as it is stored, widened exactly
// as attention reads it). A config_error names the choices for any other name.
inline dtype kv_cache_type_from_string(std::string_view s) {
  if (s == "f32") return dtype::F32;
  if (s == "f16") return dtype::F16;
  if (s == "bf16") return dtype::BF16;
  throw config_error("unknown KV cache type '" + std::string(s) + "' (expected f32, f16 or bf16)");
}
inline const char* kv_cache_type_name(dtype t) noexcept {
  return t == dtype::F32 ? "f32" : t == dtype::F16 ? "f16" : t == dtype::BF16 ? "bf16" : "?";
}

// Decoder layers [first, last) (last = -1: to the end): the part of the model a pipeline stage holds.
struct LayerRange {
  int64_t first = 0, last = -1;
  int64_t size() const noexcept { return last - first; }
  bool operator==(const LayerRange& o) const noexcept { return first == o.first && last == o.last; }
};

// Per-sequence attention state: the keys and values of every position seen so far, for every layer, as F32
// (default), F16 or BF16 elements.
class KvCache {
 public:
  KvCache() = default;
  // Room for `capacity` positions (default: the model's context, max_position_embeddings) of element type `type`
  // (F32, F16 or BF16; an input_error otherwise).
  // `layers`: the decoder layers it holds (default: all; a pipeline stage's cache holds its Model's layers()).
  // Its memory is not zeroed (each position is written before it is read: a page is committed when a position
  // first lands on it) and, with `huge_pages` (the default), asks for huge pages: attention reads them faster
  // (an opt-125m decode at 1900 positions read its 140 MB of keys and values in 3.5 ms against 4.3-4.9 ms), but
  // a fresh huge page can cost far more to commit (a VM took 680 ms for 100 MB against 35-47 ms), which matters
  // for a cache made and grown often (ModelDrafter's) more than it does for its reads.
  explicit KvCache(const Config& c, int64_t capacity = 0, dtype type = dtype::F32, LayerRange layers = {},
                   bool huge_pages = true)
      : k_(detail::LazyAllocator<std::byte>(huge_pages)), v_(detail::LazyAllocator<std::byte>(huge_pages)) {
    if (capacity <= 0) capacity = c.max_position_embeddings;
    if (capacity > c.max_position_embeddings)
      throw input_error("KvCache: capacity " + std::to_string(capacity) + " exceeds max_position_embeddings " +
                        std::to_string(c.max_position_embeddings));
    if (!ops::attention_cache_type(type))
      throw input_error(std::string("KvCache: element type ") + to_string(type) + " (expected F32, F16 or BF16)");
    if (layers.last < 0) layers.last = c.num_hidden_layers;
    if (layers.first < 0 || layers.first > layers.last || layers.last > c.num_hidden_layers)
      throw input_error("KvCache: layers [" + std::to_string(layers.first) + ", " + std::to_string(layers.last) +
                        ") of a model of " + std::to_string(c.num_hidden_layers));
    model_layers_ = c.num_hidden_layers;
    first_ = layers.first;
    layers_ = layers.size();
    hidden_ = c.hidden_size;
    heads_ = c.num_attention_heads;
    head_dim_ = c.hidden_size / c.num_attention_heads;
    capacity_ = capacity;
    type_ = type;
    esize_ = dtype_size(type);
    const size_t n = size_t(layers_) * size_t(capacity_) * size_t(hidden_) * esize_;  // bytes of k, and of v
    k_.resize(n);  // (nothing written)
    v_.resize(n);
  }
  int64_t size() const noexcept { return size_; }  // positions stored (the next token's position)
  int64_t capacity() const noexcept { return capacity_; }
  dtype type() const noexcept { return type_; }  // the element type of keys and values
  bool huge_pages() const noexcept { return k_.get_allocator().huge; }  // asks for huge pages (the constructor)
  void clear() noexcept { size_ = 0; }
  // Drops positions beyond n (to roll back speculative or rejected tokens).
  void truncate(int64_t n) noexcept { size_ = std::min(size_, std::max<int64_t>(n, 0)); }
  // Room for `capacity` positions, the stored ones kept (a cache that grows with its sequence: a draft model's).
  // No-op when it already has the room; an input_error beyond max_position_embeddings (`c`: the cache's model's
  // config).
  void reserve(const Config& c, int64_t capacity) {
    if (capacity <= capacity_) return;
    if (layers_ == 0 || c.hidden_size != hidden_ || c.num_attention_heads != heads_ ||
        c.num_hidden_layers != model_layers_)
      throw input_error("KvCache::reserve: the config is not this cache's model's");
    KvCache grown(c, capacity, type_, {first_, first_ + layers_}, huge_pages());  // (checks the capacity)
    const size_t row = size_t(head_dim_) * esize_, used = size_t(size_) * row;
    for (int64_t l = 0; l < layers_; ++l)
      for (int64_t h = 0; h < heads_; ++h) {
        const size_t block = size_t(l) * size_t(heads_) + size_t(h);  // (layer, head): capacity rows of row bytes
        const size_t from = block * size_t(capacity_) * row, to = block * size_t(capacity) * row;
        std::copy_n(k_.data() + from, used, grown.k_.data() + to);
        std::copy_n(v_.data() + from, used, grown.v_.data() + to);
      }
    grown.size_ = size_;
    *this = std::move(grown);
  }
  size_t bytes() const noexcept { return k_.size() + v_.size(); }
  // Bytes one position takes: keys and values of every layer, 2 x layers x hidden x the element's size.
  size_t bytes_per_token() const noexcept { return bytes_per_token(layers_, hidden_, type_); }
  static size_t bytes_per_token(int64_t layers, int64_t hidden, dtype type) noexcept {
    return 2 * size_t(layers) * size_t(hidden) * dtype_size(type);
  }
  static size_t bytes_per_token(const Config& c, dtype type = dtype::F32) noexcept {
    return bytes_per_token(c.num_hidden_layers, c.hidden_size, type);
  }

  // A layer's keys and values, elements of type(): position t of head h at element t * ld() + h * head_stride()
  // (each head's positions are one contiguous block, which attention reads row after row).
  void* k(int64_t layer) noexcept { return k_.data() + layer_offset(layer); }
  void* v(int64_t layer) noexcept { return v_.data() + layer_offset(layer); }
  const void* k(int64_t layer) const noexcept { return k_.data() + layer_offset(layer); }
  const void* v(int64_t layer) const noexcept { return v_.data() + layer_offset(layer); }
  int64_t ld() const noexcept { return head_dim_; }
  int64_t head_stride() const noexcept { return capacity_ * head_dim_; }
  int64_t hidden() const noexcept { return hidden_; }
  int64_t heads() const noexcept { return heads_; }
  int64_t layers() const noexcept { return layers_; }  // layers held: [first_layer(), first_layer() + layers())
  int64_t first_layer() const noexcept { return first_; }
  int64_t model_layers() const noexcept { return model_layers_; }  // num_hidden_layers of its model
  void advance(int64_t n) noexcept { size_ += n; }
  // Writes n new positions [size(), size() + n) of `layer` from rows k_rows, v_rows [n, hidden] (heads side by
  // side); F16 and BF16 round each value to nearest even (a NaN stays a NaN, beyond the range gives infinity).
  void store(int64_t layer, const float* k_rows, const float* v_rows, int64_t n) noexcept {
    const auto f16 = [](float x) { return detail::f32_to_f16(x); };
    const auto bf16 = [](float x) { return detail::f32_to_bf16(x); };
    switch (type_) {
      case dtype::F16: return store_as<uint16_t>(layer, k_rows, v_rows, n, f16);
      case dtype::BF16: return store_as<uint16_t>(layer, k_rows, v_rows, n, bf16);
      default: return store_as<float>(layer, k_rows, v_rows, n, [](float x) { return x; });
    }
  }

 private:
  size_t layer_offset(int64_t layer) const noexcept {
    return size_t(layer - first_) * size_t(capacity_) * size_t(hidden_) * esize_;
  }
  template <class E, class Round>
  void store_as(int64_t layer, const float* k_rows, const float* v_rows, int64_t n, Round round) noexcept {
    E* kl = static_cast<E*>(k(layer));
    E* vl = static_cast<E*>(v(layer));
    const int64_t hs = head_stride();
    for (int64_t j = 0; j < n; ++j)
      for (int64_t h = 0; h < heads_; ++h) {
        const size_t src = size_t(j * hidden_ + h * head_dim_), dst = size_t(h * hs + (size_ + j) * head_dim_);
        if constexpr (std::is_same_v<E, float>) {  // (a copy: the transform ran one scalar store at a time)
          std::memcpy(kl + dst, k_rows + src, size_t(head_dim_) * sizeof(float));
          std::memcpy(vl + dst, v_rows + src, size_t(head_dim_) * sizeof(float));
        } else {
          std::transform(k_rows + src, k_rows + src + head_dim_, kl + dst, round);
          std::transform(v_rows + src, v_rows + src + head_dim_, vl + dst, round);
        }
      }
  }

  int64_t layers_ = 0, hidden_ = 0, heads_ = 0, head_dim_ = 0, capacity_ = 0, size_ = 0;
  int64_t first_ = 0, model_layers_ = 0;
  dtype type_ = dtype::F32;
  size_t esize_ = 4;
  // [layers, heads, capacity, head_dim] elements, 64-byte aligned, committed as positions are written
  std::vector<std::byte, detail::LazyAllocator<std::byte>> k_, v_;
};

// Scratch space for forward passes and the thread pool that runs them. One per calling thread. Buffers grow
// to the largest pass seen and are then reused, so steady-state decoding does not allocate.
class Workspace {
 public:
  explicit Workspace(size_t n_threads = 0) : pool_(std::make_unique<ThreadPool>(n_threads)) {}
  ThreadPool& pool() noexcept { return *pool_; }
  size_t threads() const noexcept { return pool_->size(); }

  // Makes room for a pass of n tokens producing n_logits rows, with at most max_len cached positions.
  void reserve(const Config& c, int64_t n, int64_t n_logits, int64_t max_len) {
    const int64_t H = c.hidden_size, E = c.word_embed_proj_dim;
    const int64_t width = std::max({H, E, c.ffn_dim});
    grow(x, n * std::max(H, E));
    grow(h, n * width);
    grow(q, n * H);
    grow(k, n * H);
    grow(v, n * H);
    grow(a, n * H);
    grow(e, n * E);
    grow(logits, n_logits * c.vocab_size);
    grow(last, n_logits * std::max(H, E));
    grow(scores, int64_t(threads()) * ops::kAttentionScratch * std::max<int64_t>(max_len, 1));
  }

  // 64-byte aligned: every row of a [n, dim] buffer starts on a cache line when dim is a multiple of 16
  ops::aligned_vector<float> x, h, q, k, v, a, e, logits, last, scores;
  std::vector<int64_t> rows;  // the first row of each chunk of the pass

 private:
  static void grow(ops::aligned_vector<float>& v, int64_t n) {
    if (v.size() < size_t(n)) v.resize(size_t(n));
  }
  std::unique_ptr<ThreadPool> pool_;
};

// One sequence's part of a forward pass: its cache and the new tokens to append to it.
struct SequenceChunk {
  KvCache* cache = nullptr;
  const int32_t* ids = nullptr;
  int64_t n = 0;
  bool all_logits = false;  // logits for every new token of this chunk (ForwardOptions::all_logits: every chunk's)
};

// A row-major float matrix as Eigen sees it: what a host reads (logits, hidden states) without a copy.
using RowMatrixF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMatrixMap = Eigen::Map<const RowMatrixF>;

// Row-major logits held by a Workspace (valid until its next pass).
struct LogitsView {
  const float* data = nullptr;
  int64_t rows = 0, cols = 0;
  const float* row(int64_t r) const noexcept { return data + r * cols; }
  ConstMatrixMap matrix() const { return ConstMatrixMap(data, rows, cols); }  // [rows, vocab] for Eigen
};

// One entry of ForwardOptions::hidden_states ([tokens, dim] row-major) as an Eigen matrix.
inline ConstMatrixMap hidden_state_matrix(const std::vector<float>& h, int64_t dim) {
  return ConstMatrixMap(h.data(), dim ? int64_t(h.size()) / dim : 0, dim);
}

namespace detail {
// out[j, :] = table[ids[j], :]: the embedding lookup as row indexing of an Eigen map of the stored table
// (F32, F16 or BF16; F16/BF16 rows widened exactly).
inline void embedding_rows(const MatrixRef& table, const int32_t* ids, int64_t n, float* out) {
  Eigen::Map<RowMatrixF> o(out, n, table.cols);
  if (table.type == dtype::F32) {
    const ConstMatrixMap t(static_cast<const float*>(table.data), table.rows, table.cols);
    for (int64_t j = 0; j < n; ++j) o.row(j) = t.row(ids[j]);
    return;
  }
  using Half = Eigen::Matrix<uint16_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const Eigen::Map<const Half> t(static_cast<const uint16_t*>(table.data), table.rows, table.cols);
  const bool f16 = table.type == dtype::F16;
  for (int64_t j = 0; j < n; ++j)
    o.row(j) = t.row(ids[j]).unaryExpr([f16](uint16_t h) { return f16 ? f16_to_f32(h) : bf16_to_f32(h); });
}
}  // namespace detail

struct ForwardOptions {
  bool all_logits = false;  // logits for every new token, not only the last of each chunk
  // When set, receives HF's output_hidden_states for the concatenated tokens: [0] embeddings, [i] output of layer
  // i-1, last after final_layer_norm / project_out. Each entry is [tokens, dim] row-major.
  std::vector<std::vector<float>>* hidden_states = nullptr;
};

enum class quantization { none, int8, int4 };

// The layers a Model does not hold, run somewhere else: the rest of a pipeline (opt/pipeline.hpp runs them on
// other MPI ranks). Model::forward hands it the residual stream after its own layers and reads back the output of
// the model's last layer, before the caches advance.
class RemoteLayers {
 public:
  virtual ~RemoteLayers() = default;
  // hidden: [rows, dim] row-major, the chunks' tokens in chunk order (each chunk's cache still at its size before
  // the pass); replaced in place by the output of the last decoder layer. Throws opt::error on failure.
  virtual void run(const std::vector<SequenceChunk>& chunks, float* hidden, int64_t rows, int64_t dim) = 0;
};

struct LoadOptions {
  bool strict = true;  // unexpected tensors in the checkpoint are an error (else listed in unexpected_tensors())
  // int8 / int4: every linear layer's weight becomes int8 / int4 with one f32 scale per row and block of columns
  // (weight-only; compute stays f32; see quantize.hpp). Embeddings are kept as stored; see quantize_lm_head.
  // A stored packed folder (packed.hpp) runs as stored and quantizes nothing: none loads it whatever its scheme;
  // int8 / int4 is accepted only when the folder holds exactly what it would make (I8 / I4 weights, and the LM head
  // in that type iff the LM head is quantized), else it is a tensor_error saying what the folder holds.
  quantization quantize = quantization::none;
  // with quantize = int8 or int4, also quantize the tied LM head (a separate copy in that format); lm_head_int8 is
  // the older name of the same switch (either one set turns it on)
  bool quantize_lm_head = false;
  bool lm_head_int8 = false;
  // int8 weights (quantize = int8, or a stored int8 folder) run on the CPU's int8 dot products (AVX-512 VNNI with
  // VBMI) over each token's inputs quantized to int8 per block, where it has them and one token is decoded. Not
  // the exact kernel's bits: outputs move by the inputs' quantization error, and differ between ISAs. For a
  // drafter (speculative decoding verifies every token with the exact model); off by default.
  bool approximate_int8 = false;
  // Part of the model only (a pipeline stage, opt/pipeline.hpp): the decoder layers `layers`, the embeddings
  // (embed_tokens, embed_positions, project_in) when `embeddings`, the head (final_layer_norm, project_out and the
  // LM head tied to embed_tokens) when `head`. The other tensors are neither bound nor checked nor read (their
  // pages are never touched), and are not unexpected. The default: the whole model.
  LayerRange layers;
  bool embeddings = true, head = true;
  bool lm_head_quantized() const noexcept {
    return quantize != quantization::none && (quantize_lm_head || lm_head_int8);
  }
};

class Model {
 public:
  // `dir` holds config.json and the weights: model.safetensors (or shards listed by model.safetensors.index.json),
  // or, when it has no safetensors, pytorch_model.bin (or shards listed by pytorch_model.bin.index.json), read in
  // place through the restricted unpickler of pytorch.hpp (the hub's older checkpoints; nothing is converted).
  static Model load(const std::filesystem::path& dir, const LoadOptions& opts = {}) {
    namespace fs = std::filesystem;
    Config cfg = Config::from_file(dir / "config.json");
    std::error_code ec;
    auto has = [&](const char* name) { return fs::exists(dir / name, ec); };
    if (!has("model.safetensors") && !has("model.safetensors.index.json") &&
        (has("pytorch_model.bin") || has("pytorch_model.bin.index.json")))
      return from_checkpoint(cfg, PytorchCheckpoint::open(dir), opts);
    return from_checkpoint(cfg, Checkpoint::open(dir), opts);
  }

  // A checkpoint opened by the caller: opt::Checkpoint (safetensors) or opt::PytorchCheckpoint. The model keeps
  // it (its mappings) alive.
  template <class Ckpt>
  static Model from_checkpoint(const Config& cfg, Ckpt ckpt, const LoadOptions& opts = {}) {
    static_assert(std::is_base_of_v<detail::ShardSet<SafetensorsFile>, Ckpt> ||
                      std::is_base_of_v<detail::ShardSet<PytorchFile>, Ckpt>,
                  "Model::from_checkpoint takes an opt::Checkpoint or an opt::PytorchCheckpoint");
    Model m;
    m.config_ = cfg;
    m.act_ = cfg.act();
    auto held = std::make_shared<const Ckpt>(std::move(ckpt));
    m.bind(*held, opts);
    m.checkpoint_ = std::move(held);
    return m;
  }

  const Config& config() const noexcept { return config_; }
  const ModelWeights& weights() const noexcept { return w_; }
  const std::vector<std::string>& unexpected_tensors() const noexcept { return unexpected_; }
  // The name prefix the checkpoint used: "model.decoder." (transformers) or "decoder." (hub OPT checkpoints).
  const std::string& tensor_prefix() const noexcept { return prefix_; }
  // The scheme of a stored packed folder (packed.hpp), whose panels run from the file mapping; nullopt otherwise.
  const std::optional<PackedScheme>& stored_scheme() const noexcept { return scheme_; }
  // The part of the model held (LoadOptions::layers, embeddings, head): all of it unless loaded as a stage.
  LayerRange layers() const noexcept { return layers_; }
  bool has_embeddings() const noexcept { return embeddings_; }
  bool has_head() const noexcept { return head_; }
  // Hands the layers beyond layers().last to `remote` (a pipeline, opt/pipeline.hpp): forward() then runs the
  // embeddings, the layers held, remote->run, and the head. Needs the embeddings, the head and layers from 0; null
  // detaches it. Copies of the Model share the remote; a pass through it holds it for the whole pass.
  void set_remote_layers(std::shared_ptr<RemoteLayers> remote) {
    if (remote && (!embeddings_ || !head_ || layers_.first != 0))
      throw input_error("set_remote_layers: this Model holds " + part_string() +
                        "; a remote stage needs a Model with the embeddings, the head and layers from 0");
    remote_ = std::move(remote);
  }
  const std::shared_ptr<RemoteLayers>& remote_layers() const noexcept { return remote_; }
  // "layers [a, b) of L, the embeddings, the head" (for messages).
  std::string part_string() const {
    return "layers [" + std::to_string(layers_.first) + ", " + std::to_string(layers_.last) + ") of " +
           std::to_string(config_.num_hidden_layers) + (embeddings_ ? ", the embeddings" : "") +
           (head_ ? ", the head" : "");
  }
  // Bytes of weight matrices the model holds in its own memory: panels packed (and quantized) at load, and
  // tensors copied for alignment. 0 for a stored packed folder read from files: everything runs from the mapping.
  size_t owned_weight_bytes() const noexcept {
    size_t n = 0;
    if (arena_) n += arena_->size();
    for (const auto& b : *owned_bytes_) n += b.size();
    return n;
  }

  // Bytes of weights one decode step reads: every linear layer, the projections and the LM head.
  size_t decode_weight_bytes() const noexcept {
    size_t n = w_.lm_head().bytes() + w_.project_in_packed.bytes() + w_.project_out_packed.bytes();
    for (const DecoderLayerWeights& L : w_.layers)
      for (const LinearWeights* l : {&L.q_proj, &L.k_proj, &L.v_proj, &L.out_proj, &L.fc1, &L.fc2}) n += l->packed.bytes();
    return n;
  }

  // Runs the new tokens of every chunk through the model, appends their keys/values to the chunk's cache and
  // returns logits: one row per chunk (its last token), or one per token of the chunks with all_logits (every chunk
  // with opts.all_logits), in chunk order.
  LogitsView forward(const std::vector<SequenceChunk>& chunks, Workspace& ws, const ForwardOptions& opts = {}) const {
    const Config& c = config_;
    const int64_t H = c.hidden_size, V = c.vocab_size;
    int64_t max_len = 0;
    const int64_t N = check_chunks(chunks, "forward", true, max_len);
    if (!embeddings_ || !head_ || layers_.first != 0 || (layers_.last != c.num_hidden_layers && !remote_))
      throw input_error("forward: this Model holds " + part_string() +
                        "; a whole pass needs the embeddings, the head and every layer (held, or run by the remote "
                        "stage of set_remote_layers)");
    if (remote_ && opts.hidden_states)
      throw input_error("forward: hidden_states are not available when layers run on a remote stage");
    int64_t n_logits = 0;
    for (const SequenceChunk& ch : chunks) n_logits += opts.all_logits || ch.all_logits ? ch.n : 1;
    ws.reserve(c, N, n_logits, max_len);
    float* x = ws.x.data();  // [N, H] the residual stream
    embed(chunks, ws);
    capture(opts.hidden_states, x, N * H);
    run_layers(chunks, ws, N, max_len, opts.hidden_states);
    if (remote_) remote_->run(chunks, x, N, H);  // layers [layers().last, num_hidden_layers), before the caches move
    for (const SequenceChunk& ch : chunks) ch.cache->advance(ch.n);
    head(chunks, ws, N, n_logits, opts);
    return LogitsView{ws.logits.data(), n_logits, V};
  }

  // A pipeline stage's part of a pass: the decoder layers this Model holds (layers()) over `hidden`, the [tokens,
  // hidden_size] row-major output of the layer before them for the chunks' tokens (in chunk order), replaced by
  // the output of the last one. Each chunk's keys and values go to its cache at positions [size(), size() + n),
  // and the caches advance; the chunks' ids are not read (they may be null). The same bits as forward()'s layers.
  void forward_layers(const std::vector<SequenceChunk>& chunks, float* hidden, Workspace& ws) const {
    const int64_t H = config_.hidden_size;
    int64_t max_len = 0;
    const int64_t N = check_chunks(chunks, "forward_layers", false, max_len);
    ws.reserve(config_, N, 0, max_len);
    std::copy(hidden, hidden + N * H, ws.x.data());
    run_layers(chunks, ws, N, max_len, nullptr);
    for (const SequenceChunk& ch : chunks) ch.cache->advance(ch.n);
    std::copy(ws.x.data(), ws.x.data() + N * H, hidden);
  }

 private:
  static void capture(std::vector<std::vector<float>>* hs, const float* src, int64_t n) {
    if (hs) hs->emplace_back(src, src + n);
  }

  // The checks every pass makes on its chunks (ids too when `ids`); returns the number of tokens and sets max_len
  // to the largest cache capacity.
  int64_t check_chunks(const std::vector<SequenceChunk>& chunks, const char* what, bool ids, int64_t& max_len) const {
    const Config& c = config_;
    const std::string w = what;
    int64_t N = 0;
    max_len = 0;
    if (chunks.empty()) throw input_error(w + ": empty batch (no sequences)");
    for (size_t s = 0; s < chunks.size(); ++s) {
      const SequenceChunk& ch = chunks[s];
      if (!ch.cache) throw input_error(w + ": sequence " + std::to_string(s) + " has no KvCache");
      if (ch.n <= 0) throw input_error(w + ": sequence " + std::to_string(s) + " has no new tokens");
      if (ch.cache->model_layers() != c.num_hidden_layers || ch.cache->hidden() != c.hidden_size ||
          ch.cache->heads() != c.num_attention_heads)
        throw input_error(w + ": sequence " + std::to_string(s) + " has a KvCache made for another model");
      if (ch.cache->first_layer() > layers_.first || ch.cache->first_layer() + ch.cache->layers() < layers_.last)
        throw input_error(w + ": sequence " + std::to_string(s) + " has a KvCache of layers [" +
                          std::to_string(ch.cache->first_layer()) + ", " +
                          std::to_string(ch.cache->first_layer() + ch.cache->layers()) + "); this Model holds " +
                          part_string());
      if (ch.cache->size() + ch.n > ch.cache->capacity())
        throw input_error(w + ": sequence " + std::to_string(s) + " needs " +
                          std::to_string(ch.cache->size() + ch.n) + " positions, beyond its KvCache capacity " +
                          std::to_string(ch.cache->capacity()) + " (max_position_embeddings " +
                          std::to_string(c.max_position_embeddings) + ")");
      for (int64_t j = 0; ids && j < ch.n; ++j)
        if (ch.ids[j] < 0 || ch.ids[j] >= c.vocab_size)
          throw input_error(w + ": token id " + std::to_string(ch.ids[j]) + " (sequence " + std::to_string(s) +
                            ", index " + std::to_string(j) + ") is outside the vocabulary [0, " +
                            std::to_string(c.vocab_size) + ")");
      N += ch.n;
      max_len = std::max(max_len, ch.cache->capacity());  // scores sized for the whole cache: no regrowth per step
    }
    return N;
  }

  // ---- embeddings: inputs_embeds = embed_tokens(ids) (row indexing); project_in; + embed_positions -> ws.x ----
  void embed(const std::vector<SequenceChunk>& chunks, Workspace& ws) const {
    const Config& c = config_;
    const int64_t H = c.hidden_size, E = c.word_embed_proj_dim;
    float* x = ws.x.data();  // [N, H]
    float* h = ws.h.data();  // scratch: one position row
    float* e = ws.e.data();  // [N, E] token embeddings before project_in
    int64_t N = 0;
    for (const SequenceChunk& ch : chunks) {
      detail::embedding_rows(w_.embed_tokens, ch.ids, ch.n, e + N * E);
      N += ch.n;
    }
    if (c.has_projections()) ops::linear(ws.pool(), e, N, w_.project_in_packed, nullptr, x, {}, approx_);  // [N,E] x [H,E]ᵀ
    else std::copy(e, e + N * H, x);
    // positions: the cache size is the count of real tokens before this one (cumsum(mask) - 1)
    int64_t r = 0;
    for (const SequenceChunk& ch : chunks)
      for (int64_t j = 0; j < ch.n; ++j, ++r) {
        ops::row_to_f32(w_.embed_positions, position_row(ch.cache->size() + j), h);
        float* xr = x + r * H;
        for (int64_t d = 0; d < H; ++d) xr[d] += h[d];
      }
  }

  // The decoder layers this Model holds, over the residual stream ws.x [N, H] (ws reserved for the pass); each
  // chunk's keys and values are stored at its cache's size() (the caller advances the caches afterwards).
  void run_layers(const std::vector<SequenceChunk>& chunks, Workspace& ws, int64_t N, int64_t max_len,
                  std::vector<std::vector<float>>* hidden_states) const {
    const Config& c = config_;
    const int64_t H = c.hidden_size;
    const int64_t nh = c.num_attention_heads, hd = c.head_dim();
    ThreadPool& pool = ws.pool();
    std::vector<int64_t>& row0 = ws.rows;
    row0.resize(chunks.size());
    for (size_t ci = 0, r = 0; ci < chunks.size(); r += size_t(chunks[ci].n), ++ci) row0[ci] = int64_t(r);
    float* x = ws.x.data();  // [N, H] the residual stream
    float* h = ws.h.data();  // [N, max(H, E, ffn)] scratch
    float* q = ws.q.data();  // [N, H]
    float* a = ws.a.data();  // [N, H] attention output
    float* kb = ws.k.data();  // [N, H] new keys
    float* vb = ws.v.data();  // [N, H] new values

    const float scaling = 1.0f / std::sqrt(float(hd));
    for (int64_t l = layers_.first; l < layers_.last; ++l) {
      const DecoderLayerWeights& L = w_.layers[size_t(l)];
      // ---- self-attention block ----
      const float* attn_in = x;
      if (c.do_layer_norm_before) {
        layer_norm(pool, x, N, L.self_attn_layer_norm, h);
        attn_in = h;
      }
      {
        // q/k/v in one dispatch: q = q_proj(h) * head_dim^-0.5 -> q; k, v -> kb, vb, then into the caches
        ops::Epilogue qs;
        qs.has_scale = true;
        qs.scale = scaling;
        const ops::LinearSeg qkv[3] = {{L.q_proj.packed, L.q_proj.bias, q, H, qs, approx_},
                                       {L.k_proj.packed, L.k_proj.bias, kb, H, {}, approx_},
                                       {L.v_proj.packed, L.v_proj.bias, vb, H, {}, approx_}};
        ops::linear_multi(pool, attn_in, N, qkv, 3);  // [N,H] x [3H,H]ᵀ -> [N,3H]
        int64_t r = 0;
        for (const SequenceChunk& ch : chunks) {
          ch.cache->store(l, kb + r * H, vb + r * H, ch.n);
          r += ch.n;
        }
      }
      {
        // softmax(q·kᵀ)·v per (token, head). A big chunk (a prompt) is split over (head, block of tokens) units
        // by ops::attention; the small ones (decode steps) go together, one (chunk, head) unit each, in one
        // parallel pass when there is enough of them to share, else on the calling thread. (A single sequence's
        // step at opt-125m's shape shares from a context of 6: its 12 heads on the calling thread alone left the
        // other thread idle; sharing them made an int8 decode token 0.99x as long, 300 paired rounds on Zen 5.)
        const auto big = [&](const SequenceChunk& ch) {
          return ch.n * (ch.cache->size() + ch.n) * H >= (int64_t(1) << 16);
        };
        int64_t small_work = 0;
        for (size_t ci = 0; ci < chunks.size(); ++ci) {
          const SequenceChunk& ch = chunks[ci];
          if (big(ch))
            ops::attention(pool, q + row0[ci] * H, ch.cache->size(), ch.n, ch.cache->type(), ch.cache->k(l),
                           ch.cache->v(l), ch.cache->ld(), ch.cache->head_stride(), nh, hd, a + row0[ci] * H,
                           ws.scores.data());
          else
            small_work += ch.n * (ch.cache->size() + ch.n) * H;
        }
        const auto small_units = [&](size_t t, size_t b, size_t e) {
          float* sc = ws.scores.data() + t * size_t(ops::kAttentionScratch * max_len);
          for (size_t u = b; u < e; ++u) {
            const size_t ci = u / size_t(nh);
            const SequenceChunk& ch = chunks[ci];
            if (big(ch)) continue;
            const int64_t hh = int64_t(u % size_t(nh));
            ops::attention_rows(q + row0[ci] * H, ch.cache->size(), ch.cache->type(), ch.cache->k(l),
                                ch.cache->v(l), ch.cache->ld(), ch.cache->head_stride(), nh, hd, a + row0[ci] * H,
                                H, sc, 0, ch.n, hh, hh + 1);
          }
        };
        if (small_work >= (int64_t(1) << 12)) pool.parallel_for_t(chunks.size() * size_t(nh), 1, small_units);
        else if (small_work > 0) small_units(0, 0, chunks.size() * size_t(nh));
      }
      ops::Epilogue res;
      res.residual = true;
      ops::linear(pool, a, N, L.out_proj.packed, L.out_proj.bias, x, res, approx_);  // x += [N,H] x [H,H]ᵀ
      if (!c.do_layer_norm_before) layer_norm(pool, x, N, L.self_attn_layer_norm, x);
      // ---- feed-forward block ----
      const float* ffn_in = x;
      if (c.do_layer_norm_before) {
        layer_norm(pool, x, N, L.final_layer_norm, a);
        ffn_in = a;
      }
      ops::Epilogue act;
      act.has_act = true;
      act.act = act_;
      ops::linear(pool, ffn_in, N, L.fc1.packed, L.fc1.bias, h, act, approx_);  // act([N,H] x [F,H]ᵀ) -> [N,F]
      ops::linear(pool, h, N, L.fc2.packed, L.fc2.bias, x, res, approx_);     // x += [N,F] x [H,F]ᵀ
      if (!c.do_layer_norm_before) layer_norm(pool, x, N, L.final_layer_norm, x);
      if (l + 1 < c.num_hidden_layers) capture(hidden_states, x, N * H);
    }
  }

  // ---- final LayerNorm, project_out, tied LM head, for the rows whose logits are wanted -> ws.logits ----
  void head(const std::vector<SequenceChunk>& chunks, Workspace& ws, int64_t N, int64_t n_logits,
            const ForwardOptions& opts) const {
    const Config& c = config_;
    const int64_t H = c.hidden_size, E = c.word_embed_proj_dim;
    ThreadPool& pool = ws.pool();
    float* x = ws.x.data();  // [N, H] the residual stream after the last layer
    float* e = ws.e.data();  // [N, E]
    float* last = ws.last.data();  // [n_logits, max(H,E)]
    auto select_rows = [&](const float* src, int64_t dim, float* dst) {
      if (opts.all_logits) {
        std::copy(src, src + N * dim, dst);
        return;
      }
      int64_t r = 0, o = 0;
      for (const SequenceChunk& ch : chunks) {
        const int64_t keep = ch.all_logits ? ch.n : 1;  // the chunk's last `keep` rows
        r += ch.n;
        std::copy(src + (r - keep) * dim, src + r * dim, dst + o * dim);
        o += keep;
      }
    };
    if (opts.hidden_states) {
      // HF's last hidden state covers every token: compute it for all rows, then select
      if (c.has_final_layer_norm()) layer_norm(pool, x, N, w_.final_layer_norm, x);
      const float* fin = x;
      if (c.has_projections()) {
        ops::linear(pool, x, N, w_.project_out_packed, nullptr, e, {}, approx_);  // [N,H] x [E,H]ᵀ -> [N,E]
        fin = e;
      }
      capture(opts.hidden_states, fin, N * E);
      select_rows(fin, E, last);
    } else {
      select_rows(x, H, last);
      if (c.has_final_layer_norm()) layer_norm(pool, last, n_logits, w_.final_layer_norm, last);
      if (c.has_projections()) {
        ops::linear(pool, last, n_logits, w_.project_out_packed, nullptr, e, {}, approx_);  // [n,H] x [E,H]ᵀ -> [n,E]
        std::copy(e, e + n_logits * E, last);
      }
    }
    ops::linear(pool, last, n_logits, w_.lm_head(), nullptr, ws.logits.data(), {}, approx_);  // [n,E] x [V,E]ᵀ -> [n,V]
  }

  // Rows are independent: split over threads only when there are enough of them (prefill).
  void layer_norm(ThreadPool& pool, const float* in, int64_t n, const LayerNormWeights& ln, float* out) const {
    const int64_t d = config_.hidden_size;
    const float eps = float(config_.layer_norm_eps);
    if (n < 16) {
      ops::layer_norm(in, n, d, ln.weight, ln.bias, eps, out);
      return;
    }
    pool.parallel_for(size_t(n), 8, [&](size_t b, size_t e) {
      ops::layer_norm(in + int64_t(b) * d, int64_t(e - b), d, ln.weight, ln.bias, eps, out + int64_t(b) * d);
    });
  }

  template <class Ckpt>
  void bind(const Ckpt& ck, const LoadOptions& opts) {
    // the name prefix: transformers saves "model.decoder.", the facebook/opt-* hub checkpoints "decoder."
    for (const char* p : {"model.decoder.", "decoder.", ""}) {
      if (ck.find(std::string(p) + "embed_tokens.weight")) {
        prefix_ = p;
        break;
      }
    }
    mappings_.clear();
    for (const auto& f : ck.files())
      if (f.mapping().first) mappings_.push_back(f.mapping());
    std::string where = ck.files().empty() ? std::string("checkpoint") : ck.files().front().path();
    if (ck.files().size() > 1) where += " (+" + std::to_string(ck.files().size() - 1) + " shards)";
    scheme_ = stored_scheme_of(ck, opts);
    const int64_t n_layers = config_.num_hidden_layers;
    layers_ = {opts.layers.first, opts.layers.last < 0 ? n_layers : opts.layers.last};
    if (layers_.first < 0 || layers_.first > layers_.last || layers_.last > n_layers)
      throw config_error("LoadOptions::layers = [" + std::to_string(opts.layers.first) + ", " +
                         std::to_string(opts.layers.last) + "): expected 0 <= first <= last <= num_hidden_layers " +
                         std::to_string(n_layers) + " (last -1: to the end)");
    embeddings_ = opts.embeddings;
    head_ = opts.head;
    approx_ = opts.approximate_int8;
    std::set<std::string> used;
    std::vector<std::string> missing;
    // A packed weight: its .panels (+ .scales) viewed in place, checked against config.json's shape.
    auto bind_packed = [&](const std::string& full, dtype t, int64_t block, int64_t group, int64_t rows, int64_t cols) {
      const TensorView* p = ck.find(packed_panels_name(full));
      const TensorView* sc = ops::has_scales(t) ? ck.find(packed_scales_name(full)) : nullptr;
      if (!p) missing.push_back(packed_panels_name(full));
      if (ops::has_scales(t) && !sc) missing.push_back(packed_scales_name(full));
      if (!p || (ops::has_scales(t) && !sc)) return PackedMatrix{};
      used.insert(p->name);
      if (sc) used.insert(sc->name);
      return packed_view(full, *p, sc, t, block, rows, cols, group);
    };
    for_each_tensor(config_, w_, [&](const TensorSlot& slot) {
      const std::string full = prefix_ + slot.name;
      const bool held = slot.layer >= 0 ? slot.layer >= layers_.first && slot.layer < layers_.last
                                         : (slot.embeddings && embeddings_) || (slot.head && head_);
      if (!held) {  // another stage's: not bound, not read, not unexpected
        for (const std::string& n : {full, packed_panels_name(full), packed_scales_name(full)}) used.insert(n);
        return;
      }
      if (scheme_ && slot.packed) {
        *slot.packed = bind_packed(full, scheme_->weight, scheme_->weight_block, scheme_->weight_group_or_default(),
                                   slot.shape[0], slot.shape[1]);
        return;
      }
      const TensorView* t = ck.find(full);
      if (!t) {
        missing.push_back(full);
        return;
      }
      used.insert(full);
      if (t->shape != slot.shape)
        throw tensor_error(t->file + ": tensor '" + full + "' has shape " + shape_string(t->shape) + ", expected " +
                           shape_string(slot.shape) + " from config.json");
      if (t->type != dtype::F32 && t->type != dtype::F16 && t->type != dtype::BF16)
        throw tensor_error(t->file + ": tensor '" + full + "' has dtype " + to_string(t->type) +
                           ", expected F32, F16 or BF16");
      if (slot.matrix) {
        const void* data = t->data;
        if (reinterpret_cast<uintptr_t>(data) % dtype_size(t->type) != 0) {  // misaligned in the file: copy
          owned_bytes_->emplace_back(t->nbytes);
          std::memcpy(owned_bytes_->back().data(), t->data, t->nbytes);
          data = owned_bytes_->back().data();
        }
        *slot.matrix = MatrixRef{t->type, data, slot.shape[0], slot.shape[1]};
      } else {
        owned_floats_->emplace_back(t->numel());
        std::vector<float>& v = owned_floats_->back();
        MatrixRef row{t->type, t->data, 1, int64_t(t->numel())};
        if (reinterpret_cast<uintptr_t>(t->data) % dtype_size(t->type) != 0) {
          owned_bytes_->emplace_back(t->nbytes);
          std::memcpy(owned_bytes_->back().data(), t->data, t->nbytes);
          row.data = owned_bytes_->back().data();
        }
        ops::row_to_f32(row, 0, v.data());
        *slot.vec = v.data();
      }
    });
    if (!missing.empty()) {
      std::string list;
      for (size_t i = 0; i < missing.size() && i < 8; ++i) list += (i ? ", " : "") + missing[i];
      if (missing.size() > 8) list += ", ... (" + std::to_string(missing.size()) + " in all)";
      throw tensor_error(where + ": missing tensor" + (missing.size() > 1 ? "s " : " ") + list);
    }
    if (scheme_ && !head_) {
      for (const std::string& n : {packed_panels_name("lm_head.weight"), packed_scales_name("lm_head.weight")})
        used.insert(n);
    } else if (scheme_) {
      w_.lm_head_packed = bind_packed("lm_head.weight", scheme_->lm_head, scheme_->lm_head_block,
                                      scheme_->lm_head_group_or_default(), config_.vocab_size,
                                      config_.word_embed_proj_dim);
      if (!w_.lm_head_packed)
        throw tensor_error(where + ": missing tensor" + (missing.size() > 1 ? "s " : " ") + missing.front() +
                           (missing.size() > 1 ? ", " + missing.back() : std::string()));
    }
    // lm_head.weight is tied to embed_tokens (transformers ties it whatever the file holds); accept it if its
    // shape fits, and report everything else.
    for (const TensorView* t : ck.tensors()) {
      if (used.count(t->name)) continue;
      if (t->name == "lm_head.weight") {
        if (t->shape != std::vector<int64_t>{config_.vocab_size, config_.word_embed_proj_dim})
          throw tensor_error(t->file + ": tensor 'lm_head.weight' has shape " + shape_string(t->shape) +
                             ", expected " + shape_string({config_.vocab_size, config_.word_embed_proj_dim}));
        continue;
      }
      unexpected_.push_back(t->name);
    }
    if (opts.strict && !unexpected_.empty()) {
      std::string list;
      for (size_t i = 0; i < unexpected_.size() && i < 8; ++i) list += (i ? ", " : "") + unexpected_[i];
      if (unexpected_.size() > 8) list += ", ... (" + std::to_string(unexpected_.size()) + " in all)";
      throw tensor_error(where + ": unexpected tensor" + (unexpected_.size() > 1 ? "s " : " ") + list +
                         " (not part of an OPT model with this config.json; LoadOptions::strict=false ignores them)");
    }
    if (!scheme_) pack_weights(opts);
    else (void)kernels::active();  // OPT_ISA errors surface at load, not inside the first forward pass
  }

  // The packed scheme every file of ck declares alike (nullopt: none does; a PyTorch checkpoint never does),
  // checked against what opts asks for.
  template <class Ckpt>
  static std::optional<PackedScheme> stored_scheme_of(const Ckpt& ck, const LoadOptions& opts) {
    std::optional<PackedScheme> s;
    if constexpr (std::is_base_of_v<detail::ShardSet<SafetensorsFile>, Ckpt>) {
      const std::string* first = nullptr;
      for (const auto& f : ck.files()) {
        const std::optional<PackedScheme> fs = PackedScheme::from_metadata(f.metadata(), f.path());
        if (first && (fs.has_value() != s.has_value() || (fs && *fs != *s)))
          throw format_error(f.path() + ": its __metadata__ declares " +
                             (fs ? "packed " + fs->describe() : "no packing") + ", but " + *first + " declares " +
                             (s ? "packed " + s->describe() : "no packing"));
        if (!first) first = &f.path(), s = fs;
      }
    }
    if (s && opts.quantize != quantization::none) {
      const bool q4 = opts.quantize == quantization::int4;
      const dtype q = q4 ? dtype::I4 : dtype::I8;
      const int64_t qb = q4 ? ops::kQ4Block : ops::kQ8Block;
      PackedScheme want = *s;
      want.weight = q, want.weight_block = qb;
      if (opts.lm_head_quantized()) want.lm_head = q, want.lm_head_block = qb;
      else if (ops::has_scales(s->lm_head)) want.lm_head = dtype::F32;  // anything unquantized: as embedded
      if (want != *s)
        throw tensor_error(ck.files().front().path() + ": holds stored packed " + s->describe() +
                           ", which LoadOptions::quantize = " + (q4 ? "int4" : "int8") +
                           (opts.lm_head_quantized() ? " with the LM head quantized" : "") +
                           " would not make; a stored packed folder is not quantized again at load (load it with "
                           "quantize = none, or convert the original weights)");
    }
    return s;
  }

  // Repacks every linear weight (and the tied LM head) into the kernels' panel layout, in int8 / int4 first with
  // LoadOptions::quantize, then tells the kernel it may drop the mapped source pages, so RSS holds the packed
  // weights, not both. The embedding keeps its stored rows (the lookup touches only the rows it reads).
  // Every matrix goes into one buffer, arena_: a model's matrices are mostly smaller than a huge page (opt-125m's
  // 768 x 768 int8 ones 0.6 MB), and one buffer puts them all on huge pages (a decode step then takes no TLB miss
  // per 4 KiB of them). On Zen 5 (2 threads, alternate runs) an int8 opt-125m token took 0.72-0.97x (median 0.93x)
  // as long as with a buffer per matrix.
  void pack_weights(const LoadOptions& opts) {
    (void)kernels::active();  // OPT_ISA errors surface at load, not inside the first forward pass
    ThreadPool pool;
    const bool q8 = opts.quantize != quantization::none;
    struct Job {
      const MatrixRef* src;
      PackedMatrix* dst;
      bool quantize;
    };
    std::vector<Job> jobs;  // in packing order
    for (DecoderLayerWeights& L : w_.layers)
      for (LinearWeights* l : {&L.q_proj, &L.k_proj, &L.v_proj, &L.out_proj, &L.fc1, &L.fc2})
        jobs.push_back({&l->weight, &l->packed, q8});
    jobs.push_back({&w_.project_in, &w_.project_in_packed, q8});
    jobs.push_back({&w_.project_out, &w_.project_out_packed, q8});
    if (head_) jobs.push_back({&w_.embed_tokens, &w_.lm_head_packed, opts.lm_head_quantized()});
    // the layout of each job's panels: of its source, or of the int8 / int4 matrix quantized from it
    const auto shape = [&](const Job& j) {
      MatrixRef t = *j.src;
      if (j.quantize) {
        t.type = opts.quantize == quantization::int4 ? dtype::I4 : dtype::I8;
        t.block = opts.quantize == quantization::int4 ? ops::kQ4Block : ops::kQ8Block;
      }
      return ops::packed_shape(t);
    };
    const auto align = [](size_t n) { return (n + 63) / 64 * 64; };
    size_t total = 0;
    for (const Job& j : jobs)
      if (j.src->data) total += align(shape(j).value_bytes()) + align(shape(j).scale_count() * sizeof(float));
    arena_ = std::make_shared<detail::LargeBuffer>(total);
    size_t at = 0;
    for (const Job& j : jobs) {
      const MatrixRef& m = *j.src;
      if (m.data) {
        const PackedMatrix s = shape(j);
        std::byte* values = arena_->data() + at;
        at += align(s.value_bytes());
        float* scales = s.scale_count() ? reinterpret_cast<float*>(arena_->data() + at) : nullptr;
        at += align(s.scale_count() * sizeof(float));
        if (j.quantize) {
          const QuantizedMatrix q =
              opts.quantize == quantization::int4 ? quantize_int4(m, &pool) : quantize_int8(m, &pool);
          *j.dst = ops::pack_into(q.ref(), &pool, values, scales, [](int64_t, int64_t) {});
        } else {  // the source's pages go as their panels are done (the embedding alone is 154 MB at 125m in f32)
          *j.dst = ops::pack_into(m, &pool, values, scales, [&](int64_t r0, int64_t r1) { release_pages(m, r0, r1); });
        }
      } else {
        *j.dst = {};
      }
      release_pages(m);
    }
    if (!head_) release_pages(w_.embed_tokens);
  }
  // Drops the pages of m's bytes when they lie inside a file mapping of the checkpoint (never heap memory: a
  // checkpoint read from bytes, or a tensor copied for alignment, keeps its data).
  void release_pages(const MatrixRef& m) const { release_pages(m, 0, m.rows); }
  // The same for rows [r0, r1) of m.
  void release_pages(const MatrixRef& m, int64_t r0, int64_t r1) const {
#if defined(__unix__) || defined(__APPLE__)
    if (!m.data || r1 <= r0) return;
    const auto* lo = m.row_ptr(r0);
    const auto* hi = m.row_ptr(r1);
    bool mapped = false;
    for (const auto& r : mappings_) mapped = mapped || (lo >= r.first && hi <= r.first + r.second);
    if (!mapped) return;
    const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
    const uintptr_t b = (reinterpret_cast<uintptr_t>(lo) + page - 1) / page * page;
    const uintptr_t e = reinterpret_cast<uintptr_t>(hi) / page * page;
    if (e > b) ::madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);  // only a hint; pages re-read if touched
#else
    (void)m, (void)r0, (void)r1;
#endif
  }


  Config config_;
  // the matrices packed (and quantized) at load, all in one buffer (pack_weights): stable addresses, shared by
  // copies of the Model like the checkpoint mapping
  std::shared_ptr<detail::LargeBuffer> arena_;
  activation act_ = activation::relu;
  std::shared_ptr<const void> checkpoint_;  // the Checkpoint or PytorchCheckpoint: keeps the mappings alive
  ModelWeights w_;
  std::string prefix_;
  std::vector<std::string> unexpected_;
  // vectors widened to f32 and tensors copied for alignment: shared by copies of the Model, like the packed weights
  // (ModelWeights points into them; a copy of the containers would leave those pointers on the original's)
  std::shared_ptr<std::deque<std::vector<float>>> owned_floats_ = std::make_shared<std::deque<std::vector<float>>>();
  std::shared_ptr<std::deque<std::vector<std::byte>>> owned_bytes_ =
      std::make_shared<std::deque<std::vector<std::byte>>>();
  std::vector<std::pair<const std::byte*, size_t>> mappings_;  // the checkpoint's file mappings
  std::optional<PackedScheme> scheme_;  // a stored packed folder's scheme
  LayerRange layers_;                   // the part held (LoadOptions::layers, resolved)
  bool embeddings_ = true, head_ = true;
  bool approx_ = false;                   // LoadOptions::approximate_int8
  std::shared_ptr<RemoteLayers> remote_;  // the layers beyond layers_.last (set_remote_layers)
};

OPT_NAMESPACE_END
