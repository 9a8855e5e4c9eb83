// The same bits on every instruction set: each fixture model (f32, f16, bf16 stored; also quantized to int8 and
// to int4 at load) runs its golden prompts (prompt pass with every logit, then greedy decode steps) under every
// ISA this CPU has, and the logits must equal the scalar kernels' bit for bit; so do the greedy ids.
//
// Across machines: OPT_ISA_DIGEST_WRITE=FILE writes one FNV-1a digest of those logits per model and weight type;
// OPT_ISA_DIGEST_EXPECT=FILE checks this machine's digests against such a file (CI: the aarch64 build under
// qemu against the x86 build's).
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <opt/generate.hpp>
#include <sstream>

#include "shared.hpp"

namespace {

using json = nlohmann::json;

struct Run {
  std::vector<float> logits;  // every logit, in order
  std::vector<int32_t> ids;   // the greedy tokens
};

// Every golden case's unpadded rows: all prompt logits, then 6 greedy steps, each step's logits.
Run run_model(const opt::Model& m, const json& goldens, size_t threads) {
  Run r;
  opt::Workspace ws(threads);
  for (const json& cs : goldens.at("cases")) {
    auto rows = opt::unpad(cs.at("input_ids").get<std::vector<std::vector<int32_t>>>(),
                           cs.at("attention_mask").get<std::vector<std::vector<int32_t>>>());
    for (const auto& row : rows) {
      opt::KvCache kv(m.config());
      opt::ForwardOptions fo;
      fo.all_logits = true;
      opt::LogitsView lv = m.forward({{&kv, row.data(), int64_t(row.size())}}, ws, fo);
      r.logits.insert(r.logits.end(), lv.data, lv.data + lv.rows * lv.cols);
      int32_t id = opt::argmax(lv.row(lv.rows - 1), lv.cols);
      for (int s = 0; s < 6 && kv.size() < kv.capacity(); ++s) {
        r.ids.push_back(id);
        lv = m.forward({{&kv, &id, 1}}, ws);
        r.logits.insert(r.logits.end(), lv.data, lv.data + lv.cols);
        id = opt::argmax(lv.row(0), lv.cols);
      }
    }
  }
  return r;
}

uint64_t fnv1a(const std::vector<float>& v) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

size_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return i;
  return a.size() == b.size() ? size_t(-1) : std::min(a.size(), b.size());
}

struct IsaRestore {
  opt::kernels::isa was = opt::kernels::active_isa();
  ~IsaRestore() { opt::kernels::set_isa(was); }
};

}  // namespace

TEST_CASE("every ISA gives the scalar kernels' bits on every fixture (f32/f16/bf16 weights, int8 and int4)") {
  IsaRestore restore;
  const std::vector<opt::kernels::isa> isas = opt::kernels::available_isas();
  MESSAGE("ISAs on this machine: " << opt::kernels::available_isas_string());
  REQUIRE(isas.front() == opt::kernels::isa::scalar);
  std::map<std::string, uint64_t> digests;
  size_t compared = 0;
  for (const std::string& name : opt_test::fixture_models()) {
    const json goldens = opt_test::read_json(opt_test::fixture_dir(name) / "goldens.json");
    for (opt::quantization qm : {opt::quantization::none, opt::quantization::int8, opt::quantization::int4}) {
      const char* qname = qm == opt::quantization::int8 ? "int8" : qm == opt::quantization::int4 ? "int4" : "";
      INFO("model " << name << " " << qname);
      opt::LoadOptions lo;
      lo.quantize = qm, lo.quantize_lm_head = true;
      Run want;
      for (opt::kernels::isa i : isas) {
        INFO("isa " << opt::kernels::to_string(i));
        opt::kernels::set_isa(i);
        const opt::Model m = opt::Model::load(opt_test::fixture_dir(name), lo);  // the quantizer runs on i too
        for (size_t threads : {size_t(1), size_t(3)}) {
          Run got = run_model(m, goldens, threads);
          REQUIRE(!got.logits.empty());
          if (want.logits.empty()) {
            want = std::move(got);
            continue;
          }
          const size_t at = first_difference(got.logits, want.logits);
          CHECK_MESSAGE(at == size_t(-1), "logit " << at << " differs from scalar's: " << got.logits[at] << " vs "
                                                   << want.logits[at]);
          CHECK(got.ids == want.ids);
          ++compared;
        }
      }
      digests[name + "/" + (*qname ? qname : "stored")] = fnv1a(want.logits);
    }
  }
  CHECK(compared == (isas.size() * 2 - 1) * opt_test::fixture_models().size() * 3);

  std::ostringstream text;
  for (const auto& [k, h] : digests) text << k << ' ' << std::hex << h << std::dec << '\n';
  if (const char* out = std::getenv("OPT_ISA_DIGEST_WRITE"); out && *out) {
    std::ofstream f(out);
    f << text.str();
    REQUIRE(f.good());
  }
  if (const char* in = std::getenv("OPT_ISA_DIGEST_EXPECT"); in && *in) {
    const std::string expected = opt_test::read_text(in);
    REQUIRE(!expected.empty());
    CHECK_MESSAGE(text.str() == expected, "this machine's logits differ from the digests of " << in << ":\n"
                                                                                            << text.str());
  }
}

