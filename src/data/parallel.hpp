// A blocking parallel loop over [0, n) on plain threads (for one-off dataset scans, not the
// loader's hot path). The first exception thrown by `fn` is rethrown after all threads stopped.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace libreyolo::data {

inline int default_threads(int requested) {
  if (requested > 0) return requested;
  const unsigned hw = std::thread::hardware_concurrency();
  return static_cast<int>(std::clamp(hw, 1u, 16u));
}

// Batches a loader with `workers` threads keeps in flight: `prefetch`, and at least enough that
// every worker can hold a sample of its own with small batches.
inline int64_t prefetch_slots(int prefetch, int workers, int batch) {
  return std::max<int64_t>(std::max(1, prefetch), (workers + batch - 1) / batch + 1);
}

// Lowers the calling thread's priority by `by` niceness steps (capped at 19; Linux: that thread
// only). For loader workers, so that the training thread is not the one that waits for a core.
void make_this_thread_nicer(int by);

template <typename Fn>
void parallel_for(int64_t n, int threads, Fn&& fn) {
  threads = static_cast<int>(std::min<int64_t>(default_threads(threads), std::max<int64_t>(n, 1)));
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto body = [&] {
    for (int64_t i; (i = next.fetch_add(1)) < n;) {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        next = n;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(body);
  body();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace libreyolo::data
