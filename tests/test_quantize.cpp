// int8 weight-only quantization: the per-weight error bound, the int8 kernel against opt::ref::linear_q8, and the
// end-to-end error of an int8 model against the f32 one on the shared fixtures (max logit error, greedy
// agreement), reported with MESSAGE.
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

TEST_CASE("int8 models against f32 on the fixtures: logit error and greedy agreement") {
  for (const std::string& name : opt_test::fixture_models()) {
    for (bool lm_head_int8 : {false, true}) {
      opt::Model f = opt::Model::load(opt_test::fixture_dir(name));
      opt::LoadOptions lo;
      lo.quantize = opt::quantization::int8;
      lo.lm_head_int8 = lm_head_int8;
      opt::Model q = opt::Model::load(opt_test::fixture_dir(name), lo);
      CHECK(q.decode_weight_bytes() < f.decode_weight_bytes());
      auto goldens = opt_test::read_json(opt_test::fixture_dir(name) / "goldens.json");
      double max_err = 0, max_logit = 0;
      size_t agree = 0, total = 0;
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
            max_err = std::max(max_err, double(std::fabs(av[i] - b.data[i])));
            max_logit = std::max(max_logit, double(std::fabs(av[i])));
          }
        }
        opt::GenerateOptions go;
        go.max_new_tokens = cs.at("generate").at("max_new_tokens");
        auto g1 = opt::generate_ids(f, rows, go, ws), g2 = opt::generate_ids(q, rows, go, ws);
        for (size_t b = 0; b < rows.size(); ++b) {
          const auto &x = g1.new_tokens[b], &y = g2.new_tokens[b];
          for (size_t i = 0; i < std::min(x.size(), y.size()); ++i, ++total) {
            if (x[i] != y[i]) {
              total += std::max(x.size(), y.size()) - i - 1;  // the rest of the row counts as disagreement
              break;
            }
            ++agree;
          }
        }
      }
      MESSAGE(name << std::string(lm_head_int8 ? " (int8 LM head)" : " (LM head as stored)") << ": max |logit error| "
                   << max_err << " (max |logit| " << max_logit << "), greedy tokens agreeing before the first "
                   << "divergence " << agree << "/" << total);
      CHECK(max_err <= 0.05 * std::max(1.0, max_logit));
    }
  }
}
