#include "util/fork_safe.h"

#include <pthread.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

// The orders in use, outermost first (a lock may be taken while holding one
// of a lower order):
//   10  checkpoint metadata replacement (checkpoint/checkpoint.cc), held over
//       the storage's writes
//   20  the registry of memory:// stores (storage/memory_storage.cc)
//   30  per-process facts computed once (s3 lease holder, open-file limit,
//       CUDA engine devices)
//   40  the S3 lease clock (storage/s3/s3_lease.cc)
//   50  the S3 connection pool (storage/s3/http.cc)

namespace cairn {

struct ForkSafeRegistry {
  std::mutex mu;                    // guards `all`; held across a fork too
  std::vector<ForkSafeMutex*> all;  // ascending order

  static ForkSafeRegistry& get() {
    static ForkSafeRegistry* r = [] {
      auto* created = new ForkSafeRegistry();  // never destroyed: statics outlive it
      ::pthread_atfork(prepare, after, after);
      return created;
    }();
    return *r;
  }

  static void prepare() {
    ForkSafeRegistry& r = get();
    r.mu.lock();
    for (ForkSafeMutex* m : r.all) m->m_.lock();
  }

  // In the parent and in the child: the forking thread holds them all.
  static void after() {
    ForkSafeRegistry& r = get();
    for (auto it = r.all.rbegin(); it != r.all.rend(); ++it) (*it)->m_.unlock();
    r.mu.unlock();
  }
};

ForkSafeMutex::ForkSafeMutex(int order) : order_(order) {
  ForkSafeRegistry& r = ForkSafeRegistry::get();
  std::lock_guard<std::mutex> g(r.mu);
  auto at = std::upper_bound(r.all.begin(), r.all.end(), order,
                             [](int o, const ForkSafeMutex* m) { return o < m->order_; });
  r.all.insert(at, this);
}

ForkSafeMutex::~ForkSafeMutex() {
  ForkSafeRegistry& r = ForkSafeRegistry::get();
  std::lock_guard<std::mutex> g(r.mu);
  std::erase(r.all, this);
}

}  // namespace cairn
