// The model against Hugging Face transformers' own outputs (../shared/fixtures): logits at real positions within
// 1e-4, per-layer hidden states, per-step scores of the cached decode path, and greedy ids equal to what each
// prompt generates alone, for every fixture model (F32, F16, BF16, hub-style names, shards, odd sizes).
#include <opt/generate.hpp>

#include "shared.hpp"

namespace {

using json = nlohmann::json;
using Rows = std::vector<std::vector<int32_t>>;

Rows to_rows(const json& j) { return j.get<Rows>(); }

struct Diff {
  double max = 0;
  size_t count = 0;
  std::string first;  // the first few mismatching pairs
};

void compare(Diff& d, float got, float want, double tol, const std::string& where) {
  double e = std::fabs(double(got) - double(want));
  if (!(e <= d.max)) d.max = e;
  if (!(e <= tol)) {
    if (d.count < 5) d.first += where + ": got " + std::to_string(got) + " want " + std::to_string(want) + "; ";
    ++d.count;
  }
}

// Runs the rows of a padded batch through the model in one pass (each row its own cache, all logits) and returns
// logits per row, per real token.
std::vector<std::vector<float>> forward_rows(const opt::Model& m, const Rows& rows, opt::Workspace& ws) {
  std::vector<opt::KvCache> caches;
  caches.reserve(rows.size());
  std::vector<opt::SequenceChunk> chunks;
  for (auto& r : rows) {
    caches.emplace_back(m.config());
    chunks.push_back({&caches.back(), r.data(), int64_t(r.size())});
  }
  opt::ForwardOptions fo;
  fo.all_logits = true;
  opt::LogitsView lv = m.forward(chunks, ws, fo);
  std::vector<std::vector<float>> out;
  int64_t r0 = 0;
  for (auto& r : rows) {
    out.emplace_back(lv.row(r0), lv.row(r0) + int64_t(r.size()) * lv.cols);
    r0 += int64_t(r.size());
  }
  return out;
}

void check_case(const std::string& model_name, const opt::Model& m, const json& cs, size_t threads) {
  const auto dir = opt_test::fixture_dir(model_name);
  const std::string name = cs.at("name");
  INFO("model " << model_name << ", case " << name << ", threads " << threads);
  const int64_t V = m.config().vocab_size;
  Rows ids = to_rows(cs.at("input_ids")), mask = to_rows(cs.at("attention_mask"));
  Rows rows = opt::unpad(ids, mask);
  opt::Workspace ws(threads);
  const double tol = 1e-4;

  auto logits = forward_rows(m, rows, ws);
  const size_t B = ids.size(), T = ids[0].size();
  if (cs.contains("logits")) {
    auto want = opt_test::read_f32(dir, cs["logits"]);
    REQUIRE(want.size() == B * T * size_t(V));
    Diff d;
    for (size_t b = 0; b < B; ++b) {
      size_t j = 0;  // index among the row's real tokens
      for (size_t t = 0; t < T; ++t) {
        if (!mask[b][t]) continue;  // pad positions are an HF artefact
        for (int64_t v = 0; v < V; ++v)
          compare(d, logits[b][j * size_t(V) + size_t(v)], want[(b * T + t) * size_t(V) + size_t(v)], tol,
                  "[" + std::to_string(b) + "," + std::to_string(t) + "," + std::to_string(v) + "]");
        ++j;
      }
    }
    MESSAGE(model_name << "/" << name << " logits maxdiff " << d.max);
    CHECK_MESSAGE(d.count == 0, "logits: " << d.count << " values beyond " << tol << ", maxdiff " << d.max << ": "
                                           << d.first);
  }
  if (cs.contains("logits_last")) {
    auto want = opt_test::read_f32(dir, cs["logits_last"]);
    REQUIRE(want.size() == B * size_t(V));
    Diff d;
    for (size_t b = 0; b < B; ++b) {
      REQUIRE(mask[b][T - 1] == 1);  // left padding: the last position is real
      const float* got = logits[b].data() + (rows[b].size() - 1) * size_t(V);
      for (int64_t v = 0; v < V; ++v)
        compare(d, got[v], want[b * size_t(V) + size_t(v)], tol, "[" + std::to_string(b) + "," + std::to_string(v) + "]");
    }
    CHECK_MESSAGE(d.count == 0, "logits_last: maxdiff " << d.max << ": " << d.first);
  }
  if (cs.contains("last_position_topk")) {
    const json& tk = cs["last_position_topk"];
    for (size_t b = 0; b < B; ++b) {
      if (!mask[b][T - 1]) continue;  // a pad position in HF's right-padded batch: not a real prediction
      const float* got = logits[b].data() + (rows[b].size() - 1) * size_t(V);
      for (size_t k = 0; k < tk["ids"][b].size(); ++k) {
        int id = tk["ids"][b][k];
        CHECK(std::fabs(got[id] - tk["values"][b][k].get<float>()) <= tol);
      }
    }
  }
  if (cs.contains("hidden_states")) {
    REQUIRE(B == 1);
    std::vector<std::vector<float>> hs;
    opt::KvCache kv(m.config());
    opt::ForwardOptions fo;
    fo.hidden_states = &hs;
    m.forward({{&kv, rows[0].data(), int64_t(rows[0].size())}}, ws, fo);
    REQUIRE(hs.size() == cs["hidden_states"].size());
    for (size_t i = 0; i < hs.size(); ++i) {
      auto want = opt_test::read_f32(dir, cs["hidden_states"][i]);
      REQUIRE(want.size() == hs[i].size());
      Diff d;
      for (size_t k = 0; k < want.size(); ++k) compare(d, hs[i][k], want[k], tol, std::to_string(k));
      CHECK_MESSAGE(d.count == 0, "hidden_states[" << i << "]: maxdiff " << d.max << ": " << d.first);
    }
  }

  // ---- greedy generation: every row equals its prompt generated alone ----
  const json& g = cs.at("generate");
  opt::GenerateOptions go;
  go.max_new_tokens = g.at("max_new_tokens");
  opt::GenerateResult res = opt::generate_ids(m, rows, go, ws, true);
  for (size_t b = 0; b < B; ++b) {
    std::vector<int32_t> want;
    if (g.contains("alone")) want = g["alone"][b]["new_tokens"].get<std::vector<int32_t>>();
    else {
      REQUIRE(B == 1);
      want = g["new_tokens"][0].get<std::vector<int32_t>>();
    }
    CHECK_MESSAGE(res.new_tokens[b] == want, "row " << b);
    std::vector<int32_t> seq = rows[b];
    seq.insert(seq.end(), want.begin(), want.end());
    CHECK(res.sequences[b] == seq);
    // the first new token's logits are the prompt's last-position logits
    const float* last = logits[b].data() + (rows[b].size() - 1) * size_t(V);
    CHECK(std::equal(res.first_logits[b].begin(), res.first_logits[b].end(), last));
  }
  // per-step scores of the cached decode path (single-row cases; HF's batched scores include pad artefacts)
  if (B == 1 && g.contains("scores")) {
    auto want = opt_test::read_f32(dir, g["scores"]);
    const size_t steps = res.new_tokens[0].size();
    opt::KvCache kv(m.config());
    std::vector<int32_t> seq = rows[0];
    Diff d;
    opt::LogitsView lv = m.forward({{&kv, seq.data(), int64_t(seq.size())}}, ws);
    for (size_t s = 0; s < steps; ++s) {
      for (int64_t v = 0; v < V; ++v)
        compare(d, lv.row(0)[v], want[s * size_t(V) + size_t(v)], tol, "step " + std::to_string(s));
      int32_t id = res.new_tokens[0][s];
      if (s + 1 < steps) lv = m.forward({{&kv, &id, 1}}, ws);
    }
    CHECK_MESSAGE(d.count == 0, "scores: maxdiff " << d.max << ": " << d.first);
  }
}

}  // namespace

