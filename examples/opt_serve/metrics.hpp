// opt-serve's metrics, for GET /metrics in the Prometheus text format (version 0.0.4): counters of requests by
// endpoint and outcome and of prompt tokens, and histograms of the time to first token and the request latency.
// The step time (a histogram), tokens out and the gauges (queue depth, running sequences, connections) are the
// scheduler's and the HTTP layer's, read when the page is written (api.hpp, metrics_reply).
#pragma once
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace opt_serve {

// A Prometheus histogram: cumulative buckets (upper bounds in seconds), a sum and a count. Thread-safe.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

  void observe(double seconds) {
    std::lock_guard<std::mutex> lk(mu_);
    size_t i = 0;
    while (i < bounds_.size() && seconds > bounds_[i]) ++i;
    ++counts_[i];
    sum_ += seconds;
    ++count_;
  }

  // Appends `name`'s HELP, TYPE, _bucket{le=...}, _sum and _count lines.
  void write(std::string& out, const char* name, const char* help) const {
    std::lock_guard<std::mutex> lk(mu_);
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " histogram\n";
    uint64_t cumulative = 0;
    for (size_t i = 0; i <= bounds_.size(); ++i) {
      cumulative += counts_[i];
      out += std::string(name) + "_bucket{le=\"" + (i < bounds_.size() ? number(bounds_[i]) : "+Inf") + "\"} " +
             std::to_string(cumulative) + "\n";
    }
    out += std::string(name) + "_sum " + number(sum_) + "\n" + name + "_count " + std::to_string(count_) + "\n";
  }

  static std::string number(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", v);
    return buf;
  }

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t count_ = 0;
};

struct Metrics {
  // seconds: a sequence's first token after its request arrived; a request from its arrival to its last byte
  // (the step time is the scheduler's, Scheduler::step_seconds)
  Histogram ttft_seconds{{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}};
  Histogram latency_seconds{{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}};

  // A request answered (or given up): `endpoint` is the route ("other" for none), `outcome` one of ok, invalid,
  // unauthorized, rejected (429: the queue is full), unavailable (503), error (500), cancelled (the client left).
  void count_request(const std::string& endpoint, const std::string& outcome) {
    std::lock_guard<std::mutex> lk(mu_);
    ++requests_[{endpoint, outcome}];
  }
  void count_prompt_tokens(uint64_t n) {
    std::lock_guard<std::mutex> lk(mu_);
    prompt_tokens_ += n;
  }

  // The outcome of an HTTP status, for count_request.
  static const char* outcome_of(int status) {
    if (status < 400) return "ok";
    if (status == 401) return "unauthorized";
    if (status == 429) return "rejected";
    if (status == 503) return "unavailable";
    if (status >= 500) return "error";
    return "invalid";
  }

  // Appends the counters of requests and prompt tokens.
  void write_counters(std::string& out) const {
    std::lock_guard<std::mutex> lk(mu_);
    out += "# HELP opt_serve_requests_total HTTP requests answered, by endpoint and outcome\n"
           "# TYPE opt_serve_requests_total counter\n";
    for (const auto& [key, n] : requests_)
      out += "opt_serve_requests_total{endpoint=\"" + key.first + "\",outcome=\"" + key.second + "\"} " +
             std::to_string(n) + "\n";
    out += "# HELP opt_serve_prompt_tokens_total prompt tokens of the sequences queued\n"
           "# TYPE opt_serve_prompt_tokens_total counter\n"
           "opt_serve_prompt_tokens_total " + std::to_string(prompt_tokens_) + "\n";
  }

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, std::string>, uint64_t> requests_;
  uint64_t prompt_tokens_ = 0;
};

// One line of a gauge or counter with its HELP and TYPE.
inline void write_metric(std::string& out, const char* name, const char* type, const char* help, double value) {
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " +
         Histogram::number(value) + "\n";
}

}  // namespace opt_serve
