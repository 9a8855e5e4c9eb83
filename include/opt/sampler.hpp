// Choosing the next token from logits. Greedy (argmax) is the default and matches transformers bit for bit.
// Sampling follows transformers' order and semantics: repetition penalty, then temperature, top-k, top-p, then a
// draw from the softmax. OpenAI's logit_bias, presence_penalty and frequency_penalty, when set, come in vLLM's
// order: the bias first, then the repetition penalty, then the presence and frequency penalties (over the generated
// ids only), all before temperature; greedy applies them too. The random stream is our own (std::mt19937_64): the
// same seed gives the same output here, though not the same numbers as torch's generator.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "opt/error.hpp"
#include "opt/kernels/kernels.hpp"

OPT_NAMESPACE_BEGIN

// Index of the largest value; the first one on ties (torch.argmax). NaN compares as larger than everything,
// as in torch.
inline int32_t argmax(const float* logits, int64_t n) { return int32_t(ops::argmax(logits, n)); }

struct SamplingOptions {
  float temperature = 1.0f;         // with do_sample; <= 0 means greedy
  int64_t top_k = 0;                // 0: off
  float top_p = 1.0f;               // 1: off
  float repetition_penalty = 1.0f;  // 1: off; applied to every id of the prompt and of the output so far
  uint64_t seed = 0;
  bool do_sample = false;           // false: greedy (repetition_penalty still applies, as in transformers)
  // OpenAI's penalties, over the generated ids only (not the prompt): logit[j] -= presence_penalty * (count[j] > 0)
  // + frequency_penalty * count[j], count[j] = how often j was generated so far. 0: off.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // OpenAI's logit_bias: (id, bias) pairs added to the logits (an id listed twice gets both). Empty: off.
  std::vector<std::pair<int32_t, float>> logit_bias;

  void validate() const {
    if (!(temperature >= 0.0f) || !std::isfinite(temperature))
      throw input_error("sampling: temperature = " + std::to_string(temperature) + ", expected a finite value >= 0");
    if (top_k < 0) throw input_error("sampling: top_k = " + std::to_string(top_k) + ", expected >= 0");
    if (!(top_p > 0.0f && top_p <= 1.0f))
      throw input_error("sampling: top_p = " + std::to_string(top_p) + ", expected 0 < top_p <= 1");
    if (!(repetition_penalty > 0.0f) || !std::isfinite(repetition_penalty))
      throw input_error("sampling: repetition_penalty = " + std::to_string(repetition_penalty) + ", expected > 0");
    if (!std::isfinite(presence_penalty))
      throw input_error("sampling: presence_penalty = " + std::to_string(presence_penalty) +
                        ", expected a finite value");
    if (!std::isfinite(frequency_penalty))
      throw input_error("sampling: frequency_penalty = " + std::to_string(frequency_penalty) +
                        ", expected a finite value");
    for (auto& [id, bias] : logit_bias) {
      if (id < 0) throw input_error("sampling: logit_bias id " + std::to_string(id) + ", expected >= 0");
      if (!std::isfinite(bias))
        throw input_error("sampling: logit_bias[" + std::to_string(id) + "] = " + std::to_string(bias) +
                          ", expected a finite value");
    }
  }
  // validate(), and every logit_bias id inside a vocabulary of `vocab` ids.
  void validate(int64_t vocab) const {
    validate();
    for (auto& [id, bias] : logit_bias)
      if (id >= vocab)
        throw input_error("sampling: logit_bias id " + std::to_string(id) + " is outside the vocabulary [0, " +
                          std::to_string(vocab) + ")");
  }
  bool greedy() const noexcept { return !do_sample || temperature <= 0.0f; }
  // Whether anything changes the logits before temperature (repetition, presence, frequency penalty, logit_bias).
  bool processes_logits() const noexcept {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f || !logit_bias.empty();
  }
};

// One sequence's sampler: its options and its random stream.
class Sampler {
 public:
  Sampler() = default;
  // `prompt_length`: how many ids of every history (below) are the prompt's; the ids after them are the generated
  // ones, which the presence and frequency penalties count.
  explicit Sampler(const SamplingOptions& o, size_t prompt_length = 0)
      : o_(o), rng_(o.seed), prompt_length_(prompt_length) {
    o.validate();
  }
  const SamplingOptions& options() const noexcept { return o_; }

  // Chooses the next token. `history` is every id so far (prompt + generated), for the penalties.
  // `scratch` avoids allocation in steady state. logits are not modified.
  int32_t sample(const float* logits, int64_t n, const std::vector<int32_t>& history) {
    if (o_.greedy() && !o_.processes_logits()) return argmax(logits, n);
    warp(logits, n, history);
    if (o_.greedy()) return argmax(buf_.data(), n);
    softmax_into(probs_);
    return draw(probs_, uniform());
  }

  // The distribution sample() draws from (probabilities of the n ids; greedy: all on the one it picks). The
  // sampler's own buffer, valid until its next call.
  const std::vector<double>& distribution(const float* logits, int64_t n, const std::vector<int32_t>& history) {
    if (o_.greedy()) {
      const int32_t id = sample(logits, n, history);
      probs_.assign(size_t(n), 0.0);
      probs_[size_t(id)] = 1.0;
      return probs_;
    }
    warp(logits, n, history);
    softmax_into(probs_);
    return probs_;
  }

