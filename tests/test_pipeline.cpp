// One model in parts (opt/pipeline.hpp without MPI): stages loaded with LoadOptions::layers / embeddings / head
// hold only their tensors, and chained in one process (each stage with its own caches kept from the pass headers,
// as an MPI rank keeps them) they give the whole model's logits bit for bit, in plain passes, in a batch that
// sequences join and leave, and with speculative decoding's rollbacks. tests/mpi/ runs the same over mpirun.
#include <opt/generate.hpp>
#include <opt/pipeline.hpp>
#include <opt/speculative.hpp>

#include <cstring>

#include "shared.hpp"

namespace {

using json = nlohmann::json;

const char* const kModels[] = {"opt-tiny-preln",       "opt-tiny-postln-proj",    "opt-tiny-realvocab",
                               "opt-tiny-odd",         "opt-tiny-preln-fp16",     "opt-tiny-preln-bf16",
                               "opt-tiny-gelu-nobias", "opt-tiny-nofinalln-silu", "opt-tiny-preln-sharded",
                               "opt-tiny-preln-hubstyle"};

// Ranks 1.. of a pipeline in this process: each stage's layers over the residual stream, with the stage's own
// caches kept from the pass header, as pipeline::Stage does on its rank.
class LocalStages : public opt::RemoteLayers {
 public:
  LocalStages(const std::filesystem::path& dir, int ranks, const opt::LoadOptions& base = {}) {
    const opt::Config c = opt::Config::from_file(dir / "config.json");
    for (int r = 1; r < ranks; ++r) {
      stages_.push_back(opt::Model::load(dir, opt::pipeline::stage_options(base, c.num_hidden_layers, ranks, r)));
      caches_.emplace_back();
    }
  }
  void run(const std::vector<opt::SequenceChunk>& chunks, float* hidden, int64_t rows, int64_t dim) override {
    opt::pipeline::encode_pass(chunks, header_);
    ++passes;
    for (size_t s = 0; s < stages_.size(); ++s) {
      const auto& ch = caches_[s].begin_pass(stages_[s].config(), stages_[s].layers(), header_.data(),
                                             int64_t(header_.size()), "stage " + std::to_string(s + 1));
      REQUIRE(int64_t(ch.size()) == int64_t(chunks.size()));
      std::vector<float> wire(hidden, hidden + rows * dim);  // what crosses a boundary: the exact bits
      stages_[s].forward_layers(ch, wire.data(), ws_);
      std::memcpy(hidden, wire.data(), wire.size() * sizeof(float));
    }
  }
  const std::vector<opt::Model>& stages() const { return stages_; }
  const opt::pipeline::StageCaches& caches(size_t s) const { return caches_[s]; }
  int64_t passes = 0;

 private:
  std::vector<opt::Model> stages_;
  std::vector<opt::pipeline::StageCaches> caches_;
  std::vector<int64_t> header_;
  opt::Workspace ws_{1};
};

// Rank 0's part of a `ranks`-rank pipeline over dir, its remote the other ranks in this process.
struct LocalPipeline {
  LocalPipeline(const std::filesystem::path& dir, int ranks, const opt::LoadOptions& base = {}) {
    const opt::Config c = opt::Config::from_file(dir / "config.json");
    head = opt::Model::load(dir, opt::pipeline::stage_options(base, c.num_hidden_layers, ranks, 0));
    stages = std::make_shared<LocalStages>(dir, ranks, base);
    if (ranks > 1) head.set_remote_layers(stages);
  }
  opt::Model head;
  std::shared_ptr<LocalStages> stages;
};

bool same_bits(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, size_t(n) * 4) == 0; }

std::vector<std::vector<int32_t>> prompts_of(const std::string& model) {
  std::vector<std::vector<int32_t>> out;
  json g = opt_test::read_json(opt_test::fixture_dir(model) / "goldens.json");
  for (auto& cs : g["cases"]) {
    auto rows = opt::unpad(cs["input_ids"].get<std::vector<std::vector<int32_t>>>(),
                           cs["attention_mask"].get<std::vector<std::vector<int32_t>>>());
    out.insert(out.end(), rows.begin(), rows.end());
  }
  return out;
}

}  // namespace

TEST_CASE("split_layers: contiguous ranges in rank order, covering every layer, the later ranks the larger") {
  for (int64_t L = 0; L <= 9; ++L)
    for (int ranks = 1; ranks <= 5; ++ranks) {
      int64_t at = 0, smallest = L, largest = 0;
      for (int r = 0; r < ranks; ++r) {
        const opt::LayerRange p = opt::pipeline::split_layers(L, ranks, r);
        CHECK(p.first == at);
        CHECK(p.last >= p.first);
        if (r > 0) CHECK(p.size() >= opt::pipeline::split_layers(L, ranks, r - 1).size());
        smallest = std::min(smallest, p.size()), largest = std::max(largest, p.size());
        at = p.last;
      }
      CHECK(at == L);
      CHECK(largest - smallest <= 1);
    }
  CHECK(opt::pipeline::split_layers(24, 3, 1) == opt::LayerRange{8, 16});
  CHECK(opt::pipeline::split_layers(2, 3, 0) == opt::LayerRange{0, 0});  // rank 0: the embeddings and head only
  opt_test::check_throws<opt::input_error>([] { (void)opt::pipeline::split_layers(4, 2, 2); }, {"rank 2 of 2"});
  const opt::LoadOptions lo = opt::pipeline::stage_options({}, 4, 2, 1);
  CHECK(lo.layers == opt::LayerRange{2, 4});
  CHECK(!lo.embeddings);
  CHECK(!lo.head);
}

