// Encode throughput of opt::Tokenizer (one thread) on ~4 MB of deterministic mixed text: English-like prose,
// code, numbers, CJK, emoji and whitespace runs. Cold = empty BPE cache each iteration, warm = cache filled by a
// previous pass; plus encode_batch of 1 KB rows, decode, and loading.
//
// The tokenizer folder comes from $OPT_TOKENIZER_DIR, else ../shared/tokenizer beside the checkout.
// `bench_tokenizer --dump-text=FILE` writes the benchmark text (to time other tokenizers on the same bytes).
#include <benchmark/benchmark.h>
#include <opt/tokenizer.hpp>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

namespace {

std::string utf8(char32_t cp) {
  std::string s;
  opt::detail::append_utf8(s, cp);
  return s;
}

std::string make_text(size_t target_bytes) {
  static const char* kWords[] = {
      "the", "of", "and", "to", "in", "is", "was", "that", "for", "it", "with", "as", "on", "be", "at", "by",
      "this", "had", "not", "are", "but", "from", "or", "have", "an", "they", "which", "one", "you", "were",
      "her", "all", "she", "there", "would", "their", "we", "him", "been", "has", "when", "who", "will", "more",
      "model", "language", "transformer", "training", "data", "large", "performance", "results", "research",
      "tokenizer", "inference", "attention", "network", "weights", "parameters", "evaluation", "benchmark",
      "government", "university", "information", "development", "international", "understanding", "however",
      "approximately", "responsibility", "unbelievable", "characteristics", "Wikipedia", "London", "Paris",
      "don't", "it's", "we're", "they've", "I'm", "you'll", "he'd", "OPT", "GPT-2", "Meta", "Hugging", "Face"};
  static const char* kCode[] = {
      "for (int i = 0; i < n; ++i) {", "  sum += a[i] * b[i];", "}", "def forward(self, x):",
      "    return self.fc2(F.relu(self.fc1(x)))", "#include <vector>", "std::vector<int32_t> ids;",
      "if (x != nullptr && x->size() > 0) return -1;", "const auto& [key, value] = *it;",
      "    self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)", "x = torch.cat([x, y], dim=-1)  # concat",
      "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;", "<div class=\"row\"><span>{{ item }}</span></div>",
      "fn main() { println!(\"{}\", 42); }", "let v: Vec<u8> = s.bytes().collect();", "$ git commit -m 'fix: off-by-one'"};
  std::mt19937 rng(12345);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  std::string out;
  out.reserve(target_bytes + 4096);
  while (out.size() < target_bytes) {
    const unsigned kind = rng() % 100;
    if (kind < 55) {  // a prose paragraph
      const size_t sentences = 2 + pick(5);
      for (size_t s = 0; s < sentences; ++s) {
        const size_t words = 5 + pick(15);
        for (size_t w = 0; w < words; ++w) {
          std::string word = kWords[pick(sizeof(kWords) / sizeof(*kWords))];
          if (w == 0) word[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(word[0])));
          out += word;
          if (w + 1 < words) out += (rng() % 12 == 0) ? ", " : " ";
        }
        out += ". ";
      }
      out += "\n\n";
    } else if (kind < 75) {  // code
      const size_t lines = 3 + pick(10);
      for (size_t l = 0; l < lines; ++l) {
        out.append(4 * pick(3), ' ');
        out += kCode[pick(sizeof(kCode) / sizeof(*kCode))];
        out += '\n';
      }
      out += '\n';
    } else if (kind < 83) {  // numbers
      for (int k = 0; k < 8; ++k) {
        switch (rng() % 4) {
          case 0: out += std::to_string(1900 + pick(200)) + "-" + std::to_string(1 + pick(12)) + "-" + std::to_string(1 + pick(28)); break;
          case 1: out += std::to_string(pick(100000)) + "." + std::to_string(pick(1000)); break;
          case 2: out += "$" + std::to_string(1 + pick(999)) + "," + std::to_string(100 + pick(900)); break;
          default: out += "0x" + std::to_string(pick(1u << 30)); break;
        }
        out += (k % 3 == 2) ? "\n" : " ";
      }
      out += '\n';
    } else if (kind < 91) {  // CJK, kana, hangul
      const size_t n = 10 + pick(60);
      for (size_t k = 0; k < n; ++k) {
        switch (rng() % 6) {
          case 0: case 1: case 2: out += utf8(0x4E00 + static_cast<char32_t>(pick(0x2000))); break;
          case 3: out += utf8(0x3041 + static_cast<char32_t>(pick(0x56))); break;
          case 4: out += utf8(0xAC00 + static_cast<char32_t>(pick(0x2BA4))); break;
          default: out += (rng() % 2) ? utf8(0x3002) : utf8(0xFF0C); break;
        }
        if (rng() % 15 == 0) out += ' ';
      }
      out += '\n';
    } else if (kind < 95) {  // emoji, with ZWJ sequences, skin tones and flags
      const size_t n = 3 + pick(12);
      for (size_t k = 0; k < n; ++k) {
        switch (rng() % 4) {
          case 0: out += utf8(0x1F600 + static_cast<char32_t>(pick(0x50))); break;
          case 1: out += utf8(0x1F44D) + utf8(0x1F3FB + static_cast<char32_t>(pick(5))); break;
          case 2: out += utf8(0x1F468) + utf8(0x200D) + utf8(0x1F469) + utf8(0x200D) + utf8(0x1F467); break;
          default: out += utf8(0x1F1E6 + static_cast<char32_t>(pick(26))) + utf8(0x1F1E6 + static_cast<char32_t>(pick(26))); break;
        }
        out += (rng() % 3 == 0) ? " " : "";
      }
      out += '\n';
    } else {  // whitespace runs
      static const char* kWs[] = {" ", "  ", "    ", "\t", "\t\t", "\n", "\r\n", " \n", "\n\n\n", "\xC2\xA0", "\xE3\x80\x80"};
      const size_t n = 2 + pick(10);
      for (size_t k = 0; k < n; ++k) {
        out += kWs[pick(sizeof(kWs) / sizeof(*kWs))];
        if (rng() % 2) out += kWords[pick(sizeof(kWords) / sizeof(*kWords))];
      }
    }
  }
  return out;
}

