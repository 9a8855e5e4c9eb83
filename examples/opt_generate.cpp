// opt-generate: the everyday command line for OPT models.
//
//   opt-generate -m MODEL_DIR -p "Hello, my name is" -n 50 [--temp T --top-k K --top-p P --seed S
//                --repeat-penalty R --stop STR ... --threads N -t TOKENIZER_DIR --kv-cache f32|f16|bf16]
//       streams the answer to stdout, then prints load time, prefill and decode speed to stderr.
//
//   opt-generate -m MODEL_DIR [-n MAX_NEW_TOKENS] --jsonl FILE|- [--padding left|right] [--logits]
//       JSONL contract (other tools rely on it): each input line is {"ids": [...]} or {"prompt": "..."} (prompt
//       needs a tokenizer); all lines form ONE batch, padded on the side given by --padding (default left). For
//       each input line, in order, one output line {"ids": [prompt + new, unpadded], "new_ids": [...]} plus
//       "text" (prompt + completion, special tokens skipped) when a tokenizer is available, and with --logits
//       "logits": [...], the logits that chose the first new token.
//
//   Speculative decoding (greedy: the output is exactly plain decoding's; sampling: the same distribution, the same
//   output for the same seed): --draft DIR (a draft model with the same vocabulary), --draft-self int8|int4 (the
//   model's own weights quantized) or --lookup N (prompt lookup with n-grams up to N), --draft-tokens K (default 5);
//   --stats adds the acceptance rate and tokens per pass.
//
//   Built with -DOPT_MPI=ON, `mpirun -np N opt-generate ...` (the same flags) splits the decoder layers over N
//   ranks (opt/pipeline.hpp); rank 0 reads the input and prints exactly what one process prints; --stats adds the
//   bytes the hand-offs moved, --peak-rss every rank's peak RSS.
// Exit code 0 on success; on any error one line on stderr and a non-zero exit.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <memory>
#include <opt/generate.hpp>
#include <opt/speculative.hpp>
#include <optional>

#include "kv_cache_option.hpp"
#include "pipeline_option.hpp"
#include "speculation_option.hpp"

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string model, tokenizer, jsonl, padding = "left";
  std::vector<std::string> prompts, stop;
  int64_t max_new_tokens = 50;
  bool logits = false, stats = false, no_stream = false;
  size_t threads = 0;
  opt::SamplingOptions sampling;
  std::string quantize = "none";
  bool lm_head_int8 = false;
  SpeculationFlags spec;  // speculative decoding: --draft, --draft-self, --lookup, --draft-tokens
  std::string kv_cache = "f32";
};

// The drafter the flags ask for (null: plain decoding), and its name for --stats.
struct Speculation {
  std::shared_ptr<opt::Drafter> drafter;
  std::string name;
  opt::SpeculativeOptions options;
  opt::SpeculativeStats stats;
};

Speculation make_speculation(const Args& a, const opt::Model& model, size_t threads) {
  Speculation sp;
  sp.options.draft_tokens = a.spec.draft_tokens;
  sp.options.verify_rows = a.spec.verify_rows;
  sp.drafter = make_drafter(a.spec, a.model, model, threads, sp.name);
  return sp;
}

void print_speculation(const Speculation& sp) {
  const opt::SpeculativeStats& s = sp.stats;
  std::fprintf(stderr, "speculative: %s, K<=%lld | %lld passes, %lld proposed, %lld accepted (%.1f%%) | %.2f tokens "
               "per pass\n", sp.name.c_str(), (long long)sp.options.draft_tokens, (long long)s.passes,
               (long long)s.proposed, (long long)s.accepted, 100.0 * s.acceptance(), s.tokens_per_pass());
}

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

std::optional<opt::Tokenizer> load_tokenizer(const Args& a) {
  namespace fs = std::filesystem;
  if (!a.tokenizer.empty()) return opt::Tokenizer::from_dir(a.tokenizer);
  const fs::path m = a.model;
  if ((fs::exists(m / "vocab.json") && fs::exists(m / "merges.txt")) || fs::exists(m / "tokenizer.json"))
    return opt::Tokenizer::from_dir(m);
  return std::nullopt;
}