TEST_CASE("a stage binds only its tensors; a part cannot run a whole pass") {
  const auto dir = opt_test::fixture_dir("opt-tiny-odd");  // 3 layers
  opt::LoadOptions lo;
  lo.layers = {1, 2};
  lo.embeddings = lo.head = false;
  const opt::Model m = opt::Model::load(dir, lo);
  CHECK(m.layers() == opt::LayerRange{1, 2});
  CHECK(!m.has_embeddings());
  CHECK(!m.has_head());
  CHECK(m.unexpected_tensors().empty());  // the other stages' tensors are not unexpected
  const opt::ModelWeights& w = m.weights();
  CHECK(w.embed_tokens.data == nullptr);
  CHECK(w.embed_positions.data == nullptr);
  CHECK(w.lm_head().bytes() == 0);
  CHECK(w.final_layer_norm.weight == nullptr);
  for (int64_t l = 0; l < 3; ++l) {
    INFO("layer " << l);
    CHECK((w.layers[size_t(l)].fc1.packed.bytes() != 0) == (l == 1));
    CHECK((w.layers[size_t(l)].self_attn_layer_norm.weight != nullptr) == (l == 1));
  }
  const opt::Model whole = opt::Model::load(dir);
  CHECK(m.decode_weight_bytes() * 3 < whole.decode_weight_bytes());

  opt::KvCache kv(m.config(), 8);
  const int32_t ids[2] = {2, 5};
  opt::Workspace ws(1);
  opt_test::check_throws<opt::input_error>([&] { (void)m.forward({{&kv, ids, 2}}, ws); },
                                           {"forward", "layers [1, 2) of 3", "remote"});
  // a stage's cache holds its layers; a whole model's cache covers them too, one of other layers does not
  opt::KvCache mine(m.config(), 8, opt::dtype::F32, m.layers());
  CHECK(mine.bytes() * 3 == kv.bytes());
  CHECK(mine.first_layer() == 1);
  std::vector<float> hidden(2 * size_t(m.config().hidden_size), 0.5f), again = hidden;
  m.forward_layers({{&mine, nullptr, 2}}, hidden.data(), ws);
  m.forward_layers({{&kv, nullptr, 2}}, again.data(), ws);
  CHECK(hidden == again);
  CHECK(mine.size() == 2);
  opt::KvCache other(m.config(), 8, opt::dtype::F32, {2, 3});
  opt_test::check_throws<opt::input_error>([&] { m.forward_layers({{&other, nullptr, 2}}, hidden.data(), ws); },
                                           {"forward_layers", "KvCache of layers [2, 3)", "layers [1, 2) of 3"});
  opt_test::check_throws<opt::input_error>([&] { (void)opt::KvCache(m.config(), 8, opt::dtype::F32, {1, 4}); },
                                           {"KvCache: layers [1, 4) of a model of 3"});
  opt::Model copy = m;
  opt_test::check_throws<opt::input_error>([&] { copy.set_remote_layers(std::make_shared<LocalStages>(dir, 1)); },
                                           {"set_remote_layers", "layers [1, 2) of 3"});
  lo.layers = {2, 4};
  opt_test::check_throws<opt::config_error>([&] { (void)opt::Model::load(dir, lo); },
                                            {"LoadOptions::layers = [2, 4)", "num_hidden_layers 3"});
  lo.layers = {0, -1};
  lo.embeddings = lo.head = true;  // the default: everything
  CHECK(opt::Model::load(dir, lo).layers() == opt::LayerRange{0, 3});
}

