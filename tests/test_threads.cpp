// Thread-count invariance, end to end: for F32, F16, BF16 and int8 weights, the prompt pass logits, the logits
// of decode steps (one row, and ten rows at once) and generate's output are bitwise identical for 1, 2, 3 and 5
// threads (Workspace(n) sizes the pool). The model is a random checkpoint whose matrices are large enough that
// these thread counts really cut every linear layer into different chunks (checked below against the pool's rule).
#include <unistd.h>

#include <opt/generate.hpp>
#include <opt/random_checkpoint.hpp>
#include <set>

#include "shared.hpp"

namespace {

using Rows = std::vector<std::vector<int32_t>>;
constexpr size_t kThreads[] = {1, 2, 3, 5};

// The pool's split (ThreadPool::parallel_for_t): ceil(n / grain) blocks in min(blocks, 4 * threads) chunks.
size_t chunks(size_t n, size_t grain, size_t threads) {
  const size_t blocks = (n + grain - 1) / grain;
  return threads == 1 ? 1 : std::min(blocks, 4 * threads);
}

// Panels of 16 rows, a chunk a multiple of `grain` panels (ops::linear_multi: 8 for n <= 8 rows, else 2).
opt::Config shape() {
  opt::Config c;
  c.vocab_size = 4000;           // LM head: 250 panels
  c.hidden_size = 448;           // q/k/v 3 x 28 panels, out_proj, fc2, project_in: 28
  c.word_embed_proj_dim = 400;   // project_out: 25 panels
  c.ffn_dim = 640;               // fc1: 40 panels
  c.num_attention_heads = 8;     // head_dim 56
  c.num_hidden_layers = 2;
  c.max_position_embeddings = 64;
  return c;
}

Rows prompts(size_t n_rows, int32_t V) {
  Rows r;
  for (size_t b = 0; b < n_rows; ++b) {
    std::vector<int32_t> p = {2};
    const size_t len = 3 + (b * 5) % 12;  // 3..14 tokens
    for (size_t t = 1; t < len; ++t) p.push_back(int32_t((37 * t + 101 * b + 5) % size_t(V)));
    r.push_back(p);
  }
  return r;
}

struct Outputs {
  std::vector<float> prompt;  // all logits of a 3-row prompt pass
  std::vector<float> one;     // 4 decode steps of one row
  std::vector<float> ten;     // 4 decode steps of ten rows at once
  Rows sequences;             // generate, ten rows
  std::vector<std::vector<float>> first_logits;
};

Outputs run(const opt::Model& m, size_t threads) {
  opt::Workspace ws(threads);
  REQUIRE(ws.threads() == threads);
  const int32_t V = int32_t(m.config().vocab_size);
  Outputs o;
  // prompt pass: rows of 14, 3 and 8 tokens (25 rows > 8: grain 2; the 14-token row's attention runs on the pool)
  const Rows rows3 = {prompts(10, V)[7], prompts(10, V)[0], prompts(10, V)[1]};
  REQUIRE(rows3[0].size() == 14);
  {
    std::vector<opt::KvCache> kv;
    std::vector<opt::SequenceChunk> ch;
    for (size_t b = 0; b < rows3.size(); ++b) kv.emplace_back(m.config());
    for (size_t b = 0; b < rows3.size(); ++b) ch.push_back({&kv[b], rows3[b].data(), int64_t(rows3[b].size())});
    opt::ForwardOptions fo;
    fo.all_logits = true;
    opt::LogitsView lv = m.forward(ch, ws, fo);
    REQUIRE(lv.rows == 25);
    o.prompt.assign(lv.data, lv.data + lv.rows * lv.cols);
  }
  // decode steps: the prompt, then 4 steps of one token per row
  auto decode = [&](const Rows& rows, std::vector<float>& out) {
    std::vector<opt::KvCache> kv;
    for (size_t b = 0; b < rows.size(); ++b) kv.emplace_back(m.config());
    std::vector<opt::SequenceChunk> ch;
    for (size_t b = 0; b < rows.size(); ++b) ch.push_back({&kv[b], rows[b].data(), int64_t(rows[b].size())});
    m.forward(ch, ws);
    std::vector<int32_t> ids(rows.size());
    for (int s = 0; s < 4; ++s) {
      ch.clear();
      for (size_t b = 0; b < rows.size(); ++b) {
        ids[b] = int32_t((17 * s + 29 * b + 3) % size_t(V));
        ch.push_back({&kv[b], &ids[b], 1});
      }
      opt::LogitsView lv = m.forward(ch, ws);
      REQUIRE(lv.rows == int64_t(rows.size()));
      out.insert(out.end(), lv.data, lv.data + lv.rows * lv.cols);
    }
  };
  decode({rows3[0]}, o.one);  // n = 1: grain 8 (the LM head's 32 blocks split differently)
  const Rows rows10 = prompts(10, V);
  decode(rows10, o.ten);  // n = 10: grain 2, every matrix splits differently
  // generate: ten rows, 4 new tokens (greedy)
  opt::GenerateOptions go;
  go.max_new_tokens = 4;
  opt::GenerateResult g = opt::generate_ids(m, rows10, go, ws, true);
  o.sequences = g.sequences;
  o.first_logits = g.first_logits;
  REQUIRE(o.sequences.size() == 10);
  REQUIRE(o.first_logits.size() == 10);
  for (auto& f : o.first_logits) REQUIRE(f.size() == size_t(V));
  return o;
}

// Bitwise equality (not ==: -0 == +0 and NaN != NaN); reports the first difference.
void same_bits(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  REQUIRE(a.size() == b.size());
  REQUIRE(!a.empty());
  size_t diff = 0, first = a.size();
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      if (first == a.size()) first = i;
      ++diff;
    }
  CHECK_MESSAGE(diff == 0, std::string(what) << ": " << diff << " of " << a.size() << " floats differ, first at " << first
                                << " (" << (first < a.size() ? a[first] : 0.f) << " vs "
                                << (first < a.size() ? b[first] : 0.f) << ")");
}

}  // namespace