TEST_CASE("OPT_ISA: a known name this CPU runs is chosen; an unknown one or one it lacks is an opt::config_error") {
  const char* was = std::getenv("OPT_ISA");
  const std::string saved = was ? was : "";
  for (opt::kernels::isa i : opt::kernels::available_isas()) {
    ::setenv("OPT_ISA", opt::kernels::to_string(i), 1);
    CHECK(opt::kernels::requested_isa() == i);
  }
  ::setenv("OPT_ISA", "avx9000", 1);
  CHECK_THROWS_WITH_AS(opt::kernels::requested_isa(), doctest::Contains("unknown instruction set"), opt::config_error);
  for (opt::kernels::isa i : {opt::kernels::isa::avx2, opt::kernels::isa::avx512, opt::kernels::isa::neon}) {
    if (opt::kernels::cpu_supports(i)) continue;
    ::setenv("OPT_ISA", opt::kernels::to_string(i), 1);
    CHECK_THROWS_WITH_AS(opt::kernels::requested_isa(), doctest::Contains("cannot run it"), opt::config_error);
    CHECK_THROWS_AS(opt::kernels::set_isa(i), opt::config_error);
  }
  ::setenv("OPT_ISA", "", 1);
  CHECK(opt::kernels::requested_isa() == opt::kernels::best_isa());
  if (was) ::setenv("OPT_ISA", saved.c_str(), 1);
  else ::unsetenv("OPT_ISA");
}

TEST_CASE("OPT_PREFETCH_F32: off, or bytes ahead a stream; unset, by vendor; anything else an opt::config_error") {
  using opt::kernels::parse_f32_prefetch;
  CHECK(!parse_f32_prefetch(nullptr, false).decode);
  CHECK(parse_f32_prefetch(nullptr, false).stream_bytes == 0);
  CHECK(parse_f32_prefetch(nullptr, true).decode);
  CHECK(parse_f32_prefetch(nullptr, true).stream_bytes == 512);
  for (bool intel : {false, true}) {
    CHECK(!parse_f32_prefetch("off", intel).decode);
    CHECK(parse_f32_prefetch("off", intel).stream_bytes == 0);
    CHECK(parse_f32_prefetch("64", intel).decode);
    CHECK(parse_f32_prefetch("64", intel).stream_bytes == 64);
    CHECK(parse_f32_prefetch("1048576", intel).stream_bytes == 1048576);
    for (const char* bad : {"", "0", "-512", "512x", "of", "on", "1048577", "99999999999999999999"})
      CHECK_THROWS_WITH_AS(parse_f32_prefetch(bad, intel), doctest::Contains("OPT_PREFETCH_F32="), opt::config_error);
  }
  // the process's own choice is the one its environment and CPU give
  CHECK(opt::kernels::f32_prefetch().decode ==
        parse_f32_prefetch(std::getenv("OPT_PREFETCH_F32"), opt::kernels::cpu_is_intel()).decode);
}