TEST_CASE("forward through 1-4 chained stages: the whole model's logits, bit for bit") {
  for (const char* name : kModels) {
    const auto dir = opt_test::fixture_dir(name);
    const opt::Model whole = opt::Model::load(dir);
    const auto prompts = prompts_of(name);
    for (int ranks = 1; ranks <= 4; ++ranks) {
      INFO(name << ", " << ranks << " ranks");
      LocalPipeline p(dir, ranks);
      opt::Workspace ws_a(2), ws_b(1);
      // a prefill of every prompt in one pass (all logits), then two decode passes
      std::vector<opt::KvCache> ka, kb;
      for (auto& pr : prompts) ka.emplace_back(whole.config(), int64_t(pr.size()) + 4);
      for (auto& pr : prompts)  // rank 0's caches hold its layers only
        kb.emplace_back(whole.config(), int64_t(pr.size()) + 4, opt::dtype::F32, p.head.layers());
      std::vector<opt::SequenceChunk> ca, cb;
      for (size_t i = 0; i < prompts.size(); ++i) {
        ca.push_back({&ka[i], prompts[i].data(), int64_t(prompts[i].size()), true});
        cb.push_back({&kb[i], prompts[i].data(), int64_t(prompts[i].size()), true});
      }
      for (int pass = 0; pass < 3; ++pass) {
        const opt::LogitsView a = whole.forward(ca, ws_a);
        const opt::LogitsView b = p.head.forward(cb, ws_b);
        REQUIRE(a.rows == b.rows);
        CHECK(same_bits(a.data, b.data, a.rows * a.cols));
        static const int32_t next[2] = {7, 2};
        for (size_t i = 0; i < prompts.size(); ++i) {
          ca[i] = {&ka[i], &next[pass % 2], 1};
          cb[i] = {&kb[i], &next[pass % 2], 1};
        }
      }
      CHECK(p.stages->passes == (ranks > 1 ? 3 : 0));
    }
  }
}

TEST_CASE("continuous batching and speculative decoding through 3 stages: plain generation's tokens and logits") {
  for (const char* name : {"opt-tiny-odd", "opt-tiny-postln-proj", "opt-tiny-nofinalln-silu"}) {
    INFO(name);
    const auto dir = opt_test::fixture_dir(name);
    const opt::Model whole = opt::Model::load(dir);
    LocalPipeline p(dir, 3);
    const auto prompts = prompts_of(name);
    opt::GenerateOptions go;
    go.max_new_tokens = 12;
    opt::Workspace ws(1);
    const opt::GenerateResult want = opt::generate_ids(whole, prompts, go, ws, true);
    const opt::GenerateResult got = opt::generate_ids(p.head, prompts, go, ws, true);
    CHECK(got.sequences == want.sequences);
    for (size_t b = 0; b < prompts.size(); ++b)
      CHECK(same_bits(got.first_logits[b].data(), want.first_logits[b].data(), int64_t(want.first_logits[b].size())));
    // sequences joining a running batch and leaving it; the stages drop the caches of the finished ones
    opt::Batch batch(p.head, 1);
    opt::SequenceOptions so;
    so.max_new_tokens = 12;
    so.speculation = opt::speculation(std::make_shared<opt::PromptLookupDrafter>(1));  // rollbacks on the stages
    std::map<opt::SeqId, size_t> which;
    size_t next = 0;
    for (int step = 0; next < prompts.size() || !batch.empty(); ++step) {
      if (step % 2 == 0 && next < prompts.size()) {
        which[batch.add(prompts[next], so)] = next;
        ++next;
      }
      const size_t in_pass = batch.active();
      for (const opt::StepToken& t : batch.step())
        if (t.finished) {
          CHECK(batch.tokens(t.seq) == want.sequences[which[t.seq]]);
          batch.release(t.seq);
        }
      for (size_t s = 0; s < 2 && in_pass; ++s) CHECK(p.stages->caches(s).sequences() == in_pass);  // no others
    }
    CHECK(next == prompts.size());
  }
}

TEST_CASE("pass headers of groups (Head::lane): the kind carries the group; a stage's caches follow one group") {
  const opt::Config c = opt::Config::from_file(opt_test::fixture_dir("opt-tiny-odd") / "config.json");
  opt::KvCache a(c, 16), b(c, 16);
  const int32_t ids[2] = {2, 10};
  std::vector<int64_t> h;
  opt::pipeline::encode_pass({{&a, ids, 2}}, h);
  CHECK(h[0] == opt::pipeline::wire::kPass);  // group 0: the wire as it was
  CHECK(opt::pipeline::pass_group(h.data(), int64_t(h.size()), "t") == 0);
  opt::pipeline::encode_pass({{&a, ids, 2}, {&b, ids, 1}}, h, 3);
  CHECK(opt::pipeline::pass_group(h.data(), int64_t(h.size()), "t") == 3);
  opt::pipeline::StageCaches caches;
  CHECK(caches.begin_pass(c, {1, 3}, h.data(), int64_t(h.size()), "t").size() == 2);
  const int64_t stop[2] = {opt::pipeline::wire::kStop, 0};
  CHECK(opt::pipeline::pass_group(stop, 2, "t") == -1);
  h[0] = opt::pipeline::wire::kPass + opt::pipeline::wire::kMaxGroups;
  CHECK_THROWS_AS(opt::pipeline::pass_group(h.data(), int64_t(h.size()), "t"), opt::format_error);
  CHECK_THROWS_AS(caches.begin_pass(c, {1, 3}, h.data(), int64_t(h.size()), "t"), opt::format_error);
}
