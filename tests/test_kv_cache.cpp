// The KV cache's element types (F32, the default; F16 and BF16, half the bytes): what a cache costs per token,
// the errors a host can cause, and, on every fixture model, how far F16 and BF16 caches move the logits from the
// F32 cache's and how often greedy decoding still picks the same tokens. An F32 cache stays exact: the fixture
// goldens (test_model) and the invariance tests (test_invariance) hold it to its bits.
#include <algorithm>
#include <cmath>
#include <opt/batch.hpp>
#include <opt/generate.hpp>
#include <opt/model.hpp>

#include "shared.hpp"

namespace {

const opt::dtype kTypes[] = {opt::dtype::F32, opt::dtype::F16, opt::dtype::BF16};

// f() throws an E whose message contains `what`.
template <class E, class F>
void check_throws(F&& f, const std::string& what) {
  try {
    f();
    FAIL_CHECK("no exception; expected: " << what);
  } catch (const E& e) {
    CHECK_MESSAGE(std::string(e.what()).find(what) != std::string::npos, e.what());
  }
}

// Logits of every token of `row` (a prompt pass of its first `prompt` tokens, then one step per token) through
// a cache of type t.
std::vector<float> logits(const opt::Model& m, opt::Workspace& ws, const std::vector<int32_t>& row, int64_t prompt,
                          opt::dtype t) {
  opt::KvCache kv(m.config(), 0, t);
  opt::ForwardOptions fo;
  fo.all_logits = true;
  opt::LogitsView lv = m.forward({{&kv, row.data(), prompt}}, ws, fo);
  std::vector<float> out(lv.data, lv.data + prompt * lv.cols);
  for (size_t j = size_t(prompt); j < row.size(); ++j) {
    lv = m.forward({{&kv, row.data() + j, 1}}, ws);
    out.insert(out.end(), lv.row(0), lv.row(0) + lv.cols);
  }
  return out;
}

}  // namespace

TEST_CASE("KvCache element types: bytes, bytes_per_token, the layout's size") {
  opt::Model m = opt::Model::load(opt_test::fixture_dir("opt-tiny-preln"));
  const opt::Config& c = m.config();
  for (opt::dtype t : kTypes) {
    INFO(std::string(opt::to_string(t)));
    const size_t es = opt::dtype_size(t);
    opt::KvCache kv(c, 20, t);
    CHECK(kv.type() == t);
    CHECK(kv.bytes_per_token() == 2 * size_t(c.num_hidden_layers) * size_t(c.hidden_size) * es);
    CHECK(kv.bytes() == 20 * kv.bytes_per_token());
    CHECK(opt::KvCache::bytes_per_token(c, t) == kv.bytes_per_token());
    CHECK(opt::Batch::cache_bytes_for(c, 20, t) == kv.bytes());
  }
  CHECK(opt::KvCache(c, 20).type() == opt::dtype::F32);  // the default
  // the published shapes: opt-125m (12 layers x 768) and opt-6.7b (32 layers x 4096)
  const size_t m125[] = {73728, 36864, 36864}, m6b[] = {1048576, 524288, 524288};
  for (int i = 0; i < 3; ++i) {
    CHECK(opt::KvCache::bytes_per_token(12, 768, kTypes[i]) == m125[i]);
    CHECK(opt::KvCache::bytes_per_token(32, 4096, kTypes[i]) == m6b[i]);
    MESSAGE("KV cache per token, " << std::string(opt::to_string(kTypes[i])) << ": opt-125m "
            << opt::KvCache::bytes_per_token(12, 768, kTypes[i]) / 1024.0 << " KiB, opt-6.7b "
            << opt::KvCache::bytes_per_token(32, 4096, kTypes[i]) / 1024.0 << " KiB");
  }
}

