// int8 and int4 weight-only quantization: the per-weight error bounds, the kernels against opt::ref::linear_q8 /
// linear_q4, and the end-to-end error of int8 and int4 models against the f32 one on the shared fixtures (max logit
// error, greedy agreement), reported with MESSAGE.
#include <opt/generate.hpp>
#include <opt/ops_ref.hpp>
#include <opt/quantize.hpp>
#include <random>

#include "shared.hpp"

TEST_CASE("quantize_int8: error per weight <= scale / 2, scale = max|block| / 127") {
  std::mt19937 g(1);
  std::normal_distribution<float> d(0, 0.02f);
  const int64_t R = 5, K = 300;  // 3 blocks of 128, the last one partial
  std::vector<float> w(size_t(R * K));
  for (auto& v : w) v = d(g);
  w[7] = 0.5f;  // an outlier only affects its own block
  opt::QuantizedMatrix q = opt::quantize_int8({opt::dtype::F32, w.data(), R, K});
  REQUIRE(q.scale.size() == size_t(R * 3));
  std::vector<float> back(static_cast<size_t>(K));
  for (int64_t r = 0; r < R; ++r) {
    opt::ops::row_to_f32(q.ref(), r, back.data());
    for (int64_t k = 0; k < K; ++k) {
      const float s = q.scale[size_t(r * 3 + k / 128)];
      CHECK(std::fabs(back[size_t(k)] - w[size_t(r * K + k)]) <= s * 0.5f * (1 + 1e-6f));
    }
  }
  CHECK(q.scale[0] == doctest::Approx(0.5f / 127));
  CHECK(q.scale[1] < 0.1f / 127);
  // the kernel computes with exactly these values
  std::vector<float> x(size_t(2 * K)), y(size_t(2 * R)), want(size_t(2 * R));
  for (auto& v : x) v = d(g) * 50;
  opt::ThreadPool pool(2);
  opt::ops::linear(pool, x.data(), 2, opt::ops::pack(q.ref()).view(), nullptr, y.data());
  opt::ref::linear_q8(x.data(), 2, q.q.data(), q.scale.data(), q.block, R, K, nullptr, want.data());
  for (size_t i = 0; i < y.size(); ++i) CHECK(std::fabs(y[i] - want[i]) <= 1e-5);
}

