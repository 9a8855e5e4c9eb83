// Random-weight OPT checkpoints (config.json + model.safetensors) of any shape, for benchmarks and tests that
// must run without a download. The weights are deterministic for a given seed; every tensor is random (biases
// and LayerNorm parameters too), with magnitudes like a trained OPT (weights ~ U(-a, a), std 0.02-ish).
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
#include "opt/safetensors.hpp"

OPT_NAMESPACE_BEGIN

// The shapes of the facebook/opt-* models (config.json values; weights not included).
inline Config opt_shape(const std::string& name) {
  Config c;  // defaults are opt-125m's
  if (name == "opt-125m" || name == "125m") return c;
  if (name == "opt-350m" || name == "350m") {
    c.hidden_size = 1024, c.num_hidden_layers = 24, c.ffn_dim = 4096, c.num_attention_heads = 16;
    c.word_embed_proj_dim = 512, c.do_layer_norm_before = false;
    return c;
  }
  if (name == "opt-1.3b" || name == "1.3b") {
    c.hidden_size = 2048, c.num_hidden_layers = 24, c.ffn_dim = 8192, c.num_attention_heads = 32;
    c.word_embed_proj_dim = 2048;
    return c;
  }
  throw input_error("opt_shape: unknown model '" + name + "' (expected opt-125m, opt-350m or opt-1.3b)");
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

// Writes dir/config.json and dir/model.safetensors (names "model.decoder.*", lm_head tied) with weights of
// type F32, F16 or BF16. Streams one tensor at a time: memory use is one tensor, not the model.
inline void write_random_checkpoint(const std::filesystem::path& dir, Config c, dtype type, uint64_t seed) {
  if (type != dtype::F32 && type != dtype::F16 && type != dtype::BF16)
    throw input_error("write_random_checkpoint: dtype must be F32, F16 or BF16");
  c.torch_dtype = type == dtype::F32 ? "float32" : type == dtype::F16 ? "float16" : "bfloat16";
  c.validate("write_random_checkpoint");
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir / "config.json");
    if (!f) throw io_error((dir / "config.json").string() + ": cannot open for writing");
    f << config_json(c).dump(2) << '\n';
  }
  // the tensor list: name, shape, kind (0 = weight, 1 = bias, 2 = LayerNorm weight)
  struct Spec {
    std::string name;
    std::vector<int64_t> shape;
    int kind;
  };
  std::vector<Spec> specs;
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
  std::vector<TensorData> td;
  for (const Spec& s : specs) td.push_back({s.name, type, s.shape, nullptr});
  const std::string header = safetensors_header(td, {{"format", "pt"}});
  const auto path = dir / "model.safetensors";
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw io_error(path.string() + ": cannot open for writing");
  out.write(header.data(), std::streamsize(header.size()));
  std::vector<float> f32;
  std::vector<uint16_t> h16;
  for (size_t i = 0; i < specs.size(); ++i) {
    const Spec& s = specs[i];
    size_t n = 1;
    for (int64_t d : s.shape) n *= size_t(d);
    detail::SplitMix rng{seed * 0x100000001b3ull + i};
    f32.resize(n);
    // U(-a, a): std a/sqrt(3); 0.035 gives std 0.02 like OPT's init
    const float a = s.kind == 0 ? 0.035f : 0.02f;
    for (size_t k = 0; k < n; ++k) f32[k] = (s.kind == 2 ? 1.0f : 0.0f) + a * rng.uniform();
    if (type == dtype::F32) {
      out.write(reinterpret_cast<const char*>(f32.data()), std::streamsize(n * 4));
    } else {
      h16.resize(n);
      for (size_t k = 0; k < n; ++k)
        h16[k] = type == dtype::F16 ? detail::f32_to_f16(f32[k]) : detail::f32_to_bf16(f32[k]);
      out.write(reinterpret_cast<const char*>(h16.data()), std::streamsize(n * 2));
    }
  }
  out.flush();
  if (!out) throw io_error(path.string() + ": write failed");
}

OPT_NAMESPACE_END
