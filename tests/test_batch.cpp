// The step API (opt::Batch) and sampling: sequences joining and leaving a running batch get exactly what they get
// alone (the fixtures' generate.alone), finished sequences free their cache, and sampling is reproducible.
#include <algorithm>
#include <opt/generate.hpp>

#include "shared.hpp"

namespace {

using json = nlohmann::json;

struct AloneCase {
  std::vector<int32_t> prompt;
  std::vector<int32_t> want;  // new tokens up to and including the first EOS
  int64_t max_new_tokens;
};

std::vector<AloneCase> alone_cases(const std::string& model) {
  json g = opt_test::read_json(opt_test::fixture_dir(model) / "goldens.json");
  std::vector<AloneCase> out;
  for (auto& cs : g["cases"]) {
    auto rows = opt::unpad(cs["input_ids"].get<std::vector<std::vector<int32_t>>>(),
                           cs["attention_mask"].get<std::vector<std::vector<int32_t>>>());
    const json& gen = cs["generate"];
    for (size_t b = 0; b < rows.size(); ++b) {
      std::vector<int32_t> want =
          gen.contains("alone") ? gen["alone"][b]["new_tokens"].get<std::vector<int32_t>>() : gen["new_tokens"][b].get<std::vector<int32_t>>();
      out.push_back({rows[b], want, gen["max_new_tokens"].get<int64_t>()});
    }
  }
  return out;
}

}  // namespace

TEST_CASE("continuous batching: sequences joining between steps get what they get alone") {
  for (const char* model_name : {"opt-tiny-odd", "opt-tiny-preln", "opt-tiny-postln-proj", "opt-tiny-gelu-nobias",
                                 "opt-tiny-nofinalln-silu"}) {
    INFO(model_name);
    opt::Model m = opt::Model::load(opt_test::fixture_dir(model_name));
    auto cases = alone_cases(model_name);
    REQUIRE(cases.size() >= 8);
    opt::Batch batch(m, 2);
    const opt::Config& cfg = m.config();
    // a sequence holds a cache of prompt + max_new_tokens positions, keys and values of every layer, in float
    auto bytes_of = [&](const AloneCase& c) {
      return 2 * size_t(cfg.num_hidden_layers) * (c.prompt.size() + size_t(c.max_new_tokens)) *
             size_t(cfg.hidden_size) * sizeof(float);
    };
    CHECK(opt::KvCache(cfg, 20).bytes() == 2 * size_t(cfg.num_hidden_layers) * 20 * size_t(cfg.hidden_size) * 4);
    std::map<opt::SeqId, size_t> which, running;  // running: added, not yet seen finishing
    std::vector<int> finished(cases.size(), 0);
    std::vector<opt::SeqId> done;
    size_t next = 0, steps = 0;
    while (next < cases.size() || !batch.empty()) {
      // a new sequence joins every other step, two at a time every fifth
      for (int k = 0; k < (steps % 5 == 0 ? 2 : 1) && next < cases.size() && steps % 2 == 0; ++k, ++next) {
        opt::SequenceOptions so;
        so.max_new_tokens = cases[next].max_new_tokens;
        const size_t before = batch.cache_bytes();
        const opt::SeqId id = batch.add(cases[next].prompt, so);
        CHECK(batch.cache_bytes() == before + bytes_of(cases[next]));  // the new sequence's cache, exactly
        which[id] = next;
        running[id] = next;
      }
      for (const opt::StepToken& t : batch.step()) {
        if (!t.finished) continue;
        REQUIRE(which.count(t.seq) == 1);
        const AloneCase& c = cases[which[t.seq]];
        CHECK(batch.new_tokens(t.seq) == c.want);
        ++finished[which[t.seq]];
        running.erase(t.seq);
        done.push_back(t.seq);
      }
      // what the batch holds: the caches of the sequences still running, and nothing of the ones that just
      // finished (freed when they finish, before release)
      size_t want_bytes = 0;
      for (auto& [id, i] : running) want_bytes += bytes_of(cases[i]);
      CHECK(batch.cache_bytes() == want_bytes);
      for (opt::SeqId id : done) batch.release(id);
      done.clear();
      ++steps;
    }
    CHECK(next == cases.size());
    CHECK(running.empty());
    CHECK(std::count(finished.begin(), finished.end(), 1) == long(cases.size()));  // every case finished, once
    CHECK(batch.cache_bytes() == 0);
  }
}