TEST_CASE("quantize_int4: error per weight <= |scale| / 2, the block's extreme exact, all-zero blocks, every ISA") {
  std::mt19937 g(2);
  std::normal_distribution<float> d(0, 0.02f);
  // 37 rows: every lane of a panel, and a partial last panel; odd K: a half-used last byte
  const int64_t R = 37, K = 301, B = opt::ops::kQ4Block, nb = (K + B - 1) / B;
  std::vector<float> w(size_t(R * K));
  for (auto& v : w) v = d(g);
  w[7] = 0.5f;                                                   // an outlier only affects its own block
  for (int64_t k = B; k < 2 * B; ++k) w[size_t(K + k)] = 0.0f;  // row 1, block 1: all zero
  w[size_t(2 * K + 3)] = -0.3f, w[size_t(2 * K + 4)] = 0.3f;     // row 2: a tie of magnitude (0.3 clamped to 7)
  opt::QuantizedMatrix q = opt::quantize_int4({opt::dtype::F32, w.data(), R, K});
  REQUIRE(q.type == opt::dtype::I4);
  REQUIRE(q.scale.size() == size_t(R * nb));
  REQUIRE(q.q.size() == size_t(R * ((K + 1) / 2)));
  std::vector<float> back(static_cast<size_t>(K));
  size_t clamped = 0;
  for (int64_t r = 0; r < R; ++r) {
    opt::ops::row_to_f32(q.ref(), r, back.data());
    for (int64_t k = 0; k < K; ++k) {
      const float ss = q.scale[size_t(r * nb + k / B)], s = std::fabs(ss), x = w[size_t(r * K + k)];
      const float err = std::fabs(back[size_t(k)] - x);
      if (err <= s * 0.5f * (1 + 1e-6f)) continue;
      // the only exception: weights of the extreme's other sign beyond 15/16 of its magnitude, rounded to +8 and
      // clamped to 7
      ++clamped;
      CHECK(err <= s * (1 + 1e-6f));
      CHECK(x / ss >= 7.5f * (1 - 1e-6f));
    }
    // the last byte's unused high nibble holds q = 0
    CHECK((uint8_t(q.q[size_t(r * ((K + 1) / 2) + K / 2)]) >> 4) == 8);
  }
  CHECK(clamped >= 1);  // row 2's 0.3 at least
  // an odd block size (blocks sharing a byte) keeps the same bound
  {
    const opt::QuantizedMatrix q7 = opt::quantize_int4({opt::dtype::F32, w.data(), R, K}, nullptr, 7);
    const int64_t nb7 = (K + 6) / 7;
    bool ok = true;
    for (int64_t r = 0; r < R; ++r) {
      opt::ops::row_to_f32(q7.ref(), r, back.data());
      for (int64_t k = 0; k < K; ++k) {
        const float ss = q7.scale[size_t(r * nb7 + k / 7)], x = w[size_t(r * K + k)];
        const float err = std::fabs(back[size_t(k)] - x), s = std::fabs(ss);
        ok = ok && (err <= s * 0.5f * (1 + 1e-6f) || (err <= s * (1 + 1e-6f) && x / ss >= 7.5f * (1 - 1e-6f)));
      }
    }
    CHECK(ok);
  }
  CHECK(q.scale[0] == -0.5f / 8);  // s = -extreme / 8: the extreme is q = -8 exactly
  opt::ops::row_to_f32(q.ref(), 0, back.data());
  CHECK(back[7] == 0.5f);
  CHECK(std::fabs(q.scale[1]) < 0.1f / 8);
  CHECK(q.scale[size_t(nb + 1)] == 1.0f);  // all-zero block: scale 1, every q = 0
  opt::ops::row_to_f32(q.ref(), 1, back.data());
  for (int64_t k = B; k < 2 * B; ++k) CHECK(back[size_t(k)] == 0.0f);
  // the kernel computes with exactly these values (GEMV and GEMM), on every ISA, with the same bits
  std::vector<float> x(size_t(7 * K)), want(size_t(7 * R));
  for (auto& v : x) v = d(g) * 50;
  opt::ThreadPool pool(2);
  const opt::PackedWeights packed = opt::ops::pack(q.ref());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t k = 0; k < K; ++k) {
      opt::ops::row_to_f32(q.ref(), r, back.data());
      REQUIRE(opt::ops::packed_element(packed.view(), r, k) == back[size_t(k)]);
    }
  opt::ref::linear_q4(x.data(), 7, reinterpret_cast<const uint8_t*>(q.q.data()), q.scale.data(), q.block, R, K,
                      nullptr, want.data());
  const opt::kernels::isa was = opt::kernels::active_isa();
  std::vector<float> first;
  for (opt::kernels::isa i : opt::kernels::available_isas()) {
    INFO("isa " << opt::kernels::to_string(i));
    opt::kernels::set_isa(i);
    opt::QuantizedMatrix qi = opt::quantize_int4({opt::dtype::F32, w.data(), R, K}, &pool);
    CHECK(qi.scale == q.scale);
    CHECK(std::equal(qi.q.begin(), qi.q.end(), q.q.begin()));
    for (int64_t n : {1, 7}) {
      std::vector<float> y(size_t(n * R));
      opt::ops::linear(pool, x.data(), n, packed.view(), nullptr, y.data());
      for (size_t j = 0; j < y.size(); ++j) CHECK(std::fabs(y[j] - want[j]) <= 1e-5);
      if (n == 7 && first.empty()) first = y;
      else if (n == 7) CHECK(y == first);
    }
  }
  opt::kernels::set_isa(was);
}

