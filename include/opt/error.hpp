// opt::error and its subclasses: every failure a host can cause (bad file, bad config, bad input) is reported
// as one of these, with a stable "[opt.<kind>] " prefix and a message naming what was expected and what was found.
#pragma once
#include <stdexcept>
#include <string>
#include <utility>

#include "opt/version.hpp"

OPT_NAMESPACE_BEGIN

enum class error_kind {
  io,           // a file cannot be opened, mapped or read
  format,       // a file's bytes do not follow its format (safetensors header, JSON, pickle, merges.txt ...)
  config,       // config.json values that are missing, inconsistent or unsupported
  tensor,       // a checkpoint tensor is missing, unexpected, or has the wrong dtype or shape
  input,        // bad arguments at the API: token id out of range, empty batch, too long for the context ...
  tokenizer,    // tokenizer files or ids the tokenizer cannot handle
  limit,        // a request would exceed a documented limit (memory, header size, ...)
};

inline const char* to_string(error_kind k) noexcept {
  switch (k) {
    case error_kind::io: return "io";
    case error_kind::format: return "format";
    case error_kind::config: return "config";
    case error_kind::tensor: return "tensor";
    case error_kind::input: return "input";
    case error_kind::tokenizer: return "tokenizer";
    case error_kind::limit: return "limit";
  }
  return "unknown";
}

class error : public std::runtime_error {
 public:
  error(error_kind kind, const std::string& what)
      : std::runtime_error(std::string("[opt.") + to_string(kind) + "] " + what), kind_(kind) {}
  error_kind kind() const noexcept { return kind_; }

 private:
  error_kind kind_;
};

struct io_error : error {
  explicit io_error(const std::string& what) : error(error_kind::io, what) {}
};
struct format_error : error {
  explicit format_error(const std::string& what) : error(error_kind::format, what) {}
};
struct config_error : error {
  explicit config_error(const std::string& what) : error(error_kind::config, what) {}
};
struct tensor_error : error {
  explicit tensor_error(const std::string& what) : error(error_kind::tensor, what) {}
};
struct input_error : error {
  explicit input_error(const std::string& what) : error(error_kind::input, what) {}
};
struct tokenizer_error : error {
  explicit tokenizer_error(const std::string& what) : error(error_kind::tokenizer, what) {}
};
struct limit_error : error {
  explicit limit_error(const std::string& what) : error(error_kind::limit, what) {}
};

OPT_NAMESPACE_END
