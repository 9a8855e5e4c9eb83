// The larger OPT shapes, which have no goldens here: the properties that need none, at their real widths, head
// counts and head sizes (opt-350m's post-LN with projections, head_dim 64 at 1.3b, 80 at 2.7b, 128 from 13b on).
// Random weights (opt::write_random_checkpoint), one or two layers and a 512-token vocabulary, so a model stays
// within a few hundred MB; what those cut is repetition, not a kind of computation:
// - f32 and bf16 checkpoints of the same weights agree within bf16's rounding error;
// - logits are bitwise the same alone or in a batch, in the prompt pass or step by step, on 1 or 2 threads;
// - every instruction set this machine runs gives the same bits.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <opt/kernels/dispatch.hpp>
#include <opt/model.hpp>
#include <opt/random_checkpoint.hpp>
#include <string>
#include <vector>

#include "shared.hpp"

namespace fs = std::filesystem;

namespace {

using Logits = std::vector<float>;

struct Shape {
  const char* name;  // the published shape whose widths it keeps
  int64_t layers;
  int64_t ffn;  // 0: the shape's own
};

// opt-13b's 40 heads of 128 at hidden 5120, with a narrower FFN (its 20480 would make the layer 1.3 GB in f32).
const Shape kShapes[] = {{"opt-350m", 2, 0}, {"opt-1.3b", 1, 0}, {"opt-2.7b", 1, 0}, {"opt-13b", 1, 5120}};

opt::Config config_of(const Shape& s) {
  opt::Config c = opt::opt_shape(s.name);
  c.num_hidden_layers = s.layers;
  if (s.ffn) c.ffn_dim = s.ffn;
  c.vocab_size = 512;
  c.max_position_embeddings = 64;
  return c;
}

fs::path write(const Shape& s, opt::dtype t) {
  const fs::path dir = fs::temp_directory_path() / ("opt-test-shapes-" + std::to_string(::getpid()) + "-" +
                                                    std::string(s.name) + "-" + opt::to_string(t));
  opt::RandomCheckpointOptions o;
  o.type = t;
  o.seed = 7;
  opt::write_random_checkpoint(dir, config_of(s), o);
  return dir;
}

const std::vector<std::vector<int32_t>> kRows = {{2, 11, 12, 13, 14, 15, 16, 17, 18}, {2, 40, 41}, {2, 300, 301, 302, 303}};

// All logits of kRows[0], run alone (or with the other rows in one batch).
Logits run(const opt::Model& m, opt::Workspace& ws, bool batched) {
  std::vector<opt::KvCache> caches;
  std::vector<opt::SequenceChunk> chunks;
  const size_t n = batched ? kRows.size() : 1;
  for (size_t b = 0; b < n; ++b) caches.emplace_back(m.config(), 16);
  for (size_t b = 0; b < n; ++b) chunks.push_back({&caches[b], kRows[b].data(), int64_t(kRows[b].size())});
  opt::ForwardOptions fo;
  fo.all_logits = true;
  const opt::LogitsView lv = m.forward(chunks, ws, fo);
  return Logits(lv.data, lv.data + int64_t(kRows[0].size()) * lv.cols);
}

// The same logits computed step by step from the cache after a 3-token prompt pass.
Logits steps(const opt::Model& m, opt::Workspace& ws) {
  const auto& row = kRows[0];
  opt::KvCache kv(m.config(), 16);
  opt::ForwardOptions fo;
  fo.all_logits = true;
  opt::LogitsView lv = m.forward({{&kv, row.data(), 3}}, ws, fo);
  Logits out(lv.data, lv.data + 3 * lv.cols);
  for (size_t t = 3; t < row.size(); ++t) {
    lv = m.forward({{&kv, row.data() + t, 1}}, ws);
    out.insert(out.end(), lv.row(0), lv.row(0) + lv.cols);
  }
  return out;
}

}  // namespace

TEST_CASE("larger shapes: batch, step, thread and ISA invariance; f32 and bf16 agree within bf16's error") {
  const opt::kernels::isa best = opt::kernels::active_isa();
  for (const Shape& s : kShapes) {
    INFO(std::string(s.name));
    const opt::Config c = config_of(s);
    const bool f32_too = c.hidden_size <= 2560;  // the hidden-5120 layer stays bf16 only (315 MB)
    const fs::path bf = write(s, opt::dtype::BF16);
    const opt::Model m = opt::Model::load(bf);
    CHECK(m.config().hidden_size == c.hidden_size);
    CHECK(m.config().num_attention_heads == c.num_attention_heads);
    opt::Workspace ws1(1), ws2(2);
    const Logits ref = run(m, ws2, false);
    REQUIRE(ref.size() == kRows[0].size() * size_t(c.vocab_size));
    CHECK(std::all_of(ref.begin(), ref.end(), [](float v) { return std::isfinite(v); }));
    CHECK(run(m, ws2, true) == ref);
    CHECK(run(m, ws1, false) == ref);
    CHECK(run(m, ws1, true) == ref);
    CHECK(steps(m, ws2) == ref);
    for (opt::kernels::isa i : opt::kernels::available_isas()) {
      INFO("isa " << opt::kernels::to_string(i));
      opt::kernels::set_isa(i);
      CHECK(run(m, ws2, true) == ref);
      CHECK(steps(m, ws1) == ref);
    }
    opt::kernels::set_isa(best);
    if (f32_too) {
      const fs::path fp = write(s, opt::dtype::F32);
      const opt::Model f = opt::Model::load(fp);
      const Logits lf = run(f, ws2, false);
      double err = 0, mag = 0;
      for (size_t i = 0; i < lf.size(); ++i) {
        err = std::max(err, double(std::fabs(lf[i] - ref[i])));
        mag = std::max(mag, double(std::fabs(lf[i])));
      }
      MESSAGE(std::string(s.name) << ": f32 vs bf16 weights, max |logit error| " << err << " of max |logit| " << mag);
      // bf16 keeps 8 significant bits (relative error <= 2^-9 a weight); over hidden-size sums of random-sign
      // products the logits' error grows like sqrt(K) of that, measured 0.45-0.7% of the largest logit
      CHECK(mag > 0.1);
      CHECK(err < 0.02 * mag);
      CHECK(err > 0);  // the two really are different weights
      fs::remove_all(fp);
    }
    fs::remove_all(bf);
  }
}