TEST_CASE("KvCache element types: names and bad values") {
  CHECK(opt::kv_cache_type_from_string("f32") == opt::dtype::F32);
  CHECK(opt::kv_cache_type_from_string("f16") == opt::dtype::F16);
  CHECK(opt::kv_cache_type_from_string("bf16") == opt::dtype::BF16);
  for (opt::dtype t : kTypes) CHECK(opt::kv_cache_type_from_string(opt::kv_cache_type_name(t)) == t);
  for (const char* bad : {"", "F16", "fp16", "int8", "f8"}) {
    INFO(bad);
    check_throws<opt::config_error>([&] { (void)opt::kv_cache_type_from_string(bad); },
                                    "unknown KV cache type '" + std::string(bad) + "' (expected f32, f16 or bf16)");
  }
  opt::Model m = opt::Model::load(opt_test::fixture_dir("opt-tiny-preln"));
  check_throws<opt::input_error>([&] { opt::KvCache kv(m.config(), 8, opt::dtype::I8); },
                                 "KvCache: element type I8 (expected F32, F16 or BF16)");
  opt::Batch batch(m, 1);
  opt::SequenceOptions so;
  so.kv_cache = opt::dtype::F64;
  check_throws<opt::input_error>([&] { batch.add({2, 5, 6}, so); }, "Batch::add: KV cache element type F64");
  opt::GenerateOptions go;
  go.kv_cache = opt::dtype::U16;
  check_throws<opt::input_error>([&] { (void)opt::generate_ids(m, {{2, 5, 6}}, go); },
                                 "generate: KV cache element type U16 (expected F32, F16 or BF16)");
  // the KV limit counts the cache's own element size: 2 x (3 + 5) positions fit a limit only F16 / BF16 meet
  go.max_new_tokens = 5;
  go.max_cache_bytes = 2 * opt::Batch::cache_bytes_for(m.config(), 8, opt::dtype::F16);
  go.kv_cache = opt::dtype::F32;
  CHECK_THROWS_AS(opt::generate_ids(m, {{2, 5, 6}, {2, 7, 8}}, go), opt::limit_error);
  go.kv_cache = opt::dtype::F16;
  CHECK(opt::generate_ids(m, {{2, 5, 6}, {2, 7, 8}}, go).new_tokens.size() == 2);
}

