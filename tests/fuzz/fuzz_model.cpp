// libFuzzer: a whole model load + forward on a fuzzed model.safetensors, with opt-tiny-preln's config.json
// (../shared, read once). Loading may fail with an opt::error; a model that loads must run a forward pass over
// a few tokens without crashing. NaN/Inf weights pass through to the logits (documented behaviour).
#include <opt/model.hpp>

#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const opt::Config cfg =
      opt::Config::from_file(opt_fuzz::shared_dir() / "fixtures" / "opt-tiny-preln" / "config.json");
  static opt::Workspace ws(1);
  try {
    opt::Checkpoint c;
    c.add(opt::SafetensorsFile::from_bytes(std::string(reinterpret_cast<const char*>(data), size), "fuzz.safetensors"));
    opt::LoadOptions lo;
    lo.strict = size & 1;  // both: unexpected tensors as an error, and listed
    opt::Model m = opt::Model::from_checkpoint(cfg, std::move(c), lo);
    opt::KvCache kv(m.config(), 8);
    const int32_t ids[] = {2, 5, int32_t(cfg.vocab_size - 1)};
    opt::ForwardOptions fo;
    fo.all_logits = true;
    opt::LogitsView l = m.forward({{&kv, ids, 3}}, ws, fo);
    volatile float sink = l.row(l.rows - 1)[l.cols - 1];
    (void)sink;
    const int32_t next[] = {7};
    l = m.forward({{&kv, next, 1}}, ws);
    sink = l.row(0)[0];
  } catch (const opt::error&) {
  }
  return 0;
}