const std::string& text() {
  static const std::string t = make_text(4u << 20);
  return t;
}

std::string tokenizer_dir() {
  if (const char* env = std::getenv("OPT_TOKENIZER_DIR")) return env;
  return (std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / "shared" / "tokenizer").string();
}

// Loads the tokenizer once and checks the round trip before anything is timed.
const opt::Tokenizer* tokenizer(benchmark::State& state) {
  static std::unique_ptr<opt::Tokenizer> tok;
  static std::string failure;
  if (!tok && failure.empty()) {
    try {
      tok = std::make_unique<opt::Tokenizer>(opt::Tokenizer::from_dir(tokenizer_dir()));
      if (tok->decode(tok->encode(text()), {true, false}) != text()) failure = "round trip check failed";
    } catch (const std::exception& e) {
      failure = std::string(e.what()) + " (set OPT_TOKENIZER_DIR)";
    }
    if (!failure.empty()) tok.reset();
  }
  if (!tok) state.SkipWithError(failure.c_str());
  return tok.get();
}

void report(benchmark::State& state, size_t bytes, size_t tokens) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(state.iterations() * tokens),
                                                  benchmark::Counter::kIsRate);
  state.counters["MB/s"] = benchmark::Counter(static_cast<double>(state.iterations() * bytes) / 1e6,
                                              benchmark::Counter::kIsRate);
}

// cold: the BPE cache is emptied before every pass (a fresh Tokenizer); warm: it holds the previous pass.
void BM_Encode(benchmark::State& state, bool cold) {
  const opt::Tokenizer* tok = tokenizer(state);
  if (!tok) return;
  size_t tokens = tok->encode(text()).size();
  for (auto _ : state) {
    if (cold) tok->clear_cache();
    auto ids = tok->encode(text());
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  report(state, text().size(), tokens);
}

void BM_EncodeBatch(benchmark::State& state) {
  const opt::Tokenizer* tok = tokenizer(state);
  if (!tok) return;
  const size_t row_bytes = static_cast<size_t>(state.range(0));
  std::vector<std::string> rows;
  for (size_t pos = 0; pos < text().size();) {
    size_t end = std::min(text().size(), pos + row_bytes);
    while (end < text().size() && (static_cast<unsigned char>(text()[end]) & 0xC0) == 0x80) ++end;  // whole chars
    rows.push_back(text().substr(pos, end - pos));
    pos = end;
  }
  opt::EncodeOptions o;
  o.padding_side = opt::PaddingSide::left;
  size_t tokens = 0;
  for (const auto& r : rows) tokens += tok->encode(r).size();
  for (auto _ : state) {
    opt::BatchEncoding b = tok->encode_batch(rows, o);
    benchmark::DoNotOptimize(b.input_ids.data());
  }
  report(state, text().size(), tokens);
  state.counters["rows"] = static_cast<double>(rows.size());
}

void BM_Decode(benchmark::State& state) {
  const opt::Tokenizer* tok = tokenizer(state);
  if (!tok) return;
  const std::vector<int32_t> ids = tok->encode(text());
  for (auto _ : state) {
    std::string s = tok->decode(ids);
    benchmark::DoNotOptimize(s.data());
  }
  report(state, text().size(), ids.size());
}

void BM_Load(benchmark::State& state) {
  if (!tokenizer(state)) return;
  for (auto _ : state) {
    opt::Tokenizer t = opt::Tokenizer::from_dir(tokenizer_dir());
    benchmark::DoNotOptimize(&t);
  }
}

BENCHMARK_CAPTURE(BM_Encode, cold, true)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_Encode, warm, false)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_EncodeBatch)->Arg(1024)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_Decode)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Load)->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--dump-text=", 12) == 0) {
      std::ofstream f(argv[i] + 12, std::ios::binary);
      f.write(text().data(), static_cast<std::streamsize>(text().size()));
      std::cout << "wrote " << text().size() << " bytes to " << (argv[i] + 12) << "\n";
      return f ? 0 : 1;
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
