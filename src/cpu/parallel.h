// parallel_for: splits [0, n) into contiguous chunks over the machine's cores. The CPU backend's only
// concurrency; results never depend on the thread count (each index is computed by one thread).
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace nibble {

template <typename Fn>
void parallel_for(int64_t n, int64_t min_chunk, Fn&& fn) {
  const int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t workers = std::clamp<int64_t>(n / std::max<int64_t>(1, min_chunk), 1, hw);
  if (workers <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::vector<std::thread> threads;
  const int64_t chunk = (n + workers - 1) / workers;
  for (int64_t w = 0; w < workers; ++w) {
    const int64_t begin = w * chunk, end = std::min(n, begin + chunk);
    if (begin >= end) break;
    threads.emplace_back([begin, end, &fn] {
      for (int64_t i = begin; i < end; ++i) fn(i);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace nibble