TEST_CASE("the host runs the loop: compute, choose its own token, accept, stop") {
  opt::Model m = opt::Model::load(opt_test::fixture_dir("opt-tiny-preln"));
  opt::Batch batch(m, 1);
  opt::SequenceOptions so;
  so.max_new_tokens = 5;
  opt::SeqId a = batch.add({2, 206, 317, 15}, so);
  opt::SeqId b = batch.add({2, 5}, so);
  auto logits = batch.compute();
  REQUIRE(logits.size() == 2);
  CHECK(logits[0].size == 512);
  // forced tokens instead of the model's choice
  CHECK_FALSE(batch.accept(a, 7).finished);
  CHECK_FALSE(batch.accept(b, 8).finished);
  CHECK(batch.tokens(a) == std::vector<int32_t>{2, 206, 317, 15, 7});
  CHECK_FALSE(batch.accept(a, 9).finished);  // several tokens may wait: the next pass takes them all
  CHECK(batch.tokens(a) == std::vector<int32_t>{2, 206, 317, 15, 7, 9});
  size_t before = batch.cache_bytes();
  batch.stop(b);
  CHECK(batch.finished(b));
  CHECK(batch.finish_reason(b) == opt::FinishReason::stopped);
  CHECK(batch.cache_bytes() < before);
  CHECK_THROWS_AS(batch.accept(b, 1), opt::input_error);
  while (!batch.empty()) batch.step();
  CHECK(batch.new_tokens(a).size() == 5);
  CHECK(batch.new_tokens(a)[0] == 7);
  CHECK(batch.finish_reason(a) == opt::FinishReason::length);
  CHECK_THROWS_WITH_AS(batch.tokens(99), "[opt.input] Batch::tokens: no sequence 99", opt::input_error);
  so.max_new_tokens = 61;
  CHECK_THROWS_WITH_AS(batch.add({2, 3, 4, 5}, so),
                       "[opt.input] Batch::add: prompt of 4 tokens + max_new_tokens 61 = 65 positions, beyond "
                       "max_position_embeddings 64",
                       opt::input_error);
}

TEST_CASE("generate: on_token can stop a row early") {
  opt::Model m = opt::Model::load(opt_test::fixture_dir("opt-tiny-preln"));
  opt::GenerateOptions go;
  go.max_new_tokens = 8;
  go.on_token = [](size_t row, int32_t) { return row != 0; };
  auto r = opt::generate_ids(m, {{2, 206, 317}, {2, 5}}, go);
  CHECK(r.new_tokens[0].size() == 1);
  CHECK(r.finish_reasons[0] == opt::FinishReason::stopped);
  CHECK(r.new_tokens[1].size() == 8);
  CHECK(r.finish_reasons[1] == opt::FinishReason::length);
}

TEST_CASE("sampling: reproducible with a seed, degenerate settings are greedy") {
  opt::Model m = opt::Model::load(opt_test::fixture_dir("opt-tiny-preln"));
  std::vector<std::vector<int32_t>> prompts = {{2, 206, 317, 15, 500}, {2, 5}};
  opt::GenerateOptions greedy;
  greedy.max_new_tokens = 12;
  auto g = opt::generate_ids(m, prompts, greedy);
  opt::GenerateOptions s = greedy;
  s.sampling.do_sample = true;
  s.sampling.temperature = 1.5f;
  s.sampling.top_p = 0.95f;
  s.sampling.seed = 42;
  auto r1 = opt::generate_ids(m, prompts, s);
  auto r2 = opt::generate_ids(m, prompts, s);
  CHECK(r1.sequences == r2.sequences);
  s.sampling.seed = 43;
  auto r3 = opt::generate_ids(m, prompts, s);
  CHECK(r3.sequences != r1.sequences);  // 24 draws at temperature 1.5 over 512 tokens
  s.sampling.top_k = 1;                  // only the argmax survives
  CHECK(opt::generate_ids(m, prompts, s).sequences == g.sequences);
  s.sampling.top_k = 0;
  s.sampling.temperature = 0.0f;  // greedy
  CHECK(opt::generate_ids(m, prompts, s).sequences == g.sequences);
}

