// The C++ benchmarks' own flags: --NAME=VALUE taken out of argv (what is left goes to Google Benchmark), each
// with an environment variable that gives its default (the flag wins).
#pragma once
#include <cstdlib>
#include <string>
#include <vector>

namespace opt_bench {

// The integer in environment variable `name`, or dflt when it is unset.
inline int env_int(const char* name, int dflt) {
  const char* e = std::getenv(name);
  return e ? std::atoi(e) : dflt;
}

struct Flag {
  const char* name;  // "model" is --model=
  const char* env;   // e.g. "OPT_BENCH_MODEL"
  std::string* text;
  int* number;
};
inline Flag flag(const char* name, const char* env, std::string& v) { return {name, env, &v, nullptr}; }
inline Flag flag(const char* name, const char* env, int& v) { return {name, env, nullptr, &v}; }

inline void take_flags(int& argc, char** argv, const std::vector<Flag>& flags) {
  auto set = [](const Flag& f, const std::string& v) {
    if (f.text) *f.text = v;
    else *f.number = std::atoi(v.c_str());
  };
  for (const Flag& f : flags)
    if (const char* e = std::getenv(f.env)) set(f, e);
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    bool taken = false;
    for (const Flag& f : flags) {
      const std::string prefix = std::string("--") + f.name + "=";
      if (a.rfind(prefix, 0) == 0) {
        set(f, a.substr(prefix.size()));
        taken = true;
        break;
      }
    }
    if (!taken) argv[out++] = argv[i];
  }
  argc = out;
}

}  // namespace opt_bench
