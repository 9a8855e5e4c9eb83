// The model against Hugging Face transformers' own outputs (../shared/fixtures): logits at real positions within
// 1e-4 (argmax and embed_positions rows at every real position), per-layer hidden states, per-step scores of the
// cached decode path (all rows of a batch at once, full or top-k), and greedy ids equal to what each
// prompt generates alone, for every fixture model (F32, F16, BF16, hub-style names, shards, odd sizes).
#include <algorithm>
#include <limits>
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

size_t rows_tokens(const Rows& rows) {
  size_t n = 0;
  for (auto& r : rows) n += r.size();
  return n;
}

// The per-step scores of HF's generate ([steps, B, V] floats, and their top-k) against the cached decode path run
// on all rows at once: one prompt pass for the batch, then one token per unfinished row per step, each row fed the
// tokens it generates alone. Compared: every step of a row up to its first EOS; of HF's right-padded batch only the
// full-length rows (HF predicts a short row from a pad position). Returns the number of (step, row) compared.
size_t check_scores(const std::string& model_name, const opt::Model& m, const json& cs, const Rows& rows,
                    const Rows& mask, opt::Workspace& ws) {
  const auto dir = opt_test::fixture_dir(model_name);
  const json& g = cs.at("generate");
  const int64_t V = m.config().vocab_size;
  const size_t B = rows.size(), steps = g.at("steps");
  const double tol = 1e-4;
  std::vector<std::vector<int32_t>> alone(B);
  std::vector<bool> comparable(B);
  for (size_t b = 0; b < B; ++b) {
    alone[b] = g.contains("alone") ? g["alone"][b]["new_tokens"].get<std::vector<int32_t>>()
                                   : g.at("new_tokens")[b].get<std::vector<int32_t>>();
    comparable[b] = cs.at("padding") != "right" || std::count(mask[b].begin(), mask[b].end(), 1) == long(mask[b].size());
  }
  std::vector<float> full;
  if (g.contains("scores")) {
    REQUIRE(g["scores"].at("shape") == json::array({steps, B, V}));
    full = opt_test::read_f32(dir, g["scores"]);
    REQUIRE(full.size() == steps * B * size_t(V));
  }
  const json* topk = g.contains("scores_topk") ? &g["scores_topk"] : nullptr;
  if (topk) {
    REQUIRE(topk->at("ids").size() == steps);
    REQUIRE(topk->at("values").size() == steps);
  }
  REQUIRE((!full.empty() || topk));
  std::vector<opt::KvCache> kv;
  for (size_t b = 0; b < B; ++b) kv.emplace_back(m.config());
  std::vector<opt::SequenceChunk> chunks;
  for (size_t b = 0; b < B; ++b) chunks.push_back({&kv[b], rows[b].data(), int64_t(rows[b].size())});
  std::vector<size_t> order(B);  // the rows of this pass, in the order of its logits
  for (size_t b = 0; b < B; ++b) order[b] = b;
  opt::LogitsView lv = m.forward(chunks, ws);
  Diff d, dk;
  size_t compared = 0;
  for (size_t s = 0; s < steps; ++s) {
    REQUIRE(lv.rows == int64_t(order.size()));
    REQUIRE(lv.cols == V);
    for (size_t i = 0; i < order.size(); ++i) {
      const size_t b = order[i];
      if (!comparable[b]) continue;
      const float* got = lv.row(int64_t(i));
      const std::string where = "step " + std::to_string(s) + " row " + std::to_string(b);
      if (!full.empty())
        for (int64_t v = 0; v < V; ++v) compare(d, got[v], full[(s * B + b) * size_t(V) + size_t(v)], tol, where);
      if (topk) {
        const json& ids = topk->at("ids")[s][b];
        const json& vals = topk->at("values")[s][b];
        REQUIRE(ids.size() == topk->at("k").get<size_t>());
        REQUIRE(vals.size() == ids.size());
        std::vector<bool> listed(size_t(V), false);
        float lowest = std::numeric_limits<float>::infinity();
        for (size_t k = 0; k < ids.size(); ++k) {
          const int32_t id = ids[k];
          REQUIRE((id >= 0 && id < V));
          listed[size_t(id)] = true;
          lowest = std::min(lowest, vals[k].get<float>());
          compare(dk, got[id], vals[k].get<float>(), tol, where + " id " + std::to_string(id));
        }
        // the top k are the top k: no other logit above the k-th golden value (beyond the tolerance)
        for (int64_t v = 0; v < V; ++v)
          if (!listed[size_t(v)]) compare(dk, std::max(got[v], lowest), lowest, tol, where + " unlisted id " + std::to_string(v));
      }
      ++compared;
    }
    // the next step: each row that has not yet produced all its tokens takes its next one
    chunks.clear();
    std::vector<size_t> next;
    for (size_t b = 0; b < B; ++b)
      if (s + 1 < alone[b].size()) {
        next.push_back(b);
        chunks.push_back({&kv[b], &alone[b][s], 1});
      }
    if (next.empty()) break;
    order = next;
    lv = m.forward(chunks, ws);
  }
  CHECK_MESSAGE(d.count == 0, "scores: " << d.count << " values beyond " << tol << ", maxdiff " << d.max << ": " << d.first);
  CHECK_MESSAGE(dk.count == 0, "scores_topk: " << dk.count << " values beyond " << tol << ", maxdiff " << dk.max << ": " << dk.first);
  return compared;
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
  REQUIRE(rows.size() == B);
  REQUIRE(logits.size() == B);
  for (size_t b = 0; b < B; ++b) {
    REQUIRE(!rows[b].empty());
    REQUIRE(logits[b].size() == rows[b].size() * size_t(V));
  }
  // position_rows: the embed_positions rows HF used, cumsum(mask) * mask - 1 + 2; the model reads
  // opt::position_row(j) for the j-th real token of a row (its cache size), so the two agree on every real
  // position; pads get HF's position -1
  {
    const Rows pos = to_rows(cs.at("position_rows"));
    REQUIRE(pos.size() == B);
    for (size_t b = 0; b < B; ++b) {
      REQUIRE(pos[b].size() == T);
      int64_t j = 0;
      for (size_t t = 0; t < T; ++t)
        CHECK_MESSAGE(pos[b][t] == opt::position_row(mask[b][t] ? j++ : -1), "position_rows[" << b << "][" << t << "]");
    }
  }
  // argmax of the logits at every real position (also where only last-position logits are stored); a different
  // argmax is only allowed for a tie within the tolerance
  {
    const Rows am = to_rows(cs.at("argmax"));
    REQUIRE(am.size() == B);
    size_t compared = 0;
    for (size_t b = 0; b < B; ++b) {
      REQUIRE(am[b].size() == T);
      size_t j = 0;
      for (size_t t = 0; t < T; ++t) {
        if (!mask[b][t]) continue;
        const float* l = logits[b].data() + j++ * size_t(V);
        const int32_t want = am[b][t], got = int32_t(std::max_element(l, l + V) - l);
        REQUIRE((want >= 0 && want < V));
        CHECK_MESSAGE((got == want || l[want] >= l[got] - 1e-4f),
                      "argmax[" << b << "][" << t << "]: got " << got << " (" << l[got] << ") want " << want << " ("
                                << l[want] << ")");
        ++compared;
      }
    }
    REQUIRE(compared == rows_tokens(rows));
  }
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
  REQUIRE(res.new_tokens.size() == B);
  REQUIRE(res.first_logits.size() == B);
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
    REQUIRE(res.first_logits[b].size() == size_t(V));
    CHECK(std::equal(res.first_logits[b].begin(), res.first_logits[b].end(), last));
  }
  // per-step scores of the cached decode path, every row of the batch decoding at once
  CHECK(check_scores(model_name, m, cs, rows, mask, ws) > 0);
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

TEST_CASE("a copy of a Model works the same after the original is gone (copies share the weights)") {
  for (const char* name : {"opt-tiny-realvocab", "opt-tiny-postln-proj", "opt-tiny-preln-bf16"}) {
    INFO(std::string(name));
    const std::vector<int32_t> ids = {2, 10, 20, 30};
    opt::Workspace ws(1);
    auto original = std::make_unique<opt::Model>(opt::Model::load(opt_test::fixture_dir(name)));
    opt::KvCache k1(original->config());
    const opt::LogitsView a = original->forward({{&k1, ids.data(), int64_t(ids.size())}}, ws);
    const std::vector<float> want(a.row(0), a.row(0) + a.cols);
    const opt::Model copy = *original;
    original.reset();  // the LayerNorm and bias vectors it widened to f32 must outlive it
    opt::KvCache k2(copy.config());
    const opt::LogitsView b = copy.forward({{&k2, ids.data(), int64_t(ids.size())}}, ws);
    CHECK(std::vector<float>(b.row(0), b.row(0) + b.cols) == want);
  }
}