TEST_CASE("sampler: transformers' processors, one by one") {
  std::vector<float> logits = {1.0f, -2.0f, 3.0f, 0.5f};
  // repetition penalty 2 on ids 0, 1 (and 1 again): 1 -> 0.5, -2 -> -4; greedy picks 2
  opt::SamplingOptions o;
  o.repetition_penalty = 2.0f;
  opt::Sampler s(o);
  CHECK(s.sample(logits.data(), 4, {0, 1, 1}) == 2);
  // penalty 10 on id 2: 3 -> 0.3, so 0 (1.0) wins
  o.repetition_penalty = 10.0f;
  opt::Sampler s2(o);
  CHECK(s2.sample(logits.data(), 4, {2}) == 0);
  // top_p 0.5: id 2 holds ~0.82 of the mass, so it is the only survivor
  opt::SamplingOptions p;
  p.do_sample = true;
  p.top_p = 0.5f;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    p.seed = seed;
    opt::Sampler sp(p);
    CHECK(sp.sample(logits.data(), 4, {}) == 2);
  }
  // top_k 2 keeps ids 2 and 0 only
  opt::SamplingOptions k;
  k.do_sample = true;
  k.top_k = 2;
  std::set<int32_t> seen;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    k.seed = seed;
    opt::Sampler sk(k);
    seen.insert(sk.sample(logits.data(), 4, {}));
  }
  CHECK(seen == std::set<int32_t>{0, 2});
  // invalid settings
  opt::SamplingOptions bad;
  bad.top_p = 0.0f;
  CHECK_THROWS_AS(opt::Sampler{bad}, opt::input_error);
  bad = {};
  bad.temperature = -1.0f;
  CHECK_THROWS_AS(opt::Sampler{bad}, opt::input_error);
  bad = {};
  bad.top_k = -3;
  CHECK_THROWS_AS(opt::Sampler{bad}, opt::input_error);
}

TEST_CASE("sampling in a batch: each sequence's tokens are those it samples alone, whichever thread picks them") {
  // step() picks every sequence's token in parallel over the workspace's threads; each sampler draws from its own
  // seeded stream, so a sequence's tokens must not depend on the batch, the thread count or its neighbours
  opt::Model m = opt::Model::load(opt_test::fixture_dir("opt-tiny-preln"));
  const std::vector<std::vector<int32_t>> prompts = {{2, 206, 317, 15, 500}, {2, 5}, {2, 9, 9, 9}, {2, 71, 3},
                                                     {2, 400}, {2, 11, 12, 13, 14, 15}};
  auto options = [](size_t i) {
    opt::SequenceOptions so;
    so.max_new_tokens = 10;
    so.stop_at_eos = false;
    if (i % 3 != 2) {  // two in three sample (different settings and seeds), the rest are greedy
      so.sampling.do_sample = true;
      so.sampling.temperature = i % 2 ? 1.3f : 0.8f;
      so.sampling.top_k = i % 2 ? 0 : 50;
      so.sampling.seed = 1000 + i;
    }
    return so;
  };
  std::vector<std::vector<int32_t>> alone;
  for (size_t i = 0; i < prompts.size(); ++i) {
    opt::Batch b(m, 1);
    const opt::SeqId id = b.add(prompts[i], options(i));
    while (!b.empty()) b.step();
    alone.push_back(b.new_tokens(id));
  }
  for (size_t threads : {size_t(1), size_t(2), size_t(3)}) {
    INFO("threads " << threads);
    opt::Batch b(m, threads);
    std::vector<opt::SeqId> ids;
    for (size_t i = 0; i < prompts.size(); ++i) ids.push_back(b.add(prompts[i], options(i)));
    while (!b.empty()) b.step();
    for (size_t i = 0; i < prompts.size(); ++i) CHECK(b.new_tokens(ids[i]) == alone[i]);
  }
}
