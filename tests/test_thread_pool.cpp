// The thread pool under stress: many tiny jobs back to back (as decode issues them), every chunk of every job
// run exactly once, never a chunk of one job run as part of another.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <opt/thread_pool.hpp>
#include <vector>

TEST_CASE("thread pool: 100k jobs back to back, each chunk exactly once") {
  for (size_t threads : {2, 3}) {
    opt::ThreadPool pool(threads);
    std::vector<std::atomic<int>> hits(64);
    long bad = 0;
    for (int job = 0; job < 100000; ++job) {
      const size_t n = 1 + size_t(job % 13);  // job sizes vary, as in a forward pass
      for (size_t i = 0; i < n; ++i) hits[i].store(0, std::memory_order_relaxed);
      const int tag = job;
      pool.run_chunks(n, [&](size_t t, size_t c) {
        if (t >= threads || c >= n || tag != job) ++bad;  // (t, c) in range, and this job's own callable
        hits[c].fetch_add(1, std::memory_order_relaxed);
      });
      for (size_t i = 0; i < n; ++i)
        if (hits[i].load() != 1) ++bad;
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("thread pool: parallel_for covers [0, n) once for odd sizes and grains") {
  opt::ThreadPool pool(2);
  for (size_t n : {1, 2, 7, 64, 1000, 4097})
    for (size_t grain : {1, 3, 16, 5000}) {
      std::vector<int> seen(n, 0);
      pool.parallel_for(n, grain, [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i) ++seen[i];
      });
      CHECK(std::count(seen.begin(), seen.end(), 1) == long(n));
    }
}
