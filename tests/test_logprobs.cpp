// Log-probabilities (opt/logprobs.hpp) against the fixtures' goldens: log_softmax of Hugging Face's per-step scores
// and full-prompt logits must match ours within 1e-4; and OpenAI's sampling options in the sampler (logit_bias,
// presence_penalty, frequency_penalty), in greedy decoding too.
#include <cmath>
#include <set>
#include <opt/batch.hpp>
#include <opt/generate.hpp>
#include <opt/logprobs.hpp>

#include "shared.hpp"

namespace {

using json = nlohmann::json;

// The reference: log_softmax in long double, written out plainly.
std::vector<double> ref_log_softmax(const float* x, size_t n) {
  long double mx = x[0];
  for (size_t i = 1; i < n; ++i) mx = std::max<long double>(mx, x[i]);
  long double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += std::exp(static_cast<long double>(x[i]) - mx);
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = double(static_cast<long double>(x[i]) - mx - std::log(sum));
  return out;
}

// `got` (token and top entries) agrees with the reference log-probabilities `want` within 1e-4, and its top entries
// are the most likely ones (none left out is likelier by more than 1e-4).
void check_against(const opt::PositionLogprobs& got, const std::vector<double>& want, size_t top_n) {
  CHECK(std::abs(got.logprob - want[size_t(got.token)]) <= 1e-4);
  REQUIRE(got.top.size() == std::min(top_n, want.size()));
  std::vector<double> sorted = want;
  std::sort(sorted.begin(), sorted.end(), std::greater<double>());
  for (size_t r = 0; r < got.top.size(); ++r) {
    CHECK(std::abs(got.top[r].logprob - want[size_t(got.top[r].token)]) <= 1e-4);
    CHECK(std::abs(got.top[r].logprob - sorted[r]) <= 1e-4);  // the r-th likeliest, up to near-ties
    if (r > 0) CHECK(got.top[r].logprob <= got.top[r - 1].logprob);
  }
}

}  // namespace

TEST_CASE("logprobs of every greedy step match log_softmax of the golden scores within 1e-4") {
  for (const char* name : {"opt-tiny-preln", "opt-tiny-odd", "opt-tiny-postln-proj", "opt-tiny-nofinalln-silu"}) {
    INFO(name);
    const auto dir = opt_test::fixture_dir(name);
    const json g = opt_test::read_json(dir / "goldens.json");
    opt::Model m = opt::Model::load(dir);
    const int64_t V = m.config().vocab_size;
    size_t checked = 0;
    for (const json& cs : g["cases"]) {
      if (cs["padding"] != "none") continue;  // the same rows as alone: the unpadded cases cover it
      INFO(cs["name"].get<std::string>());
      const json& gen = cs["generate"];
      const std::vector<float> scores = opt_test::read_f32(dir, gen["scores"]);  // [steps, B, V]
      const auto prompts = cs["prompts"].get<std::vector<std::vector<int32_t>>>();
      const size_t B = prompts.size();
      const auto new_tokens = gen["new_tokens"].get<std::vector<std::vector<int32_t>>>();
      opt::Batch batch(m, 1);
      std::vector<opt::SeqId> ids;
      for (auto& p : prompts) {
        opt::SequenceOptions so;
        so.max_new_tokens = gen["max_new_tokens"].get<int64_t>();
        ids.push_back(batch.add(p, so));
      }
      for (size_t step = 0; !batch.empty(); ++step) {
        for (const opt::StepToken& t : batch.step()) {
          const size_t b = size_t(std::find(ids.begin(), ids.end(), t.seq) - ids.begin());
          REQUIRE(b < B);
          CHECK(t.token == new_tokens[b][step]);
          const auto got = opt::logprobs(t.logits, V, t.token, 5);
          check_against(got, ref_log_softmax(scores.data() + (step * B + b) * size_t(V), size_t(V)), 5);
          ++checked;
        }
      }
    }
    CHECK(checked >= 8);
  }
}

