// Random-weight OPT checkpoints (config.json + safetensors, sharded like the hub's) of any shape, for benchmarks
// and tests that must run without a download. The weights are deterministic for a given seed; every tensor is
// random (biases and LayerNorm parameters too), with magnitudes like a trained OPT (weights ~ U(-a, a), std
// 0.02-ish). Also in the stored packed format (packed.hpp), int8 or float panels, made tensor by tensor.
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "opt/config.hpp"
#include "opt/detail/fp16.hpp"
#include "opt/error.hpp"
#include "opt/packed.hpp"
#include "opt/safetensors.hpp"

OPT_NAMESPACE_BEGIN

// The published facebook/opt-* models, by name, as their config.json files have them (weights not included).
// Every one has vocab_size 50272, max_position_embeddings 2048, ReLU, biases, affine LayerNorms.
struct OptShape {
  const char* name;
  int64_t hidden, layers, heads, ffn, word_embed_proj_dim;
  bool pre_ln;  // do_layer_norm_before (opt-350m is the one post-LN model)
};
inline constexpr OptShape kOptShapes[] = {
    {"opt-125m", 768, 12, 12, 3072, 768, true},       {"opt-350m", 1024, 24, 16, 4096, 512, false},
    {"opt-1.3b", 2048, 24, 32, 8192, 2048, true},     {"opt-2.7b", 2560, 32, 32, 10240, 2560, true},
    {"opt-6.7b", 4096, 32, 32, 16384, 4096, true},    {"opt-13b", 5120, 40, 40, 20480, 5120, true},
    {"opt-30b", 7168, 48, 56, 28672, 7168, true},     {"opt-66b", 9216, 64, 72, 36864, 9216, true},
};

// "opt-1.3b" or "1.3b" (also "facebook/opt-1.3b").
inline Config opt_shape(const std::string& name) {
  std::string n = name;
  if (n.rfind("facebook/", 0) == 0) n = n.substr(9);
  if (n.rfind("opt-", 0) != 0) n = "opt-" + n;
  for (const OptShape& s : kOptShapes)
    if (n == s.name) {
      Config c;  // defaults are opt-125m's
      c.hidden_size = s.hidden, c.num_hidden_layers = s.layers, c.num_attention_heads = s.heads;
      c.ffn_dim = s.ffn, c.word_embed_proj_dim = s.word_embed_proj_dim, c.do_layer_norm_before = s.pre_ln;
      return c;
    }
  std::string known;
  for (const OptShape& s : kOptShapes) known += std::string(known.empty() ? "" : ", ") + s.name;
  throw input_error("opt_shape: unknown model '" + name + "' (expected one of " + known + ")");
}

inline nlohmann::ordered_json config_json(const Config& c) {
  nlohmann::ordered_json j;
  j["model_type"] = "opt";
  j["architectures"] = {"OPTForCausalLM"};
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["ffn_dim"] = c.ffn_dim;
  j["num_attention_heads"] = c.num_attention_heads;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["word_embed_proj_dim"] = c.word_embed_proj_dim;
  j["do_layer_norm_before"] = c.do_layer_norm_before;
  j["_remove_final_layer_norm"] = c._remove_final_layer_norm;
  j["enable_bias"] = c.enable_bias;
  j["layer_norm_elementwise_affine"] = c.layer_norm_elementwise_affine;
  j["activation_function"] = c.activation_function;
  j["bos_token_id"] = c.bos_token_id;
  j["eos_token_id"] = c.eos_token_id;
  j["pad_token_id"] = c.pad_token_id;
  j["torch_dtype"] = c.torch_dtype;
  return j;
}