namespace {

struct ModelError {
  double max_err = 0, max_logit = 0;
  size_t agree = 0, total = 0;
};

// Every golden case of fixture `name`: all prompt logits of q against f, and greedy tokens equal before the first
// divergence.
ModelError model_error(const std::string& name, const opt::LoadOptions& lo) {
  opt::Model f = opt::Model::load(opt_test::fixture_dir(name));
  opt::Model q = opt::Model::load(opt_test::fixture_dir(name), lo);
  CHECK(q.decode_weight_bytes() < f.decode_weight_bytes());
  auto goldens = opt_test::read_json(opt_test::fixture_dir(name) / "goldens.json");
  ModelError e;
  opt::Workspace ws(2);
  for (const auto& cs : goldens.at("cases")) {
    auto rows = opt::unpad(cs.at("input_ids").get<std::vector<std::vector<int32_t>>>(),
                           cs.at("attention_mask").get<std::vector<std::vector<int32_t>>>());
    for (const auto& r : rows) {
      opt::KvCache k1(f.config()), k2(q.config());
      opt::ForwardOptions fo;
      fo.all_logits = true;
      auto a = f.forward({{&k1, r.data(), int64_t(r.size())}}, ws, fo);
      std::vector<float> av(a.data, a.data + a.rows * a.cols);
      auto b = q.forward({{&k2, r.data(), int64_t(r.size())}}, ws, fo);
      for (size_t i = 0; i < av.size(); ++i) {
        e.max_err = std::max(e.max_err, double(std::fabs(av[i] - b.data[i])));
        e.max_logit = std::max(e.max_logit, double(std::fabs(av[i])));
      }
    }
    opt::GenerateOptions go;
    go.max_new_tokens = cs.at("generate").at("max_new_tokens");
    auto g1 = opt::generate_ids(f, rows, go, ws), g2 = opt::generate_ids(q, rows, go, ws);
    for (size_t b = 0; b < rows.size(); ++b) {
      const auto &x = g1.new_tokens[b], &y = g2.new_tokens[b];
      for (size_t i = 0; i < std::min(x.size(), y.size()); ++i, ++e.total) {
        if (x[i] != y[i]) {
          e.total += std::max(x.size(), y.size()) - i - 1;  // the rest of the row counts as disagreement
          break;
        }
        ++e.agree;
      }
    }
  }
  return e;
}

}  // namespace

TEST_CASE("int8 models against f32 on the fixtures: logit error and greedy agreement") {
  for (const std::string& name : opt_test::fixture_models()) {
    for (bool lm_head_int8 : {false, true}) {
      opt::LoadOptions lo;
      lo.quantize = opt::quantization::int8;
      lo.lm_head_int8 = lm_head_int8;
      const ModelError e = model_error(name, lo);
      MESSAGE(name << std::string(lm_head_int8 ? " (int8 LM head)" : " (LM head as stored)") << ": max |logit error| "
                   << e.max_err << " (max |logit| " << e.max_logit << "), greedy tokens agreeing before the first "
                   << "divergence " << e.agree << "/" << e.total);
      CHECK(e.max_err <= 0.05 * std::max(1.0, e.max_logit));
    }
  }
}

TEST_CASE("int4 models against f32 on the fixtures: logit error and greedy agreement") {
  double worst = 0;
  size_t agree = 0, total = 0;
  for (const std::string& name : opt_test::fixture_models()) {
    for (bool lm_head : {false, true}) {
      opt::LoadOptions lo;
      lo.quantize = opt::quantization::int4;
      lo.quantize_lm_head = lm_head;
      const ModelError e = model_error(name, lo);
      MESSAGE(name << std::string(lm_head ? " (int4 LM head)" : " (LM head as stored)") << ": max |logit error| "
                   << e.max_err << " (max |logit| " << e.max_logit << "), greedy tokens agreeing before the first "
                   << "divergence " << e.agree << "/" << e.total);
      // the fixtures are tiny random models (hidden 32 to 64), on which 4 bits are coarse: errors up to 0.46 of
      // the largest logit are measured; a broken kernel or scale gives errors of the logits' own size
      CHECK(e.max_err <= 0.6 * std::max(1.0, e.max_logit));
      worst = std::max(worst, e.max_err / std::max(1.0, e.max_logit));
      agree += e.agree, total += e.total;
    }
  }
  MESSAGE("int4: worst max |logit error| / max |logit| " << worst << ", greedy agreement " << agree << "/" << total);
  CHECK(double(agree) >= 0.3 * double(total));  // 543 / 1438 measured
}