TEST_CASE("prompt logprobs (echo) match log_softmax of the golden prompt logits within 1e-4") {
  for (const char* name : {"opt-tiny-realvocab", "opt-tiny-preln", "opt-tiny-odd", "opt-tiny-gelu-nobias"}) {
    INFO(name);
    const auto dir = opt_test::fixture_dir(name);
    const json g = opt_test::read_json(dir / "goldens.json");
    opt::Model m = opt::Model::load(dir);
    opt::Workspace ws(1);
    const size_t V = size_t(m.config().vocab_size);
    size_t checked = 0;
    for (const json& cs : g["cases"]) {
      if (cs["padding"] != "none" || !cs.contains("logits")) continue;
      INFO(cs["name"].get<std::string>());
      const std::vector<float> logits = opt_test::read_f32(dir, cs["logits"]);  // [B, T, V]
      const auto prompts = cs["prompts"].get<std::vector<std::vector<int32_t>>>();
      const size_t T = cs["logits"]["shape"][1].get<size_t>();
      for (size_t b = 0; b < prompts.size(); ++b) {
        const auto got = opt::prompt_logprobs(m, prompts[b], 3, ws);
        REQUIRE(got.size() == prompts[b].size() - 1);
        for (size_t i = 0; i < got.size(); ++i) {
          CHECK(got[i].token == prompts[b][i + 1]);
          check_against(got[i], ref_log_softmax(logits.data() + (b * T + i) * V, V), 3);
          ++checked;
        }
      }
    }
    CHECK(checked >= 5);
  }
}

TEST_CASE("prompt logprobs are bit for bit the step logprobs a batch gives the same positions") {
  opt::Model m = opt::Model::load(opt_test::fixture_dir("opt-tiny-odd"));
  const int64_t V = m.config().vocab_size;
  const std::vector<int32_t> prompt = {2, 45, 17, 230, 99};
  opt::Batch batch(m, 1);
  opt::SequenceOptions so;
  so.max_new_tokens = 6;
  so.stop_at_eos = false;
  const opt::SeqId id = batch.add(prompt, so);
  std::vector<opt::PositionLogprobs> steps;
  while (!batch.empty())
    for (const opt::StepToken& t : batch.step()) steps.push_back(opt::logprobs(t.logits, V, t.token, 4));
  const std::vector<int32_t> all = batch.tokens(id);
  opt::Workspace ws(2);
  const auto echo = opt::prompt_logprobs(m, all, 4, ws);
  REQUIRE(echo.size() == all.size() - 1);
  REQUIRE(steps.size() == 6);
  for (size_t k = 0; k < steps.size(); ++k) {
    const opt::PositionLogprobs& e = echo[prompt.size() - 1 + k];
    CHECK(e.token == steps[k].token);
    CHECK(e.logprob == steps[k].logprob);
    REQUIRE(e.top.size() == steps[k].top.size());
    for (size_t r = 0; r < e.top.size(); ++r) {
      CHECK(e.top[r].token == steps[k].top[r].token);
      CHECK(e.top[r].logprob == steps[k].top[r].logprob);
    }
  }
  CHECK(opt::prompt_logprobs(m, {2}, 4, ws).empty());  // one token: nothing before it
  opt_test::check_throws<opt::input_error>([&] { opt::prompt_logprobs(m, {2, int32_t(V)}, 1, ws); },
                                           {"prompt token 1", "outside the vocabulary"});
  opt_test::check_throws<opt::input_error>([&] { opt::prompt_logprobs(m, {}, 1, ws); }, {"empty prompt"});
}