TEST_CASE("the problem sizes split every linear layer differently for 1, 2, 3 and 5 threads") {
  const opt::Config c = shape();
  const size_t P = 16;
  const size_t H = size_t(c.hidden_size), E = size_t(c.word_embed_proj_dim), F = size_t(c.ffn_dim),
               V = size_t(c.vocab_size);
  // n > 8 rows (prompt pass, ten-row decode): grain 2 for every matrix; n = 1: grain 8 for the LM head
  for (auto [rows, grain] : std::vector<std::pair<size_t, size_t>>{
           {3 * H, 2}, {H, 2}, {E, 2}, {F, 2}, {V, 2}, {V, 8}}) {
    INFO("rows " << rows << ", grain " << grain);
    std::set<size_t> seen;
    for (size_t t : kThreads) seen.insert(chunks((rows + P - 1) / P, grain, t));
    CHECK(seen.size() == std::size(kThreads));
  }
  // attention of the 14-token row: 4 blocks of 4 tokens x 8 heads, grain 1
  std::set<size_t> seen;
  for (size_t t : kThreads) seen.insert(chunks(4 * size_t(c.num_attention_heads), 1, t));
  CHECK(seen.size() == std::size(kThreads));
  CHECK(14 * 14 * int64_t(H) >= (int64_t(1) << 16));  // Model::forward runs that attention on the pool
}

TEST_CASE("thread-count invariance: F32, F16, BF16 and int8 weights, bitwise") {
  const auto dir = opt_test::scratch("threads_" + std::to_string(::getpid()));
  struct Variant {
    const char* name;
    opt::dtype stored;
    bool int8;
  };
  for (const Variant& v : {Variant{"F32", opt::dtype::F32, false}, Variant{"F16", opt::dtype::F16, false},
                           Variant{"BF16", opt::dtype::BF16, false}, Variant{"int8", opt::dtype::F32, true}}) {
    INFO("weights " << std::string(v.name));
    const auto d = dir / v.name;
    opt::write_random_checkpoint(d, shape(), v.stored, 16);
    opt::LoadOptions lo;
    if (v.int8) {
      lo.quantize = opt::quantization::int8;
      lo.lm_head_int8 = true;
    }
    const opt::Model m = opt::Model::load(d, lo);
    const Outputs ref = run(m, 1);
    for (size_t t : kThreads) {
      if (t == 1) continue;
      INFO("threads " << t << " vs 1");
      const Outputs o = run(m, t);
      same_bits(ref.prompt, o.prompt, "prompt pass logits");
      same_bits(ref.one, o.one, "decode steps, one row");
      same_bits(ref.ten, o.ten, "decode steps, ten rows");
      CHECK(ref.sequences == o.sequences);
      for (size_t b = 0; b < ref.first_logits.size(); ++b) same_bits(ref.first_logits[b], o.first_logits[b], "generate's first logits");
    }
  }
  std::filesystem::remove_all(dir);
}
