// opt::PrefixCache with opt::Batch: a sequence that starts from a cached prefix (whole, partial, on and off block
// boundaries, several at once, after evictions, speculating) gets the tokens and per-step logits of a cold run bit
// for bit, and the goldens; the byte budget holds, the least recently used block goes first, F16 and BF16 caches
// are kept apart from F32, a cache never serves another model, and bad input is an input_error.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <opt/batch.hpp>
#include <opt/prefix_cache.hpp>
#include <opt/speculative.hpp>

#include "shared.hpp"

namespace {

using json = nlohmann::json;

struct Run {
  std::vector<int32_t> ids;     // new tokens
  std::vector<float> logits;    // the logits that chose each, one row after another
};

// Greedy generation of each prompt, all added to `batch` before the first step (several sequences at once).
std::vector<Run> generate(opt::Batch& batch, const std::vector<std::vector<int32_t>>& prompts, int64_t max_new,
                          opt::dtype kv = opt::dtype::F32, std::shared_ptr<const opt::Speculation> spec = nullptr) {
  std::vector<opt::SeqId> ids;
  for (auto& p : prompts) {
    opt::SequenceOptions so;
    so.max_new_tokens = max_new;
    so.kv_cache = kv;
    so.speculation = spec;
    ids.push_back(batch.add(p, so));
  }
  std::vector<Run> out(prompts.size());
  const int64_t cols = batch.model().config().vocab_size;
  while (!batch.empty())
    for (const opt::StepToken& t : batch.step()) {
      const size_t i = size_t(std::find(ids.begin(), ids.end(), t.seq) - ids.begin());
      out[i].ids.push_back(t.token);
      out[i].logits.insert(out[i].logits.end(), t.logits, t.logits + cols);
    }
  for (opt::SeqId id : ids) batch.release(id);
  return out;
}

Run cold(const opt::Model& m, const std::vector<int32_t>& prompt, int64_t max_new, opt::dtype kv = opt::dtype::F32) {
  opt::Batch b(m, 1);
  return generate(b, {prompt}, max_new, kv)[0];
}

// The same tokens and the same logits, bit for bit.
void check_same(const Run& got, const Run& want) {
  CHECK(got.ids == want.ids);
  REQUIRE(got.logits.size() == want.logits.size());
  CHECK(std::memcmp(got.logits.data(), want.logits.data(), got.logits.size() * sizeof(float)) == 0);
}

struct Golden {
  std::vector<int32_t> prompt, new_tokens;
  int64_t max_new = 0;
  std::vector<float> scores;  // [steps, V]; empty when the goldens have none (real vocabulary)
};

Golden golden(const std::string& model, const std::string& name) {
  const auto dir = opt_test::fixture_dir(model);
  json g = opt_test::read_json(dir / "goldens.json");
  for (auto& cs : g["cases"])
    if (cs["name"] == name) {
      Golden out;
      out.prompt = cs["prompts"][0].get<std::vector<int32_t>>();
      out.new_tokens = cs["generate"]["new_tokens"][0].get<std::vector<int32_t>>();
      out.max_new = cs["generate"]["max_new_tokens"].get<int64_t>();
      if (cs["generate"].contains("scores")) out.scores = opt_test::read_f32(dir, cs["generate"]["scores"]);
      return out;
    }
  FAIL("no case " << name << " in " << model);
  return {};
}

// The logits of a run against HF's scores (within 1e-4), up to its first EOS as the goldens' new tokens.
void check_golden(const Run& r, const Golden& g, int64_t vocab) {
  REQUIRE(r.ids.size() <= g.new_tokens.size());
  CHECK(r.ids == std::vector<int32_t>(g.new_tokens.begin(), g.new_tokens.begin() + int64_t(r.ids.size())));
  if (g.scores.empty()) return;
  float worst = 0;
  for (size_t i = 0; i < r.logits.size(); ++i) worst = std::max(worst, std::abs(r.logits[i] - g.scores[i]));
  CHECK(r.logits.size() <= g.scores.size());
  CHECK_MESSAGE(worst <= 1e-4f, "max |logit - golden| = " << worst << " over " << r.ids.size() << " steps of "
                                                          << vocab);
}

std::shared_ptr<opt::PrefixCache> cache_for(const opt::Model& m, int64_t block, size_t budget = size_t(1) << 30) {
  return std::make_shared<opt::PrefixCache>(m, budget, block);
}

}  // namespace

