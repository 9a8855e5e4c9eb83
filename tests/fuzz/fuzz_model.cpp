// libFuzzer: a whole model load + forward on a fuzzed model.safetensors, against three configs from ../shared
// (read once): opt-tiny-preln (pre-LN), opt-tiny-postln-proj (post-LN with project_in/out), opt-tiny-odd,
// opt-tiny-gelu-nobias (no biases, LayerNorms without affine) and opt-tiny-nofinalln-silu.
// Each input is tried with each config (a file made for one fails fast on the others). Loading may fail with an
// opt::error; a model that loads must run a forward pass over a few tokens, then one cached step, without
// crashing. NaN/Inf weights pass through to the logits (documented behaviour).
#include <opt/model.hpp>

#include "fuzz_common.hpp"

namespace {
const std::vector<opt::Config>& configs() {
  static const std::vector<opt::Config> c = [] {
    std::vector<opt::Config> v;
    for (const char* m : {"opt-tiny-preln", "opt-tiny-postln-proj", "opt-tiny-odd", "opt-tiny-gelu-nobias",
                          "opt-tiny-nofinalln-silu"})
      v.push_back(opt::Config::from_file(opt_fuzz::shared_dir() / "fixtures" / m / "config.json"));
    return v;
  }();
  return c;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static opt::Workspace ws(1);
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  for (const opt::Config& cfg : configs()) {
    try {
      opt::Checkpoint c;
      c.add(opt::SafetensorsFile::from_bytes(bytes, "fuzz.safetensors"));
      opt::LoadOptions lo;
      lo.strict = size & 1;  // both: unexpected tensors as an error, and listed
      opt::Model m = opt::Model::from_checkpoint(cfg, std::move(c), lo);
      opt::KvCache kv(m.config(), 8);
      const int32_t ids[] = {2, 5, int32_t(cfg.vocab_size - 1)};
      opt::ForwardOptions fo;
      fo.all_logits = true;
      opt::LogitsView l = m.forward({{&kv, ids, 3}}, ws, fo);
      if (l.rows != 3 || l.cols != cfg.vocab_size) __builtin_trap();
      volatile float sink = l.row(l.rows - 1)[l.cols - 1];
      (void)sink;
      const int32_t next[] = {7};
      l = m.forward({{&kv, next, 1}}, ws);
      sink = l.row(0)[0];
    } catch (const opt::error&) {
    }
  }
  return 0;
}
