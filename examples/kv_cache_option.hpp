// The --kv-cache option of opt-generate and opt-serve: the KV cache's element type by name.
#pragma once
#include <CLI/CLI.hpp>
#include <opt/model.hpp>
#include <string>

// --kv-cache NAME: the names opt::kv_cache_type_from_string takes (its message for any other).
inline CLI::Validator kv_cache_validator() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        try {
          (void)opt::kv_cache_type_from_string(s);
          return {};
        } catch (const opt::error& e) {  // its message without the "[opt.config] " kind
          const std::string w = e.what();
          const size_t k = w.find("] ");
          return k == std::string::npos ? w : w.substr(k + 2);
        }
      },
      "f32|f16|bf16");
}
