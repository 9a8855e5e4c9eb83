// What the kernels promise, checked end to end on the fixture models: logits are bitwise identical whatever the
// thread count, whether a row runs alone or in a batch with other rows, and whether a token is computed in the
// prompt pass or step by step from the cache (batch invariance), with an F32, F16 or BF16 KV cache; and a decode
// step allocates nothing (Model::forward, Batch::step, Batch::compute + accept, generate), once the first step has
// sized the buffers.
// The operator new/delete replacements below pair with malloc/free, which GCC cannot see.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
#include <atomic>
#include <cstdlib>
#include <new>
#include <opt/batch.hpp>
#include <opt/generate.hpp>
#include <opt/model.hpp>

#include "shared.hpp"

namespace {
std::atomic<long> g_allocs{0};
}  // namespace

// Counting replacements of the global operator new/delete (GCC cannot see that they pair up with malloc/free).
void* operator new(std::size_t n) {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void* operator new(std::size_t n, std::align_val_t al) {  // the Workspace's 64-byte aligned buffers
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  const std::size_t a = std::size_t(al);
  if (void* p = std::aligned_alloc(a, (n + a - 1) / a * a)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
// Every other form too, so that nothing pairs a sanitizer's operator new with our free (ASan checks the pairs).
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new[](std::size_t n, std::align_val_t al) { return operator new(n, al); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void* operator new(std::size_t n, std::align_val_t al, const std::nothrow_t&) noexcept {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  const std::size_t a = std::size_t(al);
  return std::aligned_alloc(a, (n + a - 1) / a * a);
}
void* operator new[](std::size_t n, std::align_val_t al, const std::nothrow_t& t) noexcept { return operator new(n, al, t); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }

namespace {

using Logits = std::vector<float>;

Logits run(const opt::Model& m, opt::Workspace& ws, const std::vector<std::vector<int32_t>>& rows, size_t pick,
           std::vector<opt::KvCache>& caches) {
  std::vector<opt::SequenceChunk> chunks;
  for (size_t b = 0; b < rows.size(); ++b) chunks.push_back({&caches[b], rows[b].data(), int64_t(rows[b].size())});
  opt::ForwardOptions fo;
  fo.all_logits = true;
  opt::LogitsView lv = m.forward(chunks, ws, fo);
  int64_t r0 = 0;
  for (size_t b = 0; b < pick; ++b) r0 += int64_t(rows[b].size());
  return Logits(lv.row(r0), lv.row(r0) + int64_t(rows[pick].size()) * lv.cols);
}

}  // namespace

TEST_CASE("batch invariance: alone == in a batch == step by step, for 1 and 2 threads, F32, F16 and BF16 caches") {
  for (const char* name : {"opt-tiny-odd", "opt-tiny-postln-proj", "opt-tiny-preln-bf16", "opt-tiny-gelu-nobias",
                           "opt-tiny-nofinalln-silu"}) {
    INFO(name);
    opt::Model m = opt::Model::load(opt_test::fixture_dir(name));
    const std::vector<std::vector<int32_t>> rows = {{2, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}, {2, 40, 41}, {2, 7, 8, 9, 10, 11}};
    const auto& row = rows[0];
    Logits alone_1;  // 1 thread's, per cache type
    for (opt::dtype kvt : {opt::dtype::F32, opt::dtype::F16, opt::dtype::BF16})
    for (size_t threads : {1, 2}) {
      INFO(std::string(opt::to_string(kvt)) << " cache, " << threads << " threads");
      opt::Workspace ws(threads);
      std::vector<opt::KvCache> c1, c3;
      c1.emplace_back(m.config(), 0, kvt);
      for (int i = 0; i < 3; ++i) c3.emplace_back(m.config(), 0, kvt);
      Logits alone = run(m, ws, {row}, 0, c1);
      Logits batched = run(m, ws, rows, 0, c3);
      CHECK(alone == batched);
      if (threads == 1) alone_1 = alone;
      else CHECK(alone == alone_1);
      // step by step: the prompt pass of the first 3 tokens, then one token at a time
      opt::KvCache kv(m.config(), 0, kvt);
      opt::ForwardOptions fo;
      fo.all_logits = true;
      opt::LogitsView lv = m.forward({{&kv, row.data(), 3}}, ws, fo);
      Logits steps(lv.data, lv.data + 3 * lv.cols);
      for (size_t t = 3; t < row.size(); ++t) {
        lv = m.forward({{&kv, row.data() + t, 1}}, ws);
        steps.insert(steps.end(), lv.row(0), lv.row(0) + lv.cols);
      }
      CHECK(steps == alone);
    }
  }
}

TEST_CASE("a decode step does not allocate") {
  opt::Model m = opt::Model::load(opt_test::fixture_dir("opt-tiny-preln"));
  for (opt::dtype kvt : {opt::dtype::F32, opt::dtype::F16}) {
  INFO(std::string(opt::to_string(kvt)) << " cache");
  opt::Workspace ws(2);
  std::vector<opt::KvCache> kv;
  for (int i = 0; i < 4; ++i) kv.emplace_back(m.config(), 32, kvt);
  std::vector<int32_t> ids = {2, 5, 6, 7};
  std::vector<opt::SequenceChunk> prompt, step;
  for (int i = 0; i < 4; ++i) {
    prompt.push_back({&kv[size_t(i)], ids.data(), 4});
    step.push_back({&kv[size_t(i)], ids.data() + i, 1});
  }
  m.forward(prompt, ws);
  m.forward(step, ws);  // the first step may size the workspace
  const long before = g_allocs.load();
  for (int s = 0; s < 5; ++s) m.forward(step, ws);
  CHECK(g_allocs.load() - before == 0);
  }
}

TEST_CASE("Batch::step and compute + accept do not allocate after the first decode step") {
  opt::Model m = opt::Model::load(opt_test::fixture_dir("opt-tiny-preln"));
  for (bool sampling : {false, true}) {
    CAPTURE(sampling);
    opt::Workspace ws(2);
    opt::Batch batch(m, ws);
    opt::SequenceOptions so;
    so.max_new_tokens = 12;
    so.stop_at_eos = false;
    if (sampling) {  // every warper
      so.sampling.do_sample = true;
      so.sampling.temperature = 0.8f;
      so.sampling.top_k = 20;
      so.sampling.top_p = 0.9f;
      so.sampling.repetition_penalty = 1.3f;
      so.sampling.seed = 7;
    }
    for (int i = 0; i < 3; ++i) batch.add({2, 5 + i, 6, 7, 8 + i}, so);
    batch.step();  // the prompts
    batch.step();  // the first decode step may size the workspace
    const long before = g_allocs.load();
    size_t tokens = 0;
    for (int s = 0; s < 4; ++s) tokens += batch.step().size();
    for (int s = 0; s < 4; ++s)
      for (const opt::SeqLogits& l : batch.compute()) {
        batch.accept(l.seq, batch.choose(l));
        ++tokens;
      }
    CHECK(g_allocs.load() - before == 0);
    CHECK(tokens == 3 * 8);
  }
}

TEST_CASE("generate does not allocate after the first decode step") {
  opt::Model m = opt::Model::load(opt_test::fixture_dir("opt-tiny-preln"));
  opt::Workspace ws(2);
  const std::vector<std::vector<int32_t>> prompts = {{2, 5, 6, 7}, {2, 9}, {2, 11, 12, 13, 14, 15}};
  const size_t B = prompts.size();
  opt::GenerateOptions o;
  o.max_new_tokens = 10;
  o.stop_at_eos = false;
  std::vector<long> at;  // the counter at each on_token call (reserved: the callback itself allocates nothing)
  at.reserve(B * size_t(o.max_new_tokens));
  o.on_token = [&](size_t, int32_t) {
    at.push_back(g_allocs.load());
    return true;
  };
  (void)opt::generate_ids(m, prompts, o, ws);
  REQUIRE(at.size() == B * size_t(o.max_new_tokens));
  // calls 0..B-1 follow the prompt pass, B..2B-1 the first decode step; from then on nothing may allocate
  CHECK(at.back() - at[2 * B - 1] == 0);
}