TEST_CASE("a cache hit gives the cold run's tokens and logits bit for bit, and the goldens") {
  const std::vector<std::pair<const char*, const char*>> cases = {
      {"opt-tiny-preln", "single"}, {"opt-tiny-preln", "single_maxpos"}, {"opt-tiny-odd", "single"},
      {"opt-tiny-odd", "single_eos_stop"}, {"opt-tiny-realvocab", "single"}};
  for (auto [model, name] : cases) {
    INFO(model << " " << name);
    opt::Model m = opt::Model::load(opt_test::fixture_dir(model));
    const Golden g = golden(model, name);
    const Run want = cold(m, g.prompt, g.max_new);
    check_golden(want, g, m.config().vocab_size);
    for (int64_t block : {1, 2, 3, 4, 16}) {
      INFO("block " << block);
      opt::Batch b(m, 1);
      b.set_prefix_cache(cache_for(m, block));
      const Run first = generate(b, {g.prompt}, g.max_new)[0];  // a miss; stores the prompt
      const opt::PrefixCacheStats s0 = b.prefix_cache()->stats();
      CHECK(s0.misses == 1);
      CHECK(s0.hits == 0);
      CHECK(s0.blocks == g.prompt.size() / size_t(block));
      const Run again = generate(b, {g.prompt}, g.max_new)[0];  // the whole prompt but its last block cached
      const opt::PrefixCacheStats s1 = b.prefix_cache()->stats();
      const int64_t reusable = (int64_t(g.prompt.size()) - 1) / block * block;
      CHECK(s1.hits == (reusable > 0 ? 1u : 0u));
      CHECK(s1.hit_tokens == uint64_t(reusable));
      CHECK(s1.blocks == s0.blocks);  // nothing stored twice
      check_same(first, want);
      check_same(again, want);
      check_golden(again, g, m.config().vocab_size);
    }
  }
}

TEST_CASE("partial, block-boundary and off-by-one prefixes") {
  opt::Model m = opt::Model::load(opt_test::fixture_dir("opt-tiny-preln"));
  const std::vector<int32_t> base = golden("opt-tiny-preln", "single_maxpos").prompt;  // 56 tokens
  const int64_t B = 4, L = 21;  // the stored prompt: 21 tokens, 5 whole blocks (20 positions)
  const std::vector<int32_t> stored(base.begin(), base.begin() + L);
  for (int64_t shared : {1, 3, 4, 5, 7, 8, 9, 12, 19, 20, 21})
    for (int64_t len : {shared, shared + 1, shared + 3, int64_t(30)}) {
      if (len < 1 || len < shared) continue;
      INFO("shared " << shared << " of a " << len << "-token prompt");
      std::vector<int32_t> q(base.begin(), base.begin() + len);
      if (len > shared) q[size_t(shared)] = (q[size_t(shared)] + 1) % 512;  // differs from token `shared` on
      opt::Batch b(m, 1);
      b.set_prefix_cache(cache_for(m, B));
      generate(b, {stored}, 1);
      const Run got = generate(b, {q}, 4)[0];
      const int64_t common = std::min({shared, L, len - 1});  // the prompt's last token is always computed
      CHECK(b.prefix_cache()->stats().hit_tokens == uint64_t(std::min(common / B * B, L / B * B)));
      check_same(got, cold(m, q, 4));
    }
}

