// The thread pool under stress: many tiny jobs back to back (as decode issues them), every chunk of every job
// run exactly once, never a chunk of one job run as part of another.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <opt/thread_pool.hpp>
#include <vector>

TEST_CASE("thread pool: 100k jobs back to back, each chunk exactly once") {
  // Two callables take turns, each holding the number of the job it serves: a chunk run through the other job's
  // callable (a worker that read a stale job) sees its tag differ from the job the caller is running.
  struct Job {
    std::atomic<int> tag{-1};
    const std::atomic<int>* current = nullptr;
    std::vector<std::atomic<int>>* hits = nullptr;
    std::atomic<long>* bad = nullptr;
    size_t threads = 0;
    std::atomic<size_t> n{0};
    void operator()(size_t t, size_t c) const {
      // (t, c) in range, and this is the job being run
      if (t >= threads || c >= n.load(std::memory_order_relaxed) || tag.load(std::memory_order_relaxed) != current->load(std::memory_order_relaxed))
        bad->fetch_add(1, std::memory_order_relaxed);
      if (c < hits->size()) (*hits)[c].fetch_add(1, std::memory_order_relaxed);
    }
  };
  for (size_t threads : {2, 3}) {
    opt::ThreadPool pool(threads);
    std::vector<std::atomic<int>> hits(64);
    std::atomic<long> bad{0}, miscounted{0};
    std::atomic<int> current{-1};
    Job jobs[2];
    for (Job& j : jobs) {
      j.current = &current;
      j.hits = &hits;
      j.bad = &bad;
      j.threads = threads;
    }
    for (int job = 0; job < 100000; ++job) {
      const size_t n = 1 + size_t(job % 13);  // job sizes vary, as in a forward pass
      for (size_t i = 0; i < hits.size(); ++i) hits[i].store(0, std::memory_order_relaxed);
      Job& j = jobs[job % 2];
      j.n.store(n, std::memory_order_relaxed);
      j.tag.store(job, std::memory_order_relaxed);
      current.store(job, std::memory_order_seq_cst);
      pool.run_chunks(n, j);
      for (size_t i = 0; i < hits.size(); ++i)
        if (hits[i].load() != (i < n ? 1 : 0)) miscounted.fetch_add(1);
    }
    CHECK(bad.load() == 0);
    CHECK(miscounted.load() == 0);
  }
}

TEST_CASE("thread pool: parallel_for covers [0, n) once for odd sizes and grains") {
  for (size_t threads : {2, 3}) {
    opt::ThreadPool pool(threads);
    for (size_t n : {1, 2, 7, 64, 1000, 4097, 1000003})  // (1000003 by 1: ~47 and ~71 chunks)
      for (size_t grain : {1, 3, 16, 5000}) {
        std::vector<int> seen(n, 0);
        std::atomic<size_t> chunks{0}, misaligned{0}, smallest{n};
        pool.parallel_for(n, grain, [&](size_t b, size_t e) {
          for (size_t i = b; i < e; ++i) ++seen[i];
          ++chunks;
          if (b % grain != 0 || (e % grain != 0 && e != n)) ++misaligned;
          size_t s = smallest.load();
          while (e != n && e - b < s && !smallest.compare_exchange_weak(s, e - b)) {  // (the last may be partial)
          }
        });
        CHECK(std::count(seen.begin(), seen.end(), 1) == long(n));
        CHECK(misaligned.load() == 0);
        // guided: O(threads * log(blocks)) chunks, shrinking to one block (a grain) at the end
        const double blocks = double((n + grain - 1) / grain);
        CHECK(double(chunks.load()) <= 2.0 * double(threads) * (2.0 + std::log(blocks)));
        if (n / grain >= 4 * threads) CHECK(smallest.load() == grain);
      }
  }
}
