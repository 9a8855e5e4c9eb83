// A small fork-join thread pool for the kernels. Work is split into fixed ranges by the caller (output rows),
// never by reduction, so results do not depend on the number of threads. Idle workers spin briefly, then
// sleep on a condition variable, so a busy neighbour core does not make us slower (libgomp's spin-wait did).
#pragma once
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "opt/version.hpp"

OPT_NAMESPACE_BEGIN

class ThreadPool {
 public:
  // n_threads counts the calling thread: ThreadPool(1) runs everything inline. 0 = hardware concurrency.
  explicit ThreadPool(size_t n_threads = 0) {
    if (n_threads == 0) n_threads = std::max(1u, std::thread::hardware_concurrency());
    n_threads_ = n_threads;
    for (size_t i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker(i); });
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
      ++generation_;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  size_t size() const noexcept { return n_threads_; }

  // Runs fn(thread_index) on every thread (the caller is thread 0) and waits for all of them.
  void run(const std::function<void(size_t)>& fn) {
    if (n_threads_ == 1) {
      fn(0);
      return;
    }
    std::lock_guard<std::mutex> run_lock(run_mu_);  // one job at a time per pool
    job_ = &fn;
    pending_.store(n_threads_ - 1, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lk(mu_);
      ++generation_;
    }
    cv_.notify_all();
    fn(0);
    // wait for the workers: spin a little, then yield
    for (int spin = 0; pending_.load(std::memory_order_acquire) != 0; ++spin) {
      if (spin > 2000) std::this_thread::yield();
    }
    job_ = nullptr;
  }

  // Splits [0, n) into one contiguous chunk per thread (multiples of `grain`) and runs fn(thread, begin, end) on
  // each; `thread` < size() indexes per-thread scratch.
  template <class F>
  void parallel_for_t(size_t n, size_t grain, F&& fn) {
    if (n == 0) return;
    grain = std::max<size_t>(grain, 1);
    size_t blocks = (n + grain - 1) / grain;
    size_t nt = std::min(n_threads_, blocks);
    if (nt <= 1) {
      fn(size_t(0), size_t(0), n);
      return;
    }
    run([&](size_t t) {
      if (t >= nt) return;
      size_t b0 = blocks * t / nt, b1 = blocks * (t + 1) / nt;
      size_t begin = std::min(n, b0 * grain), end = std::min(n, b1 * grain);
      if (begin < end) fn(t, begin, end);
    });
  }
  // The same without the thread index: fn(begin, end).
  template <class F>
  void parallel_for(size_t n, size_t grain, F&& fn) {
    parallel_for_t(n, grain, [&](size_t, size_t b, size_t e) { fn(b, e); });
  }

 private:
  void worker(size_t index) {
    size_t seen = 0;
    for (;;) {
      // spin briefly for the next job before sleeping: decode issues a job every few microseconds
      bool got = false;
      for (int spin = 0; spin < 20000; ++spin) {
        if (generation_seen() != seen) {
          got = true;
          break;
        }
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      }
      if (!got) {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return generation_.load() != seen; });
      }
      std::function<void(size_t)> const* job;
      {
        std::lock_guard<std::mutex> lk(mu_);
        seen = generation_;
        if (stop_) return;
        job = job_;
      }
      (*job)(index);
      pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }
  size_t generation_seen() const noexcept { return generation_.load(std::memory_order_acquire); }

  size_t n_threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex mu_, run_mu_;
  std::condition_variable cv_;
  std::atomic<size_t> generation_{0};
  bool stop_ = false;
  std::function<void(size_t)> const* job_ = nullptr;
  std::atomic<size_t> pending_{0};
};

OPT_NAMESPACE_END