opt::GenerateOptions options(const Args& a) {
  opt::GenerateOptions go;
  go.max_new_tokens = a.max_new_tokens;
  go.sampling = a.sampling;
  go.stop = a.stop;
  go.kv_cache = opt::kv_cache_type_from_string(a.kv_cache);
  return go;
}

void print_stats(double load_s, double prefill_s, size_t prompt_tokens, double decode_s, size_t decode_tokens,
                 size_t threads) {
  std::fprintf(stderr, "load %.1f ms | prefill %zu tokens in %.1f ms (%.1f tok/s) | decode %zu tokens in %.1f ms "
               "(%.1f tok/s, %.2f ms/token) | %zu threads | kernels %s\n",
               load_s * 1e3, prompt_tokens, prefill_s * 1e3, prefill_s > 0 ? prompt_tokens / prefill_s : 0.0,
               decode_tokens, decode_s * 1e3, decode_s > 0 ? decode_tokens / decode_s : 0.0,
               decode_tokens ? decode_s * 1e3 / decode_tokens : 0.0, threads,
               opt::kernels::to_string(opt::kernels::active_isa()));
}

// -p mode: text in, text streamed out.
int run_prompts(const Args& a, const opt::Model& model, const std::optional<opt::Tokenizer>& tok, double load_s) {
  if (!tok) throw opt::input_error("-p needs a tokenizer: the model folder has none; pass -t TOKENIZER_DIR");
  opt::GenerateOptions go = options(a);
  const bool stream = a.prompts.size() == 1 && !a.no_stream;
  Clock::time_point t0 = Clock::now(), t_first{};
  size_t new_tokens = 0, prompt_tokens = 0;
  for (auto& p : a.prompts) prompt_tokens += tok->encode(p).size();
  bool first = true;
  go.on_text = [&](size_t, int32_t id, std::string_view piece) {
    if (id >= 0) {
      ++new_tokens;
      if (first) t_first = Clock::now(), first = false;
    }
    if (stream) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
    return true;
  };
  if (stream) std::fwrite(a.prompts[0].data(), 1, a.prompts[0].size(), stdout);
  opt::Workspace ws(a.threads);
  Speculation sp = make_speculation(a, model, a.threads);
  opt::GenerateResult r = sp.drafter ? opt::speculative_generate(model, *tok, a.prompts, go, *sp.drafter, sp.options,
                                                                 ws, &sp.stats)
                                     : opt::generate(model, *tok, a.prompts, go, ws);
  Clock::time_point t1 = Clock::now();
  if (stream) std::fputs("\n", stdout);
  else
    for (auto& t : r.texts) std::cout << t << '\n';
  std::cout.flush();
  const size_t steps = new_tokens > a.prompts.size() ? new_tokens - a.prompts.size() : 0;
  print_stats(load_s, first ? 0 : seconds(t0, t_first), prompt_tokens, first ? 0 : seconds(t_first, t1), steps,
              ws.threads());
  if (sp.drafter && a.stats) print_speculation(sp);
  return 0;
}

