// Thread ordering for tests of background work, without guessing how long
// anything takes: a Gate holds threads until opened, spin_until() waits for
// an event of another thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace cairn::testing {

// Threads that wait() block until open() is called (once open, it stays so).
class Gate {
 public:
  void wait() {
    std::unique_lock<std::mutex> g(mu_);
    cv_.wait(g, [&] { return open_; });
  }
  // As wait(), giving up after `timeout`; returns whether the gate opened
  // (so a test of background work fails instead of hanging when the work
  // turns out to run in the foreground).
  template <class Duration>
  bool wait_for(Duration timeout) {
    std::unique_lock<std::mutex> g(mu_);
    return cv_.wait_for(g, timeout, [&] { return open_; });
  }
  void open() {
    {
      std::lock_guard<std::mutex> g(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// Spins (yielding) until `cond` holds.
template <class F>
void spin_until(F cond) {
  while (!cond()) std::this_thread::yield();
}

}  // namespace cairn::testing
