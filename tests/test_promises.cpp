// README promises that no other test pins: sampling in transformers' order (repetition penalty -> temperature ->
// top-k -> top-p) on one set of logits; NaN logits under greedy decoding; ids the tokenizer lacks left out of the
// text but kept in the ids; the LM head of an int8 model kept as stored; safetensors preferred over
// pytorch_model.bin when a folder has both.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <opt/generate.hpp>
#include <opt/safetensors.hpp>
#include <opt/sampler.hpp>
#include <opt/tokenizer.hpp>
#include <set>

#include "shared.hpp"

namespace {

namespace fs = std::filesystem;

// Draws `n` tokens from one sampler (its random stream advancing) and counts them.
std::map<int32_t, int> draws(const opt::SamplingOptions& o, const std::vector<float>& logits,
                             const std::vector<int32_t>& history, int n) {
  opt::Sampler s(o);
  std::map<int32_t, int> count;
  for (int i = 0; i < n; ++i) ++count[s.sample(logits.data(), int64_t(logits.size()), history)];
  return count;
}
std::set<int32_t> keys(const std::map<int32_t, int>& m) {
  std::set<int32_t> k;
  for (auto& [id, n] : m) k.insert(id);
  return k;
}

}  // namespace

TEST_CASE("sampling: repetition penalty, then temperature, then top-k, then top-p (transformers' order)") {
  // logits [4, 3, 2.9, 2.8, 1, .5, -1, -2], id 0 already in the sequence, penalty 2, temperature .25, top_k 3,
  // top_p .75. In transformers' order:
  //   penalty:     id 0 -> 4 / 2 = 2                       [2, 3, 2.9, 2.8, 1, .5, -1, -2]
  //   temperature: / .25                                   [8, 12, 11.6, 11.2, 4, 2, -4, -8]
  //   top-k 3:     keeps ids 1, 2, 3                       (top-k before the penalty would keep 0, 1, 2)
  //   top-p .75:   probabilities .472 / .316 / .212: the smallest (id 3, .212 <= .25) goes
  //                                                        (top-p before the temperature: .367 / .332 / .301, none goes)
  // so only ids 1 and 2 are ever drawn, with probabilities 1 : e^-0.4 = .599 : .401.
  const std::vector<float> logits = {4.0f, 3.0f, 2.9f, 2.8f, 1.0f, 0.5f, -1.0f, -2.0f};
  opt::SamplingOptions o;
  o.do_sample = true;
  o.repetition_penalty = 2.0f;
  o.temperature = 0.25f;
  o.top_k = 3;
  o.top_p = 0.75f;
  o.seed = 11;
  const int n = 4000;
  const auto c = draws(o, logits, {0}, n);
  CHECK(keys(c) == std::set<int32_t>{1, 2});
  const double p1 = double(c.count(1) ? c.at(1) : 0) / n;
  CHECK(std::fabs(p1 - 1.0 / (1.0 + std::exp(-0.4))) < 0.04);

  // top-k before top-p: probabilities .4 / .3 / .2 / .1, top_k 2 renormalizes to .571 / .429, and top_p .5 then
  // drops .429: only id 0 (top-p first would keep ids 0 and 1: .1 + .2 <= .5, .1 + .2 + .3 > .5).
  const std::vector<float> l2 = {std::log(0.4f), std::log(0.3f), std::log(0.2f), std::log(0.1f)};
  opt::SamplingOptions o2;
  o2.do_sample = true;
  o2.top_k = 2;
  o2.top_p = 0.5f;
  o2.seed = 3;
  CHECK(keys(draws(o2, l2, {}, 2000)) == std::set<int32_t>{0});

  // each warper alone on the same logits: without the penalty, top-k 3 keeps ids 0, 1, 2
  opt::SamplingOptions o3 = o;
  o3.repetition_penalty = 1.0f;
  o3.top_p = 1.0f;
  o3.temperature = 1.0f;
  CHECK(keys(draws(o3, logits, {0}, 4000)) == std::set<int32_t>{0, 1, 2});
  // the same seed, the same draws
  CHECK(draws(o, logits, {0}, 500) == draws(o, logits, {0}, 500));
}

TEST_CASE("NaN logits: greedy decoding returns an id in range, NaN counting as the largest (torch.argmax)") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  CHECK(opt::argmax(std::vector<float>{1, nan, 3, nan}.data(), 4) == 1);
  CHECK(opt::argmax(std::vector<float>{nan, 5, 3}.data(), 3) == 0);
  CHECK(opt::argmax(std::vector<float>{1, inf, nan}.data(), 3) == 2);
  CHECK(opt::argmax(std::vector<float>{-inf, -inf}.data(), 2) == 0);
  const std::vector<float> all_nan(7, nan);
  CHECK(opt::argmax(all_nan.data(), 7) == 0);
  // through a sampler: greedy, and greedy with a repetition penalty (transformers applies it under greedy too)
  opt::SamplingOptions g;
  opt::Sampler s(g);
  CHECK(s.sample(std::vector<float>{0, 2, nan, 1}.data(), 4, {}) == 2);
  opt::SamplingOptions gp;
  gp.repetition_penalty = 1.5f;
  opt::Sampler sp(gp);
  const int32_t id = sp.sample(std::vector<float>{0, nan, nan, 1}.data(), 4, {1});
  CHECK(id == 1);
  CHECK(sp.sample(all_nan.data(), 7, {0, 1, 2}) == 0);
}

