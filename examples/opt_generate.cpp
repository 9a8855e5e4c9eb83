// opt-generate: greedy generation from the command line.
//
//   opt-generate -m MODEL_DIR [-n MAX_NEW_TOKENS] --jsonl FILE|-  [--padding left|right] [--logits] [--threads N]
//
// JSONL contract (other tools rely on it): each input line is {"ids": [...]}; all lines form ONE batch, padded on
// the side given by --padding. For each input line, in order, one output line {"ids": [prompt + new, unpadded],
// "new_ids": [...]}; with --logits also "logits": [...], the logits that chose the first new token.
// Exit code 0 on success; on any error one line on stderr and a non-zero exit.
#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <opt/generate.hpp>

namespace {

using json = nlohmann::json;

struct Args {
  std::string model;
  int64_t max_new_tokens = 50;
  std::string jsonl;
  std::string padding = "left";
  bool logits = false;
  size_t threads = 0;
};

int run(const Args& a) {
  opt::Model model = opt::Model::load(a.model);
  std::istream* in = &std::cin;
  std::ifstream file;
  if (a.jsonl != "-") {
    file.open(a.jsonl, std::ios::binary);
    if (!file) throw opt::io_error(a.jsonl + ": cannot open");
    in = &file;
  }
  // read every line: they form one batch
  std::vector<std::vector<int32_t>> prompts;
  std::string line;
  for (size_t lineno = 1; std::getline(*in, line); ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      throw opt::input_error("input line " + std::to_string(lineno) + ": malformed JSON: " + e.what());
    }
    if (!j.is_object() || !j.contains("ids") || !j["ids"].is_array())
      throw opt::input_error("input line " + std::to_string(lineno) + ": expected {\"ids\": [...]}");
    std::vector<int32_t> ids;
    for (auto& v : j["ids"]) {
      if (!v.is_number_integer() || v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX)
        throw opt::input_error("input line " + std::to_string(lineno) + ": ids must be integers, found " + v.dump());
      ids.push_back(int32_t(v.get<int64_t>()));
    }
    prompts.push_back(std::move(ids));
  }
  if (prompts.empty()) throw opt::input_error("no input lines: expected one {\"ids\": [...]} per line");

  // One padded [B, T] batch with an attention mask, as a Python worker would build it; the engine runs each row
  // unpadded, so the side does not change any row's result.
  size_t T = 0;
  for (auto& p : prompts) T = std::max(T, p.size());
  const int32_t pad = int32_t(model.config().pad_token_id);
  std::vector<std::vector<int32_t>> ids(prompts.size()), mask(prompts.size());
  for (size_t b = 0; b < prompts.size(); ++b) {
    const size_t n_pad = T - prompts[b].size();
    std::vector<int32_t> pads(n_pad, pad), zeros(n_pad, 0), ones(prompts[b].size(), 1);
    if (a.padding == "left") {
      ids[b] = pads, mask[b] = zeros;
      ids[b].insert(ids[b].end(), prompts[b].begin(), prompts[b].end());
      mask[b].insert(mask[b].end(), ones.begin(), ones.end());
    } else {
      ids[b] = prompts[b], mask[b] = ones;
      ids[b].insert(ids[b].end(), pads.begin(), pads.end());
      mask[b].insert(mask[b].end(), zeros.begin(), zeros.end());
    }
  }
  opt::GenerateOptions go;
  go.max_new_tokens = a.max_new_tokens;
  opt::Workspace ws(a.threads);
  opt::GenerateResult r = opt::generate_ids(model, opt::unpad(ids, mask), go, ws, a.logits);
  for (size_t b = 0; b < prompts.size(); ++b) {
    json out = {{"ids", r.sequences[b]}, {"new_ids", r.new_tokens[b]}};
    if (a.logits) out["logits"] = r.first_logits[b];
    std::cout << out.dump() << '\n';
  }
  std::cout.flush();
  return std::cout ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"opt-generate: greedy generation with an OPT model"};
  Args a;
  app.add_option("-m,--model", a.model, "model folder (config.json + model.safetensors)")->required();
  app.add_option("-n,--max-new-tokens", a.max_new_tokens, "new tokens per prompt (default 50)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 20));
  app.add_option("--jsonl", a.jsonl, "input file of {\"ids\": [...]} lines, or - for stdin")->required();
  app.add_option("--padding", a.padding, "padding side of the batch: left (default) or right")
      ->check(CLI::IsMember({"left", "right"}));
  app.add_flag("--logits", a.logits, "add the logits that chose the first new token");
  app.add_option("-t,--threads", a.threads, "threads (default: all cores)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::cerr << "opt-generate: " << e.what() << '\n';
    return 1;
  }
}
