// opt::Config: the OPTConfig of transformers, read from config.json. Field names are the config.json keys;
// keys an older file lacks take transformers' defaults (OPTConfig.__init__, v4.36). Everything the model needs
// is validated here, so the loader and the forward pass can trust it.
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "opt/error.hpp"
#include "opt/kernels/activation.hpp"

OPT_NAMESPACE_BEGIN


struct Config {
  int64_t vocab_size = 50272;
  int64_t hidden_size = 768;
  int64_t num_hidden_layers = 12;
  int64_t ffn_dim = 3072;
  int64_t num_attention_heads = 12;
  int64_t max_position_embeddings = 2048;
  int64_t word_embed_proj_dim = 768;  // null in config.json means hidden_size
  bool do_layer_norm_before = true;
  bool _remove_final_layer_norm = false;
  bool enable_bias = true;
  bool layer_norm_elementwise_affine = true;
  std::string activation_function = "relu";
  int64_t bos_token_id = 2;
  int64_t eos_token_id = 2;
  int64_t pad_token_id = 1;
  std::string torch_dtype = "float32";
  double layer_norm_eps = 1e-5;  // nn.LayerNorm's default; OPT does not set it

  // ---- derived ----
  int64_t head_dim() const noexcept { return hidden_size / num_attention_heads; }
  bool has_final_layer_norm() const noexcept { return do_layer_norm_before && !_remove_final_layer_norm; }
  bool has_projections() const noexcept { return word_embed_proj_dim != hidden_size; }
  activation act() const {
    const std::string& a = activation_function;
    if (a == "relu") return activation::relu;
    if (a == "gelu") return activation::gelu;
    if (a == "gelu_new" || a == "gelu_pytorch_tanh" || a == "gelu_fast") return activation::gelu_new;
    if (a == "silu" || a == "swish") return activation::silu;
    if (a == "quick_gelu") return activation::quick_gelu;
    if (a == "tanh") return activation::tanh;
    if (a == "sigmoid") return activation::sigmoid;
    throw config_error("activation_function: unsupported value \"" + a +
                       "\" (expected relu, gelu, gelu_new, gelu_pytorch_tanh, gelu_fast, silu, swish, quick_gelu, "
                       "tanh or sigmoid)");
  }

  // Throws config_error naming the key when a value is out of range or inconsistent. `source` prefixes messages.
  void validate(const std::string& source = "config") const {
    auto positive = [&](const char* key, int64_t v, int64_t max) {
      if (v <= 0 || v > max)
        throw config_error(source + ": " + key + " = " + std::to_string(v) + ", expected 1.." + std::to_string(max));
    };
    // Caps far above any OPT model (66B: hidden 9216, 64 layers, ffn 36864) that keep size products in range.
    positive("vocab_size", vocab_size, int64_t(1) << 24);
    positive("hidden_size", hidden_size, int64_t(1) << 17);
    positive("num_hidden_layers", num_hidden_layers, 4096);
    positive("ffn_dim", ffn_dim, int64_t(1) << 19);
    positive("num_attention_heads", num_attention_heads, 4096);
    positive("max_position_embeddings", max_position_embeddings, int64_t(1) << 20);
    positive("word_embed_proj_dim", word_embed_proj_dim, int64_t(1) << 17);
    if (hidden_size % num_attention_heads != 0)
      throw config_error(source + ": hidden_size " + std::to_string(hidden_size) +
                         " is not divisible by num_attention_heads " + std::to_string(num_attention_heads));
    auto token = [&](const char* key, int64_t v) {
      if (v < 0 || v >= vocab_size)
        throw config_error(source + ": " + key + " = " + std::to_string(v) + " is outside the vocabulary [0, " +
                           std::to_string(vocab_size) + ")");
    };
    token("bos_token_id", bos_token_id);
    token("eos_token_id", eos_token_id);
    token("pad_token_id", pad_token_id);
    if (!(layer_norm_eps > 0)) throw config_error(source + ": layer_norm_eps must be positive");
    (void)act();
  }

  static Config from_json(const nlohmann::json& j, const std::string& source = "config.json") {
    if (!j.is_object()) throw config_error(source + ": expected a JSON object");
    Config c;
    auto get_int = [&](const char* key, int64_t& out) {
      auto it = j.find(key);
      if (it == j.end() || it->is_null()) return;
      if (!it->is_number_integer())
        throw config_error(source + ": " + key + " must be an integer, found " + it->dump());
      if (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
        throw config_error(source + ": " + key + " = " + it->dump() + " is out of range");
      out = it->get<int64_t>();
    };
    auto get_bool = [&](const char* key, bool& out) {
      auto it = j.find(key);
      if (it == j.end() || it->is_null()) return;
      if (!it->is_boolean()) throw config_error(source + ": " + key + " must be true or false, found " + it->dump());
      out = it->get<bool>();
    };
    auto get_str = [&](const char* key, std::string& out) {
      auto it = j.find(key);
      if (it == j.end() || it->is_null()) return;
      if (!it->is_string()) throw config_error(source + ": " + key + " must be a string, found " + it->dump());
      out = it->get<std::string>();
    };
    if (auto it = j.find("model_type"); it != j.end() && !(it->is_string() && *it == "opt"))
      throw config_error(source + ": model_type is " + it->dump() + ", expected \"opt\"");
    get_int("vocab_size", c.vocab_size);
    get_int("hidden_size", c.hidden_size);
    get_int("num_hidden_layers", c.num_hidden_layers);
    get_int("ffn_dim", c.ffn_dim);
    get_int("num_attention_heads", c.num_attention_heads);
    get_int("max_position_embeddings", c.max_position_embeddings);
    c.word_embed_proj_dim = c.hidden_size;
    get_int("word_embed_proj_dim", c.word_embed_proj_dim);
    get_bool("do_layer_norm_before", c.do_layer_norm_before);
    get_bool("_remove_final_layer_norm", c._remove_final_layer_norm);
    get_bool("enable_bias", c.enable_bias);
    get_bool("layer_norm_elementwise_affine", c.layer_norm_elementwise_affine);
    get_str("activation_function", c.activation_function);
    get_int("bos_token_id", c.bos_token_id);
    get_int("eos_token_id", c.eos_token_id);
    get_int("pad_token_id", c.pad_token_id);
    get_str("torch_dtype", c.torch_dtype);
    c.validate(source);
    return c;
  }

  static Config from_file(const std::filesystem::path& path) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) throw io_error(path.string() + ": is a directory, expected config.json");
    // A FIFO or device would block or never end: only regular files (or symlinks to them) are read.
    if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec))
      throw io_error(path.string() + ": not a regular file");
    std::ifstream in(path, std::ios::binary);
    if (!in) throw io_error(path.string() + ": cannot open");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw format_error(path.string() + ": malformed JSON: " + e.what());
    }
    return from_json(j, path.string());
  }
};

OPT_NAMESPACE_END
