// A small fork-join thread pool for the kernels. Work is split into fixed ranges by the caller (output rows),
// never by reduction, so results do not depend on the number of threads.
//
// Cost model: decode issues ~60 jobs per token, a few microseconds apart. A job is published with one atomic
// increment (no lock, no allocation: the callable is passed by pointer, type-erased by a function pointer);
// idle workers spin on that counter for a while (~50 us) and then sleep on a condition variable, so a busy
// neighbour core does not make us slower (libgomp's default spin-wait did, 3-6x), and the caller only takes the
// mutex when some worker is asleep.
#pragma once
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "opt/version.hpp"

OPT_NAMESPACE_BEGIN

namespace detail {
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
}  // namespace detail

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
    stop_.store(true);
    {
      std::lock_guard<std::mutex> lk(mu_);
      generation_.fetch_add(1);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  size_t size() const noexcept { return n_threads_; }

  // Runs fn(thread_index) on every thread (the caller is thread 0) and waits for all of them. One job at a time:
  // a pool belongs to one calling thread (a Workspace).
  template <class F>
  void run(F&& fn) {
    if (n_threads_ == 1) {
      fn(size_t(0));
      return;
    }
    using Fn = std::remove_reference_t<F>;
    ctx_ = const_cast<void*>(static_cast<const void*>(&fn));
    call_ = [](void* c, size_t t) { (*static_cast<Fn*>(c))(t); };
    pending_.store(n_threads_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_seq_cst);  // publishes ctx_/call_ to spinning workers
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      { std::lock_guard<std::mutex> lk(mu_); }
      cv_.notify_all();
    }
    fn(size_t(0));
    for (int spin = 0; pending_.load(std::memory_order_acquire) != 0; ++spin) {
      if (spin < 4000) detail::cpu_relax();
      else std::this_thread::yield();  // a worker was descheduled: give the core back
    }
  }

  // Splits [0, n) into one contiguous chunk per thread (multiples of `grain`) and runs fn(thread, begin, end) on
  // each; `thread` < size() indexes per-thread scratch.
  template <class F>
  void parallel_for_t(size_t n, size_t grain, F&& fn) {
    if (n == 0) return;
    grain = std::max<size_t>(grain, 1);
    const size_t blocks = (n + grain - 1) / grain;
    const size_t nt = std::min(n_threads_, blocks);
    if (nt <= 1) {
      fn(size_t(0), size_t(0), n);
      return;
    }
    run([&](size_t t) {
      if (t >= nt) return;
      const size_t b0 = blocks * t / nt, b1 = blocks * (t + 1) / nt;
      const size_t begin = std::min(n, b0 * grain), end = std::min(n, b1 * grain);
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
    uint64_t seen = 0;
    for (;;) {
      uint64_t g = generation_.load(std::memory_order_acquire);
      for (int spin = 0; g == seen && spin < 20000; ++spin) {
        detail::cpu_relax();
        g = generation_.load(std::memory_order_acquire);
      }
      if (g == seen) {
        std::unique_lock<std::mutex> lk(mu_);
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        cv_.wait(lk, [&] { return generation_.load(std::memory_order_seq_cst) != seen; });
        sleepers_.fetch_sub(1, std::memory_order_relaxed);
        g = generation_.load(std::memory_order_acquire);
      }
      seen = g;
      if (stop_.load()) return;
      call_(ctx_, index);
      pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  size_t n_threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  alignas(64) std::atomic<uint64_t> generation_{0};
  alignas(64) std::atomic<size_t> pending_{0};
  alignas(64) std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  void* ctx_ = nullptr;
  void (*call_)(void*, size_t) = nullptr;
};

OPT_NAMESPACE_END
