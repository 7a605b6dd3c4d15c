#include <atomic>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "data/internal.h"

namespace rd::data {

int resolve_threads(int threads) {
  if (threads > 0) return threads;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw ? static_cast<int>(hw) : 1;
}

void parallel_for(size_t n, int threads, const std::function<void(size_t)>& fn) {
  const int t = static_cast<int>(std::min<size_t>(static_cast<size_t>(resolve_threads(threads)),
                                                  std::max<size_t>(n, 1)));
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mu;
  auto body = [&] {
    for (;;) {
      const size_t i = next.fetch_add(1);
      if (i >= n) return;
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (!error) error = std::current_exception();
        next.store(n);  // stop handing out work
      }
    }
  };
  std::vector<std::thread> pool;
  for (int k = 1; k < t; ++k) pool.emplace_back(body);
  body();
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace rd::data
