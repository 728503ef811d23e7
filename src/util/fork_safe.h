// Mutexes that a fork() never copies locked.
//
// The Trainer and the Tuner fork their workers and trial runners (a Python
// function cannot be exec'd) while other threads of the library may hold a
// lock: the memory tier's persister, the background deleter, an S3 lease's
// heartbeat. A child inherits every mutex in the state it had at the fork,
// with no thread to unlock it, and hangs the first time it takes one that
// was held. A ForkSafeMutex is locked by the forking thread before the fork
// (pthread_atfork's prepare: it waits for the holder to finish) and unlocked
// after it in both processes, so a child always finds it free, and whatever
// it guards in a state some holder left it in.
//
// Use it for the locks a forked child can reach: process-wide ones
// (function-local or namespace-scope statics) and those of objects shared
// by the whole process (the S3 connection pool). Each has an `order`: the
// fork takes them in ascending order, so a lock taken while another is held
// must have a higher order than that one (the orders in use are listed in
// fork_safe.cc). The logger's lock is handled the same way (util/log.cc),
// after these.
#pragma once

#include <mutex>

namespace cairn {

class ForkSafeMutex {
 public:
  explicit ForkSafeMutex(int order);
  ~ForkSafeMutex();
  ForkSafeMutex(const ForkSafeMutex&) = delete;
  ForkSafeMutex& operator=(const ForkSafeMutex&) = delete;

  void lock() { m_.lock(); }
  void unlock() { m_.unlock(); }
  bool try_lock() { return m_.try_lock(); }

 private:
  friend struct ForkSafeRegistry;
  std::mutex m_;
  int order_;
};

}  // namespace cairn