TEST_CASE("several sequences share a prefix at once; two newcomers with one prompt store it once") {
  opt::Model m = opt::Model::load(opt_test::fixture_dir("opt-tiny-odd"));
  const std::vector<int32_t> p = golden("opt-tiny-odd", "single").prompt;  // 8 tokens
  std::vector<int32_t> longer = p;
  for (int32_t t : {5, 77, 123, 9, 42}) longer.push_back(t);
  std::vector<int32_t> other = longer;
  other.back() = 43;
  std::vector<int32_t> fresh = {2, 250, 251, 252, 253, 254, 255};
  opt::Batch b(m, 1);
  b.set_prefix_cache(cache_for(m, 2));
  // together, before anything is cached: both miss, the blocks are stored once
  auto first = generate(b, {longer, longer}, 6);
  CHECK(b.prefix_cache()->stats().misses == 2);
  CHECK(b.prefix_cache()->stats().blocks == longer.size() / 2);
  const std::vector<std::vector<int32_t>> prompts = {p, longer, other, fresh, longer};
  auto got = generate(b, prompts, 6);
  const opt::PrefixCacheStats s = b.prefix_cache()->stats();
  CHECK(s.hits == 4);
  CHECK(s.misses == 3);
  CHECK(s.hit_tokens == uint64_t(6 + 12 + 12 + 12));
  for (size_t i = 0; i < prompts.size(); ++i) check_same(got[i], cold(m, prompts[i], 6));
  check_same(first[0], cold(m, longer, 6));
  check_same(first[1], first[0]);
}

TEST_CASE("seeded sampling from a cached prefix draws what it draws cold") {
  opt::Model m = opt::Model::load(opt_test::fixture_dir("opt-tiny-preln"));
  const std::vector<int32_t> p = golden("opt-tiny-preln", "single_maxpos").prompt;
  auto sample = [&](opt::Batch& b) {
    opt::SequenceOptions so;
    so.max_new_tokens = 8;
    so.sampling.do_sample = true;
    so.sampling.temperature = 0.9f;
    so.sampling.top_k = 50;
    so.sampling.seed = 11;
    const opt::SeqId id = b.add(p, so);
    while (!b.empty()) b.step();
    const std::vector<int32_t> out = b.new_tokens(id);
    b.release(id);
    return out;
  };
  opt::Batch plain(m, 1), b(m, 1);
  b.set_prefix_cache(cache_for(m, 8));
  const std::vector<int32_t> want = sample(plain);
  CHECK(sample(b) == want);
  CHECK(sample(b) == want);
  CHECK(b.prefix_cache()->stats().hit_tokens == 48);
}

TEST_CASE("the budget holds, the least recently used block goes first, and answers survive evictions") {
  opt::Model m = opt::Model::load(opt_test::fixture_dir("opt-tiny-preln"));
  const std::vector<int32_t> base = golden("opt-tiny-preln", "single_maxpos").prompt;
  auto prompt = [&](int32_t first) {  // 9 tokens: 2 blocks of 4
    std::vector<int32_t> p(base.begin(), base.begin() + 9);
    p[1] = first;
    return p;
  };
  const std::vector<int32_t> A = prompt(10), Bp = prompt(11), C = prompt(12);
  auto cache = cache_for(m, 4);
  const size_t block = cache->block_bytes(opt::dtype::F32);
  CHECK(block == 4 * opt::KvCache::bytes_per_token(m.config()));
  cache->set_budget(4 * block);
  opt::Batch b(m, 1);
  b.set_prefix_cache(cache);
  generate(b, {A}, 1);
  generate(b, {Bp}, 1);
  CHECK(cache->stats().bytes == 4 * block);
  CHECK(cache->stats().evictions == 0);
  const Run a = generate(b, {A}, 3)[0];  // A is now more recent than B
  CHECK(cache->stats().hit_tokens == 8);
  generate(b, {C}, 1);  // evicts B's two blocks, the leaf first
  opt::PrefixCacheStats s = cache->stats();
  CHECK(s.evictions == 2);
  CHECK(s.bytes == 4 * block);
  CHECK(s.bytes <= s.budget);
  const uint64_t before = s.hit_tokens;
  const Run bb = generate(b, {Bp}, 3)[0];  // a miss: B was evicted (and B's blocks come back, evicting A)
  CHECK(cache->stats().hit_tokens == before);
  check_same(bb, cold(m, Bp, 3));
  check_same(a, cold(m, A, 3));
  generate(b, {C}, 1);
  CHECK(cache->stats().hit_tokens == before + 8);  // C survived: A went when B came back
  const Run after = generate(b, {A}, 3)[0];
  check_same(after, a);
  CHECK(cache->stats().bytes <= 4 * block);
  // a smaller budget evicts at once, a leaf before its parent; 0 empties the cache
  cache->set_budget(3 * block);
  CHECK(cache->stats().bytes == 3 * block);  // C's leaf went (A is more recent)
  check_same(generate(b, {A}, 3)[0], a);
  CHECK(cache->stats().hit_tokens == before + 16);  // A whole
  cache->set_budget(0);
  CHECK(cache->stats().bytes == 0);
  CHECK(cache->stats().blocks == 0);
}