TEST_CASE("every fixture model and case matches transformers") {
  const auto models = opt_test::fixture_models();
  CHECK(models.size() >= 7);
  for (const std::string& name : models) {
    INFO("model " << name);
    opt::Model m = opt::Model::load(opt_test::fixture_dir(name));
    json goldens = opt_test::read_json(opt_test::fixture_dir(name) / "goldens.json");
    for (const json& cs : goldens.at("cases"))
      for (size_t threads : {1, 2}) check_case(name, m, cs, threads);
  }
}

TEST_CASE("results do not depend on the number of threads") {
  opt::Model m = opt::Model::load(opt_test::fixture_dir("opt-tiny-odd"));
  std::vector<int32_t> ids = {2, 10, 20, 30, 40, 50, 60, 70, 80};
  std::vector<std::vector<float>> outs;
  for (size_t threads : {1, 2, 3}) {
    opt::Workspace ws(threads);
    opt::KvCache kv(m.config());
    opt::ForwardOptions fo;
    fo.all_logits = true;
    auto lv = m.forward({{&kv, ids.data(), int64_t(ids.size())}}, ws, fo);
    outs.emplace_back(lv.data, lv.data + lv.rows * lv.cols);
  }
  CHECK(outs[0] == outs[1]);
  CHECK(outs[0] == outs[2]);
}