  // The next number of the sequence's random stream, uniform in [0, 1) (sample() takes one per sampled token).
  double uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }

  // The id that a uniform number r in [0, 1) picks from probabilities p (inverse CDF in id order).
  static int32_t draw(const std::vector<double>& p, double r) noexcept {
    double cum = 0;
    int32_t last_nonzero = 0;
    for (size_t i = 0; i < p.size(); ++i) {
      if (p[i] <= 0) continue;
      last_nonzero = int32_t(i);
      cum += p[i];
      if (r < cum) return int32_t(i);
    }
    return last_nonzero;  // rounding left r just above the total
  }

 private:
  // buf_ = the logits after logit_bias, the penalties and (when sampling) temperature, top-k and top-p.
  void warp(const float* logits, int64_t n, const std::vector<int32_t>& history) {
    const bool penalize = o_.repetition_penalty != 1.0f;
    buf_.assign(logits, logits + n);
    for (auto& [id, bias] : o_.logit_bias)
      if (id >= 0 && id < n) buf_[size_t(id)] += bias;
    if (penalize) {
      // RepetitionPenaltyLogitsProcessor: score < 0 ? score * p : score / p, once per distinct id
      if (seen_.size() < size_t(n)) seen_.assign(size_t(n), 0);
      for (int32_t id : history) {
        if (id < 0 || id >= n) continue;
        float& s = buf_[size_t(id)];
        if (seen_[size_t(id)]) continue;
        seen_[size_t(id)] = 1;
        s = s < 0 ? s * o_.repetition_penalty : s / o_.repetition_penalty;
      }
      for (int32_t id : history)
        if (id >= 0 && id < n) seen_[size_t(id)] = 0;
    }
    if (o_.presence_penalty != 0.0f || o_.frequency_penalty != 0.0f) {
      // OpenAI: logit -= presence * (count > 0) + frequency * count, over the generated ids
      if (counts_.size() < size_t(n)) counts_.assign(size_t(n), 0);
      const size_t from = std::min(prompt_length_, history.size());
      for (size_t i = from; i < history.size(); ++i)
        if (history[i] >= 0 && history[i] < n) ++counts_[size_t(history[i])];
      for (size_t i = from; i < history.size(); ++i) {
        const int32_t id = history[i];
        if (id < 0 || id >= n || counts_[size_t(id)] == 0) continue;  // done already
        buf_[size_t(id)] -= o_.presence_penalty + o_.frequency_penalty * float(counts_[size_t(id)]);
        counts_[size_t(id)] = 0;
      }
    }
    if (o_.greedy()) return;
    const float neg_inf = -std::numeric_limits<float>::infinity();
    // TemperatureLogitsWarper
    if (o_.temperature != 1.0f)
      for (float& s : buf_) s = s / o_.temperature;
    // TopKLogitsWarper: remove scores below the k-th largest (ties with it stay)
    if (o_.top_k > 0 && o_.top_k < n) {
      idx_.resize(size_t(n));
      std::iota(idx_.begin(), idx_.end(), 0);
      std::nth_element(idx_.begin(), idx_.begin() + (o_.top_k - 1), idx_.end(),
                       [&](int32_t a, int32_t b) { return buf_[size_t(a)] > buf_[size_t(b)]; });
      const float kth = buf_[size_t(idx_[size_t(o_.top_k - 1)])];
      for (float& s : buf_)
        if (s < kth) s = neg_inf;
    }
    // TopPLogitsWarper: sort ascending, drop the tokens whose cumulative probability is <= 1 - top_p (keep >= 1)
    if (o_.top_p < 1.0f) {
      idx_.resize(size_t(n));
      std::iota(idx_.begin(), idx_.end(), 0);
      // ascending by value, ties in id order (what a stable sort gives) and NaN last, as torch.sort puts it;
      // std::sort on that total order allocates nothing (std::stable_sort takes a buffer every call)
      std::sort(idx_.begin(), idx_.end(), [&](int32_t a, int32_t b) {
        const float x = buf_[size_t(a)], y = buf_[size_t(b)];
        const bool nx = std::isnan(x), ny = std::isnan(y);
        if (nx || ny) return nx == ny ? a < b : ny;
        return x < y || (x == y && a < b);
      });
      softmax_into(probs_);
      double cum = 0;
      for (size_t i = 0; i + 1 < idx_.size(); ++i) {  // the last (largest) always stays
        cum += probs_[size_t(idx_[i])];
        if (cum <= 1.0 - double(o_.top_p)) buf_[size_t(idx_[i])] = neg_inf;
        else break;
      }
    }
  }

  void softmax_into(std::vector<double>& p) const {
    p.resize(buf_.size());
    float mx = -std::numeric_limits<float>::infinity();
    for (float s : buf_) mx = std::max(mx, s);
    double sum = 0;
    for (size_t i = 0; i < buf_.size(); ++i) {
      p[i] = std::isinf(buf_[i]) && buf_[i] < 0 ? 0.0 : std::exp(double(buf_[i]) - double(mx));
      sum += p[i];
    }
    for (double& x : p) x /= sum;
  }

  SamplingOptions o_;
  std::mt19937_64 rng_{0};
  std::vector<float> buf_;
  std::vector<double> probs_;
  std::vector<int32_t> idx_;
  std::vector<uint8_t> seen_;
  size_t prompt_length_ = 0;
  std::vector<uint32_t> counts_;  // the presence and frequency penalties' counts (zero between calls)
};

OPT_NAMESPACE_END