TEST_CASE("a budget below one block stores nothing; partial room stores the chain's first blocks") {
  opt::Model m = opt::Model::load(opt_test::fixture_dir("opt-tiny-preln"));
  const std::vector<int32_t> p = golden("opt-tiny-preln", "single_maxpos").prompt;
  const Run want = cold(m, p, 4);
  for (size_t budget : {size_t(0), size_t(1)}) {
    auto cache = cache_for(m, 4, budget);
    cache->set_budget(budget == 0 ? 0 : cache->block_bytes(opt::dtype::F32) - 1);
    opt::Batch b(m, 1);
    b.set_prefix_cache(cache);
    check_same(generate(b, {p}, 4)[0], want);
    check_same(generate(b, {p}, 4)[0], want);
    CHECK(cache->stats().misses == 2);
    CHECK(cache->stats().bytes == 0);
    CHECK(cache->stats().evictions == 0);
  }
  auto cache = cache_for(m, 4, 0);
  cache->set_budget(3 * cache->block_bytes(opt::dtype::F32) + 100);
  opt::Batch b(m, 1);
  b.set_prefix_cache(cache);
  generate(b, {p}, 1);
  CHECK(cache->stats().blocks == 3);
  CHECK(cache->stats().evictions == 0);
  check_same(generate(b, {p}, 4)[0], want);
  CHECK(cache->stats().hit_tokens == 12);
}

TEST_CASE("F16 and BF16 KV caches: hits are exact, and never cross element types") {
  opt::Model m = opt::Model::load(opt_test::fixture_dir("opt-tiny-preln"));
  const std::vector<int32_t> p = golden("opt-tiny-preln", "single_maxpos").prompt;
  auto cache = cache_for(m, 4);
  opt::Batch b(m, 1);
  b.set_prefix_cache(cache);
  generate(b, {p}, 1, opt::dtype::F32);
  const size_t f32_bytes = cache->stats().bytes;
  CHECK(f32_bytes == 14 * cache->block_bytes(opt::dtype::F32));
  for (opt::dtype t : {opt::dtype::F16, opt::dtype::BF16}) {
    INFO(opt::to_string(t));
    CHECK(cache->block_bytes(t) * 2 == cache->block_bytes(opt::dtype::F32));
    const Run want = cold(m, p, 6, t);
    const uint64_t hits = cache->stats().hits;
    const Run first = generate(b, {p}, 6, t)[0];  // the F32 blocks are not for it
    CHECK(cache->stats().hits == hits);
    const Run again = generate(b, {p}, 6, t)[0];
    CHECK(cache->stats().hits == hits + 1);
    check_same(first, want);
    check_same(again, want);
  }
  CHECK(cache->stats().bytes == f32_bytes * 2);  // F32 + F16 + BF16 blocks of the same prompt
  const uint64_t hit_tokens = cache->stats().hit_tokens;
  check_same(generate(b, {p}, 6)[0], cold(m, p, 6));
  CHECK(cache->stats().hit_tokens == hit_tokens + 52);
}

TEST_CASE("a cache serves its own model only; two batches of one model share it") {
  opt::Model a = opt::Model::load(opt_test::fixture_dir("opt-tiny-preln"));
  opt::Model a2 = opt::Model::load(opt_test::fixture_dir("opt-tiny-preln-fp16"));  // the same shape
  auto cache = cache_for(a, 4);
  opt::Batch other(a2, 1);
  opt_test::check_throws<opt::input_error>([&] { other.set_prefix_cache(cache); },
                                           {"Batch::set_prefix_cache", "another model"});
  CHECK(!other.prefix_cache());
  const std::vector<int32_t> p = golden("opt-tiny-preln", "single").prompt;
  opt::Batch b1(a, 1), b2(a, 1);
  b1.set_prefix_cache(cache);
  b2.set_prefix_cache(cache);
  generate(b1, {p}, 2);
  check_same(generate(b2, {p}, 5)[0], cold(a, p, 5));
  CHECK(cache->stats().hits == 1);
  // opting out per sequence, and no cache at all
  opt::SequenceOptions so;
  so.prefix_cache = false;
  so.max_new_tokens = 2;
  b2.release(b2.add(p, so));
  CHECK(cache->stats().hits == 1);
  CHECK(cache->stats().misses == 1);
  b2.set_prefix_cache(nullptr);
  check_same(generate(b2, {p}, 5)[0], cold(a, p, 5));
  CHECK(cache->stats().misses == 1);
}