TEST_CASE("log_softmax is stable; logprobs order ties by id and check their arguments") {
  const std::vector<float> big = {1000.0f, 1000.0f, -1000.0f, 999.0f};
  std::vector<double> out(4);
  opt::log_softmax(big.data(), 4, out.data());
  const double z = std::log(2.0 + std::exp(-1.0));
  CHECK(out[0] == doctest::Approx(-z).epsilon(1e-7));
  CHECK(out[1] == out[0]);
  CHECK(out[3] == doctest::Approx(-1.0 - z).epsilon(1e-7));
  CHECK(std::isfinite(out[2]));
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const std::vector<float> masked = {neg_inf, 0.0f, neg_inf, 0.0f};
  const auto lp = opt::logprobs(masked.data(), 4, 3, 4);
  CHECK(lp.logprob == doctest::Approx(std::log(0.5)));
  REQUIRE(lp.top.size() == 4);
  CHECK(lp.top[0].token == 1);  // a tie: the lower id first
  CHECK(lp.top[1].token == 3);
  CHECK(lp.top[2].token == 0);
  CHECK(std::isinf(lp.top[3].logprob));
  CHECK(opt::logprobs(masked.data(), 4, 1, 0).top.empty());
  CHECK(opt::logprobs(masked.data(), 4, 1, 99).top.size() == 4);
  opt_test::check_throws<opt::input_error>([&] { opt::logprobs(masked.data(), 4, 4, 1); }, {"token 4", "[0, 4)"});
  opt_test::check_throws<opt::input_error>([&] { opt::logprobs(masked.data(), 4, 0, -1); }, {"top_n = -1"});
}

TEST_CASE("sampler: logit_bias, presence and frequency penalties as OpenAI defines them") {
  const std::vector<float> logits = {1.0f, 0.9f, 0.8f, 0.0f};
  const std::vector<int32_t> prompt = {0, 0, 1};
  // no option: plain argmax
  CHECK(opt::Sampler(opt::SamplingOptions{}, prompt.size()).sample(logits.data(), 4, prompt) == 0);
  // presence: the generated ids only; the prompt's 0 and 1 are not penalized
  opt::SamplingOptions o;
  o.presence_penalty = 0.25f;
  CHECK(opt::Sampler(o, prompt.size()).sample(logits.data(), 4, prompt) == 0);
  std::vector<int32_t> h = prompt;
  h.push_back(0);  // generated once: 1.0 - 0.25 = 0.75 < 0.9
  CHECK(opt::Sampler(o, prompt.size()).sample(logits.data(), 4, h) == 1);
  h.push_back(1);  // 1 too: 0.9 - 0.25 = 0.65; 2 (0.8) is now the largest
  CHECK(opt::Sampler(o, prompt.size()).sample(logits.data(), 4, h) == 2);
  // frequency: count times the penalty. 0 generated twice: 1.0 - 2 * 0.06 = 0.88 < 0.9; once: 0.94 > 0.9
  opt::SamplingOptions f;
  f.frequency_penalty = 0.06f;
  CHECK(opt::Sampler(f, prompt.size()).sample(logits.data(), 4, {0, 0, 1, 0}) == 0);
  CHECK(opt::Sampler(f, prompt.size()).sample(logits.data(), 4, {0, 0, 1, 0, 0}) == 1);
  // a negative penalty encourages: 3 generated once, -1.5: 0.0 + 1.5 beats 1.0
  f.frequency_penalty = -1.5f;
  CHECK(opt::Sampler(f, prompt.size()).sample(logits.data(), 4, {0, 0, 1, 3}) == 3);
  // the exact values, through the sampling distribution (temperature 1, nothing else)
  opt::SamplingOptions both;
  both.do_sample = true;
  both.presence_penalty = 0.5f;
  both.frequency_penalty = 0.25f;
  both.logit_bias = {{3, 2.0f}, {1, -1.0f}, {3, 0.5f}};
  opt::Sampler sb(both, 1);
  const std::vector<double>& p = sb.distribution(logits.data(), 4, {2, 0, 0, 2});  // generated: 0, 0, 2
  const double want[4] = {1.0 - 0.5 - 0.5, 0.9 - 1.0, 0.8 - 0.5 - 0.25, 0.0 + 2.5};
  double z = 0;
  for (double w : want) z += std::exp(w);
  for (int i = 0; i < 4; ++i) CHECK(p[size_t(i)] == doctest::Approx(std::exp(want[i]) / z).epsilon(1e-6));
  // logit_bias in greedy decoding
  opt::SamplingOptions b;
  b.logit_bias = {{3, 1.5f}};
  CHECK(opt::Sampler(b).sample(logits.data(), 4, {}) == 3);
  b.logit_bias = {{0, -100.0f}};
  CHECK(opt::Sampler(b).sample(logits.data(), 4, {}) == 1);
  // invalid settings
  opt::SamplingOptions bad;
  bad.presence_penalty = std::nanf("");
  opt_test::check_throws<opt::input_error>([&] { opt::Sampler{bad}; }, {"presence_penalty"});
  bad = {};
  bad.frequency_penalty = std::numeric_limits<float>::infinity();
  opt_test::check_throws<opt::input_error>([&] { opt::Sampler{bad}; }, {"frequency_penalty"});
  bad = {};
  bad.logit_bias = {{-1, 1.0f}};
  opt_test::check_throws<opt::input_error>([&] { opt::Sampler{bad}; }, {"logit_bias id -1"});
  bad.logit_bias = {{7, 1.0f}};
  opt_test::check_throws<opt::input_error>([&] { bad.validate(4); }, {"logit_bias id 7", "[0, 4)"});
}

