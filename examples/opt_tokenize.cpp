// opt-tokenize: text <-> ids with an OPT tokenizer, one JSON value per line (a contract other tools rely on).
//
//   opt-tokenize -t TOKENIZER_DIR --jsonl FILE|-            "text" lines      -> {"ids": [2, 31414, 232]}
//   opt-tokenize -t TOKENIZER_DIR --jsonl FILE|- --decode   {"ids": [...]}    -> {"text": "Hello world"}
//
// Encoding prepends BOS unless --no-bos. Decoding skips special tokens unless --keep-special and cleans up
// tokenization spaces unless --no-cleanup. Output is formatted like Python's json.dumps (", " and ": "
// separators, non-ASCII as \uXXXX). Empty input lines are skipped. On any error: one line on stderr, exit 1.
#include <opt/tokenizer.hpp>

#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace {

std::string ids_line(const std::vector<int32_t>& ids) {
  std::string s = "{\"ids\": [";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(ids[i]);
  }
  return s + "]}";
}

std::string text_line(const std::string& text) {
  return "{\"text\": " + nlohmann::json(text).dump(-1, ' ', /*ensure_ascii=*/true) + "}";
}

std::vector<int32_t> parse_ids(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("ids") || !j["ids"].is_array())
    throw opt::input_error("expected {\"ids\": [...]}, found " + j.dump().substr(0, 60));
  std::vector<int32_t> ids;
  ids.reserve(j["ids"].size());
  for (const auto& v : j["ids"]) {
    if (!v.is_number_integer() || v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX)
      throw opt::input_error("expected integer ids, found " + v.dump().substr(0, 30));
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return ids;
}

std::string where(const std::string& path, size_t line_no) {
  return (path == "-" ? std::string("stdin") : path) + " line " + std::to_string(line_no);
}

int run(const std::string& dir, const std::string& path, bool no_bos, bool decode, bool keep_special,
        bool no_cleanup) {
  const opt::Tokenizer tok = opt::Tokenizer::from_dir(dir);
  std::ifstream file;
  const bool from_stdin = path == "-";
  if (!from_stdin) {
    file.open(path, std::ios::binary);
    if (!file) throw opt::io_error("cannot open " + path);
  }
  std::istream& in = from_stdin ? std::cin : file;
  opt::DecodeOptions dopts;
  dopts.skip_special_tokens = !keep_special;
  if (no_cleanup) dopts.clean_up_tokenization_spaces = false;  // else the tokenizer's default (tokenizer_config.json)
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    try {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (decode) {
        std::cout << text_line(tok.decode(parse_ids(j), dopts)) << '\n';
      } else {
        if (!j.is_string()) throw opt::input_error("expected a JSON string, found " + j.dump().substr(0, 60));
        std::cout << ids_line(tok.encode(j.get_ref<const std::string&>(), !no_bos)) << '\n';
      }
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error(where(path, line_no) + ": invalid JSON: " + e.what());
    } catch (const opt::error& e) {
      throw std::runtime_error(where(path, line_no) + ": " + e.what());
    }
    if (from_stdin) std::cout.flush();
  }
  if (in.bad()) throw opt::io_error("cannot read " + path);
  std::cout.flush();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"opt-tokenize: JSON lines of text -> {\"ids\": [...]}, or with --decode {\"ids\": [...]} -> {\"text\": ...}"};
  std::string dir, path;
  bool no_bos = false, decode = false, keep_special = false, no_cleanup = false;
  app.add_option("-t,--tokenizer", dir, "folder with vocab.json + merges.txt, or tokenizer.json")->required();
  app.add_option("--jsonl", path, "input file of JSON lines, - for stdin")->required();
  app.add_flag("--no-bos", no_bos, "encode without the BOS token");
  app.add_flag("--decode", decode, "decode {\"ids\": [...]} lines to {\"text\": ...}");
  app.add_flag("--keep-special", keep_special, "decode: keep special tokens (</s>, <pad>)");
  app.add_flag("--no-cleanup", no_cleanup, "decode: no clean_up_tokenization_spaces");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "opt-tokenize: " << e.what() << '\n';
    return e.get_exit_code() ? e.get_exit_code() : 1;
  }
  try {
    return run(dir, path, no_bos, decode, keep_special, no_cleanup);
  } catch (const std::exception& e) {
    std::cout.flush();
    std::string msg = e.what();
    for (char& c : msg)
      if (c == '\n' || c == '\r') c = ' ';
    std::cerr << "opt-tokenize: " << msg << '\n';
    return 1;
  }
}