TEST_CASE("speculating sequences: hits are exact and only prompt positions are stored") {
  opt::Model m = opt::Model::load(opt_test::fixture_dir("opt-tiny-preln"));
  std::vector<int32_t> p = golden("opt-tiny-preln", "single").prompt;  // 8 tokens, repeated: lookup proposes
  p.insert(p.end(), p.begin() + 1, p.end());
  p.push_back(p[1]);  // 16 tokens
  opt::SpeculativeStats st;
  auto spec = opt::speculation(std::make_shared<opt::PromptLookupDrafter>(2), {}, &st);
  const Run want = cold(m, p, 12);
  for (int64_t block : {3, 5, 8}) {
    INFO("block " << block);
    opt::Batch b(m, 1);
    auto cache = cache_for(m, block);
    b.set_prefix_cache(cache);
    const Run first = generate(b, {p}, 12, opt::dtype::F32, spec)[0];
    CHECK(cache->stats().blocks == p.size() / size_t(block));  // the prompt's blocks, nothing generated
    const Run again = generate(b, {p}, 12, opt::dtype::F32, spec)[0];
    check_same(first, want);
    check_same(again, want);
    // the prompt followed by what was generated: only the prompt's blocks are there
    std::vector<int32_t> cont = p;
    cont.insert(cont.end(), want.ids.begin(), want.ids.end());
    const uint64_t before = cache->stats().hit_tokens;
    check_same(generate(b, {cont}, 3)[0], cold(m, cont, 3));
    CHECK(cache->stats().hit_tokens - before == uint64_t(int64_t(p.size()) / block * block));
  }
  CHECK(st.proposed > 0);
}

TEST_CASE("bad input") {
  opt::Model m = opt::Model::load(opt_test::fixture_dir("opt-tiny-preln"));
  for (int64_t bad : {int64_t(0), int64_t(-3), int64_t(65)})
    opt_test::check_throws<opt::input_error>([&] { (void)opt::PrefixCache(m, 1 << 20, bad); },
                                             {"PrefixCache", "block_tokens = " + std::to_string(bad), "1 .. 64"});
  opt::PrefixCache c(m, 1 << 20, 64);  // a block of the whole context: never a hit (a token is always left)
  opt::Model odd = opt::Model::load(opt_test::fixture_dir("opt-tiny-odd"));
  opt::KvCache wrong(odd.config());
  const std::vector<int32_t> ids(64, 5);
  opt_test::check_throws<opt::input_error>([&] { c.load(ids.data(), 64, 63, wrong); },
                                           {"PrefixCache::load", "3 layers", "expected the model's 2"});
  opt_test::check_throws<opt::input_error>([&] { c.store(ids.data(), 1, wrong); }, {"PrefixCache::store"});
  opt::KvCache kv(m.config());
  opt_test::check_throws<opt::input_error>([&] { c.store(ids.data(), 1, kv); },
                                           {"PrefixCache::store", "1 positions of a KV cache holding 0"});
  opt::Workspace ws(1);
  m.forward({{&kv, ids.data(), 64}}, ws);
  c.store(ids.data(), 64, kv);
  CHECK(c.stats().blocks == 1);
  opt_test::check_throws<opt::input_error>([&] { c.load(ids.data(), 64, 64, kv); },
                                           {"PrefixCache::load", "holds 64 positions, expected an empty one"});
  opt::KvCache fresh(m.config());
  CHECK(c.load(ids.data(), 64, 63, fresh) == 0);
  CHECK(c.load(ids.data(), 64, 64, fresh) == 64);  // the host's own call may take it all
  CHECK(fresh.size() == 64);
  opt::KvCache small(m.config(), 10);
  CHECK(c.load(ids.data(), 64, 64, small) == 0);  // no room for a block
  CHECK(c.stats().hits == 1);
  CHECK(c.stats().misses == 2);
}
