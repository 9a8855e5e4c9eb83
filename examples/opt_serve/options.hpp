// opt-serve's settings: the command line (main.cpp), read by the scheduler and the HTTP layer.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "../speculation_option.hpp"

namespace opt_serve {

struct ServerOptions {
  std::string model_dir, tokenizer_dir, host = "127.0.0.1", model_name;
  int port = 8080;
  size_t max_batch = 16, max_queue = 64, threads = 0, http_threads = 0, max_prompts = 32;
  size_t max_body_bytes = 1 << 20;
  int64_t max_tokens_limit = 0;  // 0: the model's context
  int timeout_s = 30;       // writing an answer (each piece of a stream)
  int head_timeout_s = 10;  // reading a request's head; also how long an idle keep-alive connection stays
  int body_timeout_s = 30;  // reading a request's body
  size_t max_connections = 4096;  // open connections; beyond: 503 and close
  int step_delay_ms = 0;  // testing and demos: sleep after each step so streams can be watched
  std::string kv_cache = "f32";  // every sequence's KV cache element type (--kv-cache)
  size_t cache_bytes = size_t(256) << 20;  // the prefix cache's budget (--cache-bytes; 0: no prefix cache)
  int64_t cache_block_tokens = 16;         // its blocks' positions (--cache-block-tokens)
  SpeculationFlags spec;         // --lookup, --draft-self, --draft, --draft-tokens
};

}  // namespace opt_serve