// --jsonl mode: the batch contract.
int run_jsonl(const Args& a, const opt::Model& model, const std::optional<opt::Tokenizer>& tok, double load_s) {
  std::istream* in = &std::cin;
  std::ifstream file;
  if (a.jsonl != "-") {
    file.open(a.jsonl, std::ios::binary);
    if (!file) throw opt::io_error(a.jsonl + ": cannot open");
    in = &file;
  }
  std::vector<std::vector<int32_t>> prompts;
  std::string line;
  for (size_t lineno = 1; std::getline(*in, line); ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = "input line " + std::to_string(lineno);
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      throw opt::input_error(where + ": malformed JSON: " + e.what());
    }
    if (j.is_object() && j.contains("ids") && j["ids"].is_array()) {
      std::vector<int32_t> ids;
      for (auto& v : j["ids"]) {
        if (!v.is_number_integer() || v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX)
          throw opt::input_error(where + ": ids must be integers, found " + v.dump());
        ids.push_back(int32_t(v.get<int64_t>()));
      }
      prompts.push_back(std::move(ids));
    } else if (j.is_object() && j.contains("prompt") && j["prompt"].is_string()) {
      if (!tok) throw opt::input_error(where + ": a \"prompt\" needs a tokenizer; pass -t TOKENIZER_DIR");
      prompts.push_back(tok->encode(j["prompt"].get<std::string>()));
    } else {
      throw opt::input_error(where + ": expected {\"ids\": [...]} or {\"prompt\": \"...\"}");
    }
  }
  for (auto& p : a.prompts) {
    if (!tok) throw opt::input_error("-p needs a tokenizer; pass -t TOKENIZER_DIR");
    prompts.push_back(tok->encode(p));
  }
  if (prompts.empty()) throw opt::input_error("no input lines: expected one {\"ids\": [...]} per line");

  // One padded [B, T] batch with an attention mask, as a Python worker builds it; the engine runs each row
  // unpadded, so the side cannot change any row's result.
  size_t T = 0;
  for (auto& p : prompts) T = std::max(T, p.size());
  const int32_t pad = int32_t(model.config().pad_token_id);
  std::vector<std::vector<int32_t>> ids(prompts.size()), mask(prompts.size());
  for (size_t b = 0; b < prompts.size(); ++b) {
    const size_t n_pad = T - prompts[b].size(), n = prompts[b].size();
    const bool left = a.padding == "left";
    ids[b].assign(T, pad);
    mask[b].assign(T, 0);
    std::copy(prompts[b].begin(), prompts[b].end(), ids[b].begin() + int64_t(left ? n_pad : 0));
    std::fill(mask[b].begin() + int64_t(left ? n_pad : 0), mask[b].begin() + int64_t(left ? T : n), 1);
  }
  opt::GenerateOptions go = options(a);
  opt::Workspace ws(a.threads);
  Speculation sp = make_speculation(a, model, a.threads);
  Clock::time_point t0 = Clock::now();
  opt::GenerateResult r = sp.drafter ? opt::speculative_generate_ids(model, opt::unpad(ids, mask), go, *sp.drafter,
                                                                     sp.options, ws, a.logits, &sp.stats)
                                     : opt::generate_ids(model, opt::unpad(ids, mask), go, ws, a.logits);
  Clock::time_point t1 = Clock::now();
  size_t new_tokens = 0;
  for (size_t b = 0; b < prompts.size(); ++b) {
    json out = {{"ids", r.sequences[b]}, {"new_ids", r.new_tokens[b]}};
    if (tok) {
      std::vector<int32_t> known;
      for (int32_t id : r.sequences[b])
        if (id >= 0 && size_t(id) < tok->vocab_size()) known.push_back(id);
      opt::DecodeOptions d;
      d.skip_special_tokens = true;
      out["text"] = tok->decode(known, d);
    }
    if (a.logits) out["logits"] = r.first_logits[b];
    std::cout << out.dump(-1, ' ', false, json::error_handler_t::replace) << '\n';
    new_tokens += r.new_tokens[b].size();
  }
  std::cout.flush();
  if (a.stats) print_stats(load_s, 0, 0, seconds(t0, t1), new_tokens, ws.threads());
  if (a.stats && sp.drafter) print_speculation(sp);
  return std::cout ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  PipelineRun pipe(argc, argv, "opt-generate");
  CLI::App app{"opt-generate: run an OPT model (greedy by default)"};
  Args a;
  PipelineFlags pf;
  app.add_option("-m,--model", a.model, "model folder (config.json + model.safetensors, or pytorch_model.bin)")->required();
  app.add_option("-t,--tokenizer", a.tokenizer, "tokenizer folder (default: the model folder, if it has one)");
  app.add_option("-p,--prompt", a.prompts, "prompt text (repeat for a batch)");
  app.add_option("-n,--max-new-tokens", a.max_new_tokens, "new tokens per prompt (default 50)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 20));
  app.add_option("--jsonl", a.jsonl, "batch mode: a file of {\"ids\": [...]} / {\"prompt\": ...} lines, or -");
  app.add_option("--padding", a.padding, "padding side of the --jsonl batch: left (default) or right")
      ->check(CLI::IsMember({"left", "right"}));
  app.add_flag("--logits", a.logits, "--jsonl: add the logits that chose the first new token");
  app.add_option("--temp", a.sampling.temperature, "sampling temperature (default: greedy)");
  app.add_option("--top-k", a.sampling.top_k, "top-k sampling (0: off)");
  app.add_option("--top-p", a.sampling.top_p, "top-p (nucleus) sampling (1: off)");
  app.add_option("--seed", a.sampling.seed, "random seed for sampling");
  app.add_option("--repeat-penalty", a.sampling.repetition_penalty, "repetition penalty (1: off)");
  app.add_option("--stop", a.stop, "stop string (repeatable); never printed");
  app.add_option("--threads", a.threads, "threads (default: all cores)");
  app.add_option("--quantize", a.quantize,
                 "weights in memory: none (as stored), int8 or int4 (weight-only, per-block scales)")
      ->check(CLI::IsMember({"none", "int8", "int4"}));
  app.add_flag("--lm-head-int8", a.lm_head_int8, "with --quantize int8, quantize the LM head too");
  app.add_option("--kv-cache", a.kv_cache, "KV cache elements: f32 (default, exact), f16 or bf16 (half the memory)")
      ->check(kv_cache_validator());
  app.add_flag("--quantize-lm-head", a.lm_head_int8, "with --quantize int8 or int4, quantize the LM head too");
  app.add_flag("--stats", a.stats, "--jsonl: print timing to stderr too; with a drafter, its acceptance rate");
  add_speculation_options(app, a.spec);
  app.add_flag("--no-stream", a.no_stream, "-p: print the answer at the end instead of streaming it");
  add_pipeline_options(app, pf);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (pipe.rank() != 0) return e.get_exit_code();  // (rank 0 says it)
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    // the exit-code contract: one line on stderr (CLI11's exit() adds "Run with --help ...")
    std::cerr << "opt-generate: " << e.what() << " (see --help)\n";
    return e.get_exit_code();
  }
  // sampling is on when any sampling flag is given
  a.sampling.do_sample = app.count("--temp") || app.count("--top-k") || app.count("--top-p") || app.count("--seed");
  try {
    if (pipe.rank() == 0 && a.jsonl.empty() && a.prompts.empty())
      throw opt::input_error("give -p PROMPT or --jsonl FILE|-");
    Clock::time_point t0 = Clock::now();
    opt::LoadOptions lo;
    lo.quantize = a.quantize == "int8"   ? opt::quantization::int8
                  : a.quantize == "int4" ? opt::quantization::int4
                                         : opt::quantization::none;
    lo.quantize_lm_head = a.lm_head_int8;  // either flag (--lm-head-int8 is the older name)
    opt::Model model = opt::Model::load(a.model, pipe.load_options(lo, a.model));
    if (pipe.rank() > 0) {  // a stage: only its layers, until rank 0 is done
      const int rc = pipe.serve(model, a.threads, pf);
      if (pf.peak_rss) pipe.print_peak_rss(&model);
      return rc;
    }
    pipe.attach(model);
    std::optional<opt::Tokenizer> tok = load_tokenizer(a);
    const double load_s = seconds(t0, Clock::now());
    const int rc = a.jsonl.empty() ? run_prompts(a, model, tok, load_s) : run_jsonl(a, model, tok, load_s);
    pipe.finish();
    if (a.stats) pipe.print_traffic();
    if (pf.peak_rss) pipe.print_peak_rss(&model);
    return rc;
  } catch (const std::exception& e) {
    return pipe.fail(e.what());
  }
}
