// The speculative decoding options of opt-generate and opt-serve: --draft DIR, --draft-self int8|int8-approx|int4,
// --lookup N,
// --draft-tokens K. One drafter at most; none means plain decoding.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <opt/model.hpp>
#include <opt/speculative.hpp>
#include <string>

struct SpeculationFlags {
  std::string draft, draft_self;  // a draft model folder, or the model's own weights quantized (int8 | int8-approx |
                                  // int4; int8-approx: LoadOptions::approximate_int8, the same output, faster drafts
                                  // where the CPU has AVX-512 VNNI)
  int64_t lookup = 0, draft_tokens = opt::SpeculativeOptions{}.draft_tokens;
  double verify_rows = 0.0;  // SpeculativeOptions::verify_rows (0: by the kernels and the weights)
};

inline void add_speculation_options(CLI::App& app, SpeculationFlags& f) {
  app.add_option("--draft", f.draft, "speculative decoding with this draft model (same vocabulary)");
  app.add_option("--draft-self", f.draft_self, "speculative decoding with the model's own weights quantized")
      ->check(CLI::IsMember({"int8", "int8-approx", "int4"}));
  app.add_option("--lookup", f.lookup, "speculative decoding by prompt lookup, n-grams up to N")
      ->check(CLI::Range(int64_t(1), int64_t(16)));
  app.add_option("--draft-tokens", f.draft_tokens,
                 "speculative decoding: the most tokens drafted a pass (default " +
                     std::to_string(opt::SpeculativeOptions{}.draft_tokens) + ")")
      ->check(CLI::Range(int64_t(1), int64_t(64)));
  app.add_option("--verify-rows", f.verify_rows,
                 "speculative decoding: rows one verification pass takes for about a plain step's cost, what "
                 "adaptive K plans with (default 0: by the CPU's kernels and the weight type)")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            double r = -1;
            try {
              r = std::stod(v);
            } catch (const std::exception&) {
            }
            return r == 0.0 || (r >= 1.0 && r <= 1024.0) ? "" : "Value " + v + " not 0 or in range [1 - 1024]";
          },
          "0 or [1 - 1024]"));
}

// The drafter the flags ask for (null: plain decoding) and its name. `model_dir` is the model's folder (for
// --draft-self); threads are the draft model's.
inline std::shared_ptr<opt::Drafter> make_drafter(const SpeculationFlags& f, const std::string& model_dir,
                                                  const opt::Model& model, size_t threads, std::string& name) {
  const int n = int(!f.draft.empty()) + int(!f.draft_self.empty()) + int(f.lookup > 0);
  if (n > 1) throw opt::input_error("give one drafter: --draft, --draft-self or --lookup");
  if (!f.draft.empty()) {
    opt::Model d = opt::Model::load(f.draft);
    if (d.config().vocab_size > model.config().vocab_size)
      throw opt::input_error("--draft " + f.draft + ": vocabulary of " + std::to_string(d.config().vocab_size) +
                             " tokens, larger than the model's " + std::to_string(model.config().vocab_size));
    name = "draft model " + f.draft;
    return std::make_shared<opt::ModelDrafter>(d, threads);
  }
  if (!f.draft_self.empty()) {
    opt::LoadOptions lo;
    lo.quantize = f.draft_self == "int4" ? opt::quantization::int4 : opt::quantization::int8;
    lo.approximate_int8 = f.draft_self == "int8-approx";
    name = "self draft " + f.draft_self;
    return std::make_shared<opt::ModelDrafter>(opt::Model::load(model_dir, lo), threads);
  }
  if (f.lookup > 0) {
    name = "prompt lookup n<=" + std::to_string(f.lookup);
    return std::make_shared<opt::PromptLookupDrafter>(f.lookup);
  }
  return nullptr;
}
