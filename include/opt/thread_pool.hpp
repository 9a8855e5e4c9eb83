// A small fork-join thread pool for the kernels. Work is split into fixed ranges by the caller (output rows),
// never by reduction, so results do not depend on the number of threads.
//
// Cost model: decode issues ~60 jobs per token, a few microseconds apart. A job is published with one atomic
// store (no lock, no allocation: the callable is passed by pointer, type-erased by a function pointer) and cut
// into a few chunks that threads claim dynamically, so a worker descheduled by the OS (the other core busy with
// another process) costs at most one chunk, not a barrier wait. Idle workers spin on the job word for a while
// (~50 us) and then sleep on a condition variable, so they do not steal a busy neighbour core (libgomp's default
// spin-wait made 2 threads 3-6x slower), and the caller only takes the mutex when some worker is asleep.
#pragma once
#include <algorithm>
#include <atomic>
#include <cmath>
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
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_.store(true);
      state_.fetch_add(uint64_t(1) << 32);  // wakes spinning workers; the claim in work() fails (no chunks)
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  size_t size() const noexcept { return n_threads_; }

  // Runs fn(thread, chunk) for chunk in [0, n_chunks), chunks claimed dynamically by whichever thread is free (the
  // caller takes part), and waits until all are done. A worker that the OS has descheduled (the other core is busy)
  // simply claims fewer chunks: nobody waits for a thread that has not started. One job at a time: a pool belongs
  // to one calling thread (a Workspace).
  template <class F>
  void run_chunks(size_t n_chunks, F&& fn) {
    if (n_chunks == 0) return;
    if (n_threads_ == 1 || n_chunks == 1) {
      for (size_t c = 0; c < n_chunks; ++c) fn(size_t(0), c);
      return;
    }
    using Fn = std::remove_reference_t<F>;
    // Close the previous job before touching the job fields: a worker that read the old state cannot then claim
    // a chunk (its CAS fails), whatever mix of old and new fields it saw. Closing takes a generation of its own,
    // so workers that wake on it go back to waiting for the real one.
    const uint64_t gen = (state_.load(std::memory_order_relaxed) >> 32) + 2;
    state_.store(((gen - 1) << 32) | kClosed, std::memory_order_seq_cst);
    ctx_.store(const_cast<void*>(static_cast<const void*>(&fn)), std::memory_order_release);
    call_.store([](void* c, size_t t, size_t k) { (*static_cast<Fn*>(c))(t, k); }, std::memory_order_release);
    n_chunks_.store(n_chunks, std::memory_order_release);
    done_.store(0, std::memory_order_relaxed);
    state_.store(gen << 32, std::memory_order_seq_cst);  // publishes the job; chunk index 0
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      { std::lock_guard<std::mutex> lk(mu_); }
      cv_.notify_all();
    }
    work(0, gen);
    for (int spin = 0; done_.load(std::memory_order_acquire) != n_chunks; ++spin) {
      if (spin < 4000) detail::cpu_relax();
      else std::this_thread::yield();  // a worker is inside a chunk but descheduled: give the core back
    }
  }

  // Splits [0, n) into chunks (multiples of `grain`) and runs fn(thread, begin, end) on each; `thread` < size()
  // indexes per-thread scratch. The chunks shrink (guided scheduling): each takes 1 / (2 * threads) of the blocks
  // still left, at least one, so the first are large (few claims) and the last are one block, and a thread that
  // started late or ran slow holds the others up by at most one block. (Equal chunks, 4 a thread, left the other
  // thread waiting up to a quarter of its share: in perf of an int8 opt-125m decode on 2 threads, time spinning
  // in the pool went from 12.7% with them to 7.3% with guided chunks.)
  // Which thread runs which chunk varies from run to run, so fn must compute each output the same way whatever its
  // chunk (all kernels here do).
  template <class F>
  void parallel_for_t(size_t n, size_t grain, F&& fn) {
    if (n == 0) return;
    grain = std::max<size_t>(grain, 1);
    const size_t blocks = (n + grain - 1) / grain;
    if (n_threads_ == 1 || blocks <= 1) {
      fn(size_t(0), size_t(0), n);
      return;
    }
    // Chunk k < g starts at blocks - floor(blocks * q^k), q = 1 - 1 / (2 * threads): each takes 1 / (2 * threads)
    // of what is left, and is at least one block while blocks * q^k * (1 - q) >= 1 (k < g); the rest go one block
    // at a time. About 2 * threads * (1 + ln(blocks / (2 * threads))) chunks, computed, not stored.
    const double q = 1.0 - 1.0 / double(2 * n_threads_), big = double(blocks) * (1.0 - q);
    const size_t g = big >= 1.0 ? size_t(std::log(big) / -std::log(q)) + 1 : 0;  // chunks taken geometrically
    auto geometric = [&](size_t k) { return blocks - size_t(double(blocks) * std::pow(q, double(k))); };
    const size_t tail = geometric(g);  // where the one-block chunks begin
    auto start = [&](size_t k) { return k <= g ? geometric(k) : std::min(blocks, tail + (k - g)); };
    const size_t n_chunks = g + (blocks - tail);
    run_chunks(n_chunks, [&](size_t t, size_t c) {
      const size_t begin = std::min(n, start(c) * grain), end = std::min(n, start(c + 1) * grain);
      if (begin < end) fn(t, begin, end);
    });
  }
  // The same without the thread index: fn(begin, end).
  template <class F>
  void parallel_for(size_t n, size_t grain, F&& fn) {
    parallel_for_t(n, grain, [&](size_t, size_t b, size_t e) { fn(b, e); });
  }
  // Runs fn(thread_index) once on every thread (the caller is thread 0) and waits for all of them.
  template <class F>
  void run(F&& fn) {
    std::atomic<size_t> next{0};
    run_chunks(n_threads_, [&](size_t, size_t) { fn(next.fetch_add(1)); });
  }

 private:
  // Claims and runs chunks of job `gen` until none are left. A claim is a CAS on (generation, next chunk): it only
  // succeeds while job `gen` is current and open, so the job fields read between the state and the CAS are that
  // job's (the caller closes a job before writing the next one's fields).
  void work(size_t thread, uint64_t gen) {
    for (;;) {
      // state first, then the fields: if a newer job's fields were read, the job was closed before they were
      // written, so the CAS below (from this state) fails
      uint64_t s = state_.load(std::memory_order_acquire);
      if ((s >> 32) != gen || (s & 0xffffffffu) == kClosed) return;
      void* ctx = ctx_.load(std::memory_order_acquire);
      auto call = call_.load(std::memory_order_acquire);
      const size_t n = n_chunks_.load(std::memory_order_acquire);
      if ((s & 0xffffffffu) >= n) return;
      if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel)) continue;
      call(ctx, thread, size_t(s & 0xffffffffu));
      done_.fetch_add(1, std::memory_order_acq_rel);
    }
  }

  void worker(size_t index) {
    uint64_t seen = 0;
    for (;;) {
      uint64_t g = state_.load(std::memory_order_acquire) >> 32;
      for (int spin = 0; g == seen && spin < 20000; ++spin) {
        detail::cpu_relax();
        g = state_.load(std::memory_order_acquire) >> 32;
      }
      if (g == seen) {
        std::unique_lock<std::mutex> lk(mu_);
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        cv_.wait(lk, [&] { return (state_.load(std::memory_order_seq_cst) >> 32) != seen || stop_.load(); });
        sleepers_.fetch_sub(1, std::memory_order_relaxed);
        g = state_.load(std::memory_order_acquire) >> 32;
      }
      if (stop_.load()) return;
      seen = g;
      work(index, g);
    }
  }

  static constexpr uint64_t kClosed = 0xffffffffu;  // chunk index of a closed job: nothing to claim

  size_t n_threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  alignas(64) std::atomic<uint64_t> state_{0};  // generation << 32 | next chunk to claim
  alignas(64) std::atomic<size_t> done_{0};     // chunks of the current job finished
  alignas(64) std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  std::atomic<void*> ctx_{nullptr};
  std::atomic<void (*)(void*, size_t, size_t)> call_{nullptr};
  std::atomic<size_t> n_chunks_{0};
};

OPT_NAMESPACE_END
