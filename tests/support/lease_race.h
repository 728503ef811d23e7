// Test support: several takers racing for one lapsed lease, as processes on
// other machines would (each through its own open_storage(), so nothing is
// shared but the server).
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cairn/error.h"
#include "cairn/storage.h"

namespace cairn::testing {

// A lease as another machine's holder writes it; lapsed when `ttl_seconds`
// is 0.
inline std::string foreign_lease(int ttl_seconds) {
  return fmt::format(
      R"({{"host":"elsewhere","boot_id":"b","pid":42,"start_time":"1","token":"t","ttl_seconds":{}}})",
      ttl_seconds);
}

// Writes a lapsed lease at `key` under `uri`, lets `takers` threads call
// try_lock on it at once and returns how many got it. Every lock taken is
// held until all takers are done, so two holders would both be counted; a
// taker's error other than kLocked is a test failure.
inline int race_for_lapsed_lease(const std::string& uri, const std::string& key, int takers) {
  open_storage(uri)->put(key, foreign_lease(0));
  std::vector<std::shared_ptr<Storage>> handles;
  for (int t = 0; t < takers; ++t) handles.push_back(open_storage(uri));
  std::vector<std::unique_ptr<Lock>> held(takers);
  std::vector<std::string> failures(takers);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < takers; ++t) {
    threads.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < takers) std::this_thread::yield();
      try {
        held[t] = handles[t]->try_lock(key);
      } catch (const Error& e) {
        if (e.code() != ErrorCode::kLocked) failures[t] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  int holders = 0;
  for (int t = 0; t < takers; ++t) {
    EXPECT_EQ(failures[t], "") << "taker " << t;
    if (held[t]) ++holders;
  }
  return holders;
}

}  // namespace cairn::testing