TEST_CASE("Batch: presence penalty and logit_bias in greedy decoding, logprobs still the raw model's") {
  const auto dir = opt_test::fixture_dir("opt-tiny-preln");
  const json g = opt_test::read_json(dir / "goldens.json");
  const json& cs = g["cases"][0];  // single: greedy gives 75, 75, 486, ...
  REQUIRE(cs["name"] == "single");
  const auto prompt = cs["prompts"][0].get<std::vector<int32_t>>();
  const auto want = cs["generate"]["new_tokens"][0].get<std::vector<int32_t>>();
  REQUIRE(want[0] == want[1]);
  const std::vector<float> scores = opt_test::read_f32(dir, cs["generate"]["scores"]);
  opt::Model m = opt::Model::load(dir);
  const int64_t V = m.config().vocab_size;
  auto run = [&](const opt::SamplingOptions& s, std::vector<opt::PositionLogprobs>* lps = nullptr) {
    opt::Batch batch(m, 1);
    opt::SequenceOptions so;
    so.max_new_tokens = 8;
    so.sampling = s;
    const opt::SeqId id = batch.add(prompt, so);
    while (!batch.empty())
      for (const opt::StepToken& t : batch.step())
        if (lps) lps->push_back(opt::logprobs(t.logits, V, t.token, 2));
    return batch.new_tokens(id);
  };
  CHECK(run({}) == want);  // no option: the goldens
  opt::SamplingOptions pres;
  pres.presence_penalty = 100.0f;  // no generated id twice
  const auto distinct = run(pres);
  CHECK(distinct[0] == want[0]);
  CHECK(distinct[1] != want[0]);
  CHECK(std::set<int32_t>(distinct.begin(), distinct.end()).size() == distinct.size());
  // the prompt's ids are not penalized: a prompt id biased up is chosen again and again with a presence penalty 0
  opt::SamplingOptions bias;
  bias.logit_bias = {{prompt[2], 100.0f}};
  std::vector<opt::PositionLogprobs> lps;
  const auto forced = run(bias, &lps);
  CHECK(forced == std::vector<int32_t>(8, prompt[2]));
  // the logprobs are of the raw model: the first step's are the golden scores', whatever the bias did
  REQUIRE(lps.size() == 8);
  const auto ref = ref_log_softmax(scores.data(), size_t(V));
  CHECK(std::abs(lps[0].logprob - ref[size_t(prompt[2])]) <= 1e-4);
  CHECK(lps[0].top[0].token == want[0]);
  CHECK(lps[0].logprob < lps[0].top[1].logprob);  // the forced token is not among the model's two likeliest
  opt::SamplingOptions out_of_vocab;
  out_of_vocab.logit_bias = {{int32_t(V), 1.0f}};
  opt::Batch batch(m, 1);
  opt::SequenceOptions so;
  so.sampling = out_of_vocab;
  opt_test::check_throws<opt::input_error>([&] { batch.add(prompt, so); }, {"logit_bias id 512"});
}