TEST_CASE("F16 and BF16 caches: logits within the bound of the F32 cache's on every fixture; greedy agreement") {
  // Max |logit - F32 cache's logit| over every token of two rows (prompt pass and decode steps), relative to the
  // largest |logit| of the row. Measured on the fixtures (the same on every ISA: the bits are): F16 6.2e-4, BF16
  // 5.0e-3 (each key and value rounded by up to 2^-11 resp. 2^-8 of itself). The bounds leave 3x.
  const double bound[] = {0.0, 2e-3, 1.5e-2};
  opt::Workspace ws(2);
  const std::vector<std::vector<int32_t>> rows = {{2, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26},
                                                  {2, 40, 41, 7, 300, 9, 10, 11, 12, 100, 101}};
  double worst[3] = {0, 0, 0}, worst_abs[3] = {0, 0, 0};
  size_t agree[3] = {0, 0, 0}, total = 0;
  for (const std::string& name : opt_test::fixture_models()) {
    INFO(name);
    opt::Model m = opt::Model::load(opt_test::fixture_dir(name));
    std::vector<std::vector<int32_t>> rs = rows;
    for (auto& r : rs)
      for (auto& id : r) id %= int32_t(m.config().vocab_size);
    for (const auto& row : rs) {
      const std::vector<float> base = logits(m, ws, row, 5, opt::dtype::F32);
      float scale = 0;
      for (float x : base) scale = std::max(scale, std::fabs(x));
      for (int ti = 1; ti < 3; ++ti) {
        INFO(std::string(opt::to_string(kTypes[ti])));
        const std::vector<float> got = logits(m, ws, row, 5, kTypes[ti]);
        REQUIRE(got.size() == base.size());
        double e = 0;
        for (size_t i = 0; i < got.size(); ++i) e = std::max(e, double(std::fabs(got[i] - base[i])));
        worst_abs[ti] = std::max(worst_abs[ti], e);
        e /= double(scale);
        CHECK(e <= bound[ti]);
        CHECK(e > 0);  // the rounding is there: the cache is really F16 / BF16
        worst[ti] = std::max(worst[ti], e);
      }
    }
    // greedy decoding, 24 new tokens from each row's first 4, EOS ignored: tokens identical to the F32 cache's
    opt::GenerateOptions go;
    go.max_new_tokens = 24;
    go.stop_at_eos = false;
    const std::vector<std::vector<int32_t>> prompts = {{rs[0].begin(), rs[0].begin() + 4},
                                                       {rs[1].begin(), rs[1].begin() + 4}};
    std::vector<opt::GenerateResult> res;
    for (opt::dtype t : kTypes) {
      go.kv_cache = t;
      res.push_back(opt::generate_ids(m, prompts, go, ws));
    }
    for (size_t b = 0; b < prompts.size(); ++b) {
      total += res[0].new_tokens[b].size();
      for (int ti = 0; ti < 3; ++ti)  // the tokens before the first that differs
        for (size_t j = 0; j < res[0].new_tokens[b].size() && res[ti].new_tokens[b][j] == res[0].new_tokens[b][j]; ++j)
          ++agree[ti];
    }
  }
  MESSAGE("max |logit - F32 cache| / max |logit| over the fixtures: F16 " << worst[1] << ", BF16 " << worst[2]
          << "; max |logit - F32 cache|: F16 " << worst_abs[1] << ", BF16 " << worst_abs[2]);
  MESSAGE("greedy tokens before the first that differs from the F32 cache's: F16 " << agree[1] << "/" << total
          << ", BF16 " << agree[2] << "/" << total);
  CHECK(agree[0] == total);
}

TEST_CASE("KvCache::reserve grows a cache and keeps what it holds: the same logits as a cache that had the room") {
  for (opt::dtype t : kTypes)
  for (bool huge : {true, false}) {  // (4 KiB pages, as ModelDrafter's: the same values)
    INFO(opt::to_string(t) << (huge ? " huge pages" : " 4 KiB pages"));
    const opt::Model m = opt::Model::load(opt_test::fixture_dir("opt-tiny-odd"));
    opt::Workspace ws(2);
    const std::vector<int32_t> row = {2, 11, 12, 13, 40, 41, 40, 41, 7, 8, 9, 10};
    opt::KvCache big(m.config(), 0, t), small(m.config(), 5, t, {}, huge);
    CHECK(small.huge_pages() == huge);
    std::vector<float> want, got;
    for (size_t j = 0; j < row.size(); ++j) {
      opt::LogitsView a = m.forward({{&big, row.data() + j, 1}}, ws);
      want.insert(want.end(), a.row(0), a.row(0) + a.cols);
      if (small.size() == small.capacity()) small.reserve(m.config(), small.capacity() + 3);
      opt::LogitsView b = m.forward({{&small, row.data() + j, 1}}, ws);
      got.insert(got.end(), b.row(0), b.row(0) + b.cols);
    }
    CHECK(small.capacity() == 14);
    CHECK(small.size() == int64_t(row.size()));
    CHECK(small.huge_pages() == huge);  // reserve keeps the choice
    CHECK(got == want);
    small.reserve(m.config(), 3);  // has the room: nothing changes
    CHECK(small.capacity() == 14);
    check_throws<opt::input_error>([&] { small.reserve(m.config(), m.config().max_position_embeddings + 1); },
                                   "exceeds max_position_embeddings");
    opt::Config other = m.config();
    other.hidden_size *= 2;
    check_throws<opt::input_error>([&] { small.reserve(other, 20); }, "not this cache's model's");
  }
}
