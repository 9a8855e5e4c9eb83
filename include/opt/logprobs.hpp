// Log-probabilities of tokens: log_softmax of a row of logits, computed stably (x - max - log sum exp(x - max), each
// exp in float, summed in double), the chosen token's value and the top N, as the OpenAI completions API reports
// them ("logprobs"), and a prompt's own log-probabilities (each prompt token given the ones before it, "echo" with
// logprobs).
//
// These are of the model's raw distribution: the logits as the model computed them, before logit_bias, penalties,
// temperature, top-k or top-p (what vLLM returns by default). A host that wants the processed distribution has
// Sampler::distribution.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "opt/error.hpp"
#include "opt/model.hpp"

OPT_NAMESPACE_BEGIN

// One token and its log-probability.
struct TokenLogprob {
  int32_t token = 0;
  double logprob = 0;
};

// One position: the token there, its log-probability, and the most likely tokens (most likely first, ties in id
// order).
struct PositionLogprobs {
  int32_t token = 0;
  double logprob = 0;
  std::vector<TokenLogprob> top;
};

// log(sum(exp(logits))) over n logits, computed stably: max + log(sum(exp(x - max))), each exp in float (x - max
// <= 0: no overflow; 2.4x faster than in double) summed in double, within ~1e-7 of the exact value. -inf when every
// logit is -inf; NaN when one is NaN; +inf when one is +inf.
inline double log_sum_exp(const float* logits, int64_t n) noexcept {
  if (n <= 0) return -std::numeric_limits<double>::infinity();
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    const float v = logits[i];
    if (v != v) return double(v);
    mx = std::max(mx, v);
  }
  if (std::isinf(mx)) return double(mx);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += double(std::exp(logits[i] - mx));
  return double(mx) + std::log(sum);
}

// out[i] = log_softmax(logits)[i] for the n logits.
inline void log_softmax(const float* logits, int64_t n, double* out) noexcept {
  const double lse = log_sum_exp(logits, n);
  for (int64_t i = 0; i < n; ++i) out[i] = double(logits[i]) - lse;
}

// The log-probability of `token` under the n logits and the `top_n` most likely tokens (at most n; most likely first,
// ties in id order, NaN counting as the largest as in argmax). Throws input_error for a token outside [0, n) or a
// negative top_n.
inline PositionLogprobs logprobs(const float* logits, int64_t n, int32_t token, int64_t top_n) {
  if (token < 0 || token >= n)
    throw input_error("logprobs: token " + std::to_string(token) + " is outside the vocabulary [0, " +
                      std::to_string(n) + ")");
  if (top_n < 0) throw input_error("logprobs: top_n = " + std::to_string(top_n) + ", expected >= 0");
  const double lse = log_sum_exp(logits, n);
  PositionLogprobs out;
  out.token = token;
  out.logprob = double(logits[token]) - lse;
  const size_t k = size_t(std::min(top_n, n));
  if (k == 0) return out;
  // a min-heap of the k best seen so far: its front is the worst of them
  auto better = [&](int32_t a, int32_t b) {
    const float x = logits[a], y = logits[b];
    const bool nx = x != x, ny = y != y;
    if (nx || ny) return nx == ny ? a < b : nx;
    return x > y || (x == y && a < b);
  };
  std::vector<int32_t> heap;
  heap.reserve(k);
  float worst = 0;  // the value at the heap's front, once full
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = int32_t(i);
    const float v = logits[i];
    if (heap.size() == k && !(v >= worst) && v == v) continue;  // smaller than the worst kept: the common case
    if (heap.size() < k) {
      heap.push_back(id);
      std::push_heap(heap.begin(), heap.end(), better);
    } else if (better(id, heap.front())) {
      std::pop_heap(heap.begin(), heap.end(), better);
      heap.back() = id;
      std::push_heap(heap.begin(), heap.end(), better);
    }
    worst = logits[heap.front()];
  }
  std::sort(heap.begin(), heap.end(), better);
  out.top.reserve(k);
  for (int32_t id : heap) out.top.push_back({id, double(logits[id]) - lse});
  return out;
}

// A prompt's own log-probabilities: entry i is prompt[i + 1] given prompt[0 .. i] (the first token has none, so
// prompt.size() - 1 entries), with the top_n most likely tokens at each position. One forward pass over the prompt
// with every position's logits, on a KV cache of its own (element type `kv_cache`), in `ws`. The logits are the
// ones any batch computes for these positions (opt::Batch gives every row the bits it gets alone).
inline std::vector<PositionLogprobs> prompt_logprobs(const Model& model, const std::vector<int32_t>& prompt,
                                                     int64_t top_n, Workspace& ws, dtype kv_cache = dtype::F32) {
  const Config& c = model.config();
  if (prompt.empty()) throw input_error("prompt_logprobs: empty prompt");
  if (int64_t(prompt.size()) > c.max_position_embeddings)
    throw input_error("prompt_logprobs: a prompt of " + std::to_string(prompt.size()) +
                      " tokens, beyond max_position_embeddings " + std::to_string(c.max_position_embeddings));
  for (size_t j = 0; j < prompt.size(); ++j)
    if (prompt[j] < 0 || prompt[j] >= c.vocab_size)
      throw input_error("prompt_logprobs: prompt token " + std::to_string(j) + " = " + std::to_string(prompt[j]) +
                        " is outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
  std::vector<PositionLogprobs> out;
  if (prompt.size() < 2) return out;
  KvCache cache(c, int64_t(prompt.size()), kv_cache);
  // the last position predicts a token after the prompt: not needed, so it is not run
  const LogitsView lv = model.forward({{&cache, prompt.data(), int64_t(prompt.size()) - 1, true}}, ws);
  out.reserve(prompt.size() - 1);
  for (size_t i = 0; i + 1 < prompt.size(); ++i)
    out.push_back(logprobs(lv.row(int64_t(i)), lv.cols, prompt[i + 1], top_n));
  return out;
}

OPT_NAMESPACE_END