TEST_CASE("ids the tokenizer lacks: left out of the text, kept in the ids") {
  const opt::Tokenizer tok = opt::Tokenizer::from_dir(opt_test::shared_dir() / "tokenizer");
  REQUIRE(tok.vocab_size() == 50265);
  // Tokenizer::decode throws, naming the id
  CHECK_THROWS_AS(tok.decode({31414, 50265}), opt::tokenizer_error);
  // TextStream (what generate and opt-serve stream with) skips them
  opt::DecodeOptions d;
  d.skip_special_tokens = true;
  opt::TextStream ts(tok, {}, d);
  std::string text;
  for (int32_t id : {31414, 50265, 6, 50271, 127, 2335}) text += ts.push(id);
  text += ts.finish();
  CHECK(text == tok.decode({31414, 6, 127, 2335}, d));
  // generate on the real-vocabulary model: a row forced (on_token) through the Batch keeps the id in its tokens
  opt::Model m = opt::Model::load(opt_test::fixture_dir("opt-tiny-realvocab"));
  opt::Batch batch(m, 1);
  opt::SequenceOptions so;
  so.max_new_tokens = 3;
  const opt::SeqId a = batch.add({2, 31414}, so);
  (void)batch.compute();
  batch.accept(a, 50270);
  while (!batch.empty()) batch.step();
  const std::vector<int32_t>& ids = batch.tokens(a);
  REQUIRE(ids.size() == 5);
  CHECK(ids[2] == 50270);
  opt::TextStream ts2(tok, {}, d);
  std::string t2;
  for (size_t i = 2; i < ids.size(); ++i) t2 += ts2.push(ids[i]);
  t2 += ts2.finish();
  std::vector<int32_t> known;
  for (size_t i = 2; i < ids.size(); ++i)
    if (ids[i] < 50265) known.push_back(ids[i]);
  CHECK(t2 == tok.decode(known, d));
}

TEST_CASE("int8 weights: the LM head stays as stored unless lm_head_int8") {
  const std::map<std::string, opt::dtype> stored = {
      {"opt-tiny-preln", opt::dtype::F32}, {"opt-tiny-preln-fp16", opt::dtype::F16}, {"opt-tiny-preln-bf16", opt::dtype::BF16}};
  for (const auto& [name, type] : stored) {
    CAPTURE(name);
    opt::LoadOptions lo;
    lo.quantize = opt::quantization::int8;
    const opt::Model q = opt::Model::load(opt_test::fixture_dir(name), lo);
    CHECK(q.weights().lm_head().type == type);
    CHECK(q.weights().embed_tokens.type == type);
    lo.lm_head_int8 = true;
    const opt::Model q8 = opt::Model::load(opt_test::fixture_dir(name), lo);
    CHECK(q8.weights().lm_head().type == opt::dtype::I8);
    // the layers are int8 in both
    CHECK(q.weights().layers.at(0).fc1.packed.type == opt::dtype::I8);
    CHECK(q8.weights().layers.at(0).fc1.packed.type == opt::dtype::I8);
  }
}

TEST_CASE("a folder with model.safetensors and pytorch_model.bin loads the safetensors") {
  // the hub-style fixture's pickle, and a safetensors of the same tensors with one bias changed: the logits tell
  // which file was read
  const fs::path hub = opt_test::fixture_dir("opt-tiny-preln-hubstyle");
  const fs::path both = opt_test::scratch("promises/both"), st_only = opt_test::scratch("promises/st"),
                 bin_only = opt_test::scratch("promises/bin");
  for (const fs::path& d : {both, st_only, bin_only}) fs::copy_file(hub / "config.json", d / "config.json");
  fs::copy_file(hub / "pytorch_model.bin", both / "pytorch_model.bin");
  fs::copy_file(hub / "pytorch_model.bin", bin_only / "pytorch_model.bin");
  {
    const opt::SafetensorsFile f = opt::SafetensorsFile::open(hub / "model.safetensors");
    std::vector<std::vector<std::byte>> copies;
    std::vector<opt::TensorData> t;
    bool changed = false;
    for (const opt::TensorView& v : f.tensors()) {
      copies.emplace_back(v.data, v.data + v.nbytes);
      if (v.name == "decoder.final_layer_norm.bias") {
        REQUIRE(v.type == opt::dtype::F16);
        for (size_t i = 0; i < v.nbytes; i += 2) copies.back()[i + 1] ^= std::byte{0x80};  // flip the sign
        changed = true;
      }
      t.push_back({v.name, v.type, v.shape, copies.back().data()});
    }
    REQUIRE(changed);
    const std::string bytes = opt::safetensors_bytes(t);
    for (const fs::path& d : {both, st_only}) {
      std::ofstream o(d / "model.safetensors", std::ios::binary);
      o.write(bytes.data(), std::streamsize(bytes.size()));
      REQUIRE(o.good());
    }
  }
  auto last_logits = [](const fs::path& dir) {
    const opt::Model m = opt::Model::load(dir);
    opt::Workspace ws(1);
    opt::KvCache kv(m.config());
    const std::vector<int32_t> ids = {2, 5, 6, 7};
    const opt::LogitsView l = m.forward({{&kv, ids.data(), 4}}, ws);
    return std::vector<float>(l.row(0), l.row(0) + l.cols);
  };
  const std::vector<float> from_both = last_logits(both), from_st = last_logits(st_only), from_bin = last_logits(bin_only);
  CHECK(from_st != from_bin);  // the two files really differ
  CHECK(from_both == from_st);
}