namespace detail {
// splitmix64: a tiny seeded generator; one stream per tensor so the file does not depend on write order.
struct SplitMix {
  uint64_t s;
  uint64_t next() noexcept {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform() noexcept { return float(next() >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f; }  // [-1, 1)
};
}  // namespace detail

// The tensors of a checkpoint of shape c, in the order the hub's files list them (names "model.decoder.*",
// lm_head tied): name, shape, and kind (0 = weight, 1 = bias, 2 = LayerNorm weight).
struct RandomTensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  int kind;
  size_t elements() const noexcept {
    size_t n = 1;
    for (int64_t d : shape) n *= size_t(d);
    return n;
  }
};

inline std::vector<RandomTensorSpec> random_checkpoint_tensors(const Config& c) {
  std::vector<RandomTensorSpec> specs;
  const int64_t H = c.hidden_size, E = c.word_embed_proj_dim, F = c.ffn_dim;
  const std::string p = "model.decoder.";
  specs.push_back({p + "embed_tokens.weight", {c.vocab_size, E}, 0});
  specs.push_back({p + "embed_positions.weight", {c.max_position_embeddings + 2, H}, 0});
  if (c.has_projections()) {
    specs.push_back({p + "project_in.weight", {H, E}, 0});
    specs.push_back({p + "project_out.weight", {E, H}, 0});
  }
  auto ln = [&](const std::string& n) {
    if (!c.layer_norm_elementwise_affine) return;
    specs.push_back({n + ".weight", {H}, 2});
    specs.push_back({n + ".bias", {H}, 1});
  };
  auto lin = [&](const std::string& n, int64_t out, int64_t in) {
    specs.push_back({n + ".weight", {out, in}, 0});
    if (c.enable_bias) specs.push_back({n + ".bias", {out}, 1});
  };
  if (c.has_final_layer_norm()) ln(p + "final_layer_norm");
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string q = p + "layers." + std::to_string(l) + ".";
    for (const char* m : {"q_proj", "k_proj", "v_proj", "out_proj"}) lin(q + "self_attn." + m, H, H);
    ln(q + "self_attn_layer_norm");
    lin(q + "fc1", F, H);
    lin(q + "fc2", H, F);
    ln(q + "final_layer_norm");
  }
  return specs;
}

// How a random checkpoint is written.
struct RandomCheckpointOptions {
  // F32, F16 or BF16; or I8 (I4 once it exists): the stored packed format with the linear weights quantized.
  dtype type = dtype::F32;
  // With type I8 / I4: the type of the other tensors and of the LM head's panels. The quantizer reads the weights
  // rounded to it, so the folder runs to the bits of the float_type folder of the same seed loaded with
  // LoadOptions::quantize.
  dtype float_type = dtype::F32;
  bool packed = false;  // with a float type: the stored packed format, the linear weights in panels of that type
  uint64_t seed = 1;
  // Shards of at most this many bytes of tensor data (a tensor larger than that gets a shard of its own), named
  // model-00001-of-0000N.safetensors and listed by model.safetensors.index.json, as the hub does; a checkpoint
  // that fits in one is a single model.safetensors. 0: always one file. Default 5 GB, transformers' default.
  uint64_t max_shard_bytes = 5000000000ull;
};

namespace detail {
// Tensor i of specs (seed `seed`) as `type` (F32, F16 or BF16): f32 holds the values, h16 their 16-bit forms;
// returns the bytes.
inline const void* random_tensor(const RandomTensorSpec& s, size_t i, uint64_t seed, dtype type,
                                 std::vector<float>& f32, std::vector<uint16_t>& h16) {
  const size_t n = s.elements();
  SplitMix rng{seed * 0x100000001b3ull + i};
  f32.resize(n);
  // U(-a, a): std a/sqrt(3); 0.035 gives std 0.02 like OPT's init
  const float a = s.kind == 0 ? 0.035f : 0.02f;
  for (size_t e = 0; e < n; ++e) f32[e] = (s.kind == 2 ? 1.0f : 0.0f) + a * rng.uniform();
  if (type == dtype::F32) return f32.data();
  h16.resize(n);
  for (size_t e = 0; e < n; ++e) h16[e] = type == dtype::F16 ? f32_to_f16(f32[e]) : f32_to_bf16(f32[e]);
  return h16.data();
}

// The packed form of write_random_checkpoint (below): jobs for packed.hpp's writer, one tensor made at a time.
inline void write_random_packed(const std::filesystem::path& dir, const RandomCheckpointOptions& o,
                                const std::vector<RandomTensorSpec>& specs) {
  const bool quantized = ops::has_scales(o.type);
  const dtype ft = quantized ? o.float_type : o.type;
  PackedScheme scheme;
  scheme.weight = o.type;
  scheme.weight_block = packed_block(o.type, "write_random_checkpoint");
  scheme.lm_head = ft, scheme.lm_head_block = 0;
  auto pool = std::make_shared<ThreadPool>();
  std::vector<WriteJob> jobs;
  auto pack = [&](size_t i, const std::string& name, dtype to) {
    const RandomTensorSpec& s = specs[i];
    jobs.push_back(packed_job(name, to, s.shape[0], s.shape[1], [&s, i, seed = o.seed, ft, to, pool] {
      std::vector<float> f32;
      std::vector<uint16_t> h16;
      const void* data = random_tensor(s, i, seed, ft, f32, h16);
      return pack_as(MatrixRef{ft, data, s.shape[0], s.shape[1]}, to, pool.get());
    }));
  };
  size_t embed = specs.size();
  for (size_t i = 0; i < specs.size(); ++i) {
    const RandomTensorSpec& s = specs[i];
    if (s.name == "model.decoder.embed_tokens.weight") embed = i;
    if (is_linear_weight(s.name)) {
      pack(i, s.name, o.type);
      continue;
    }
    WriteJob j;
    j.tensors.push_back({s.name, ft, s.shape, nullptr});
    j.produce = [&s, i, seed = o.seed, ft](const std::function<void(const void*, size_t)>& emit) {
      std::vector<float> f32;
      std::vector<uint16_t> h16;
      emit(random_tensor(s, i, seed, ft, f32, h16), s.elements() * dtype_size(ft));
    };
    jobs.push_back(std::move(j));
  }
  pack(embed, "lm_head.weight", scheme.lm_head);  // the tied head: embed_tokens' values
  write_jobs(dir, jobs, scheme.metadata(), o.max_shard_bytes);
}
}  // namespace detail

// Writes dir/config.json and the safetensors file(s). Streams one tensor at a time: memory use is one tensor (the
// largest is the embedding table; packed, its float, quantized and packed forms), not the model. Tensor i's
// values depend only on the seed and i, so the sharding never changes the weights.
inline void write_random_checkpoint(const std::filesystem::path& dir, Config c, const RandomCheckpointOptions& o) {
  const dtype type = ops::has_scales(o.type) ? o.float_type : o.type;
  if (type != dtype::F32 && type != dtype::F16 && type != dtype::BF16)
    throw input_error(std::string("write_random_checkpoint: dtype must be F32, F16, BF16 or I8 (I4), with a float "
                                  "type of F32, F16 or BF16; got ") + to_string(o.type) +
                      (ops::has_scales(o.type) ? std::string(" with ") + to_string(o.float_type) : std::string()));
  if (ops::has_scales(o.type)) (void)packed_block(o.type, "write_random_checkpoint");
  c.torch_dtype = type == dtype::F32 ? "float32" : type == dtype::F16 ? "float16" : "bfloat16";
  c.validate("write_random_checkpoint");
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir / "config.json");
    if (!f) throw io_error((dir / "config.json").string() + ": cannot open for writing");
    f << config_json(c).dump(2) << '\n';
    if (!f) throw io_error((dir / "config.json").string() + ": write failed");
  }
  const std::vector<RandomTensorSpec> specs = random_checkpoint_tensors(c);
  if (o.packed || ops::has_scales(o.type)) return detail::write_random_packed(dir, o, specs);
  const size_t es = dtype_size(type);
  std::vector<uint64_t> sizes;
  uint64_t total = 0;
  for (const RandomTensorSpec& s : specs) total += sizes.emplace_back(uint64_t(s.elements()) * es);
  const std::vector<size_t> starts = shard_starts(sizes, o.max_shard_bytes);
  const size_t n_shards = starts.size() - 1;
  auto shard_name = [&](size_t k) {
    return n_shards == 1 ? std::string("model.safetensors") : shard_file_name(k + 1, n_shards);
  };
  // what an earlier write of the other form left would be read instead of (or beside) this one
  std::error_code ec;
  std::filesystem::remove(dir / "model.safetensors.index.json", ec);
  if (n_shards > 1) std::filesystem::remove(dir / "model.safetensors", ec);
  std::vector<float> f32;
  std::vector<uint16_t> h16;
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (size_t k = 0; k < n_shards; ++k) {
    std::vector<TensorData> td;
    for (size_t i = starts[k]; i < starts[k + 1]; ++i) {
      td.push_back({specs[i].name, type, specs[i].shape, nullptr});
      weight_map[specs[i].name] = shard_name(k);
    }
    const std::string header = safetensors_header(td, {{"format", "pt"}});
    const auto path = dir / shard_name(k);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) throw io_error(path.string() + ": cannot open for writing");
    out.write(header.data(), std::streamsize(header.size()));
    for (size_t i = starts[k]; i < starts[k + 1]; ++i) {
      const void* data = detail::random_tensor(specs[i], i, o.seed, type, f32, h16);
      out.write(static_cast<const char*>(data), std::streamsize(sizes[i]));
    }
    out.flush();
    if (!out) throw io_error(path.string() + ": write failed");
  }
  if (n_shards > 1) write_shard_index(dir / "model.safetensors.index.json", weight_map, total);
}

// The same with the default options but type and seed (5 GB shards), kept for existing callers.
inline void write_random_checkpoint(const std::filesystem::path& dir, Config c, dtype type, uint64_t seed) {
  RandomCheckpointOptions o;
  o.type = type;
  o.seed = seed;
  write_random_checkpoint(dir, std::move(c), o);
}

OPT_NAMESPACE_END
