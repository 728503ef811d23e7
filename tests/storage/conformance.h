// The storage conformance suite's backend registry: every backend registers a
// factory here, and every test in storage_conformance_test.cc runs on each.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "cairn/storage.h"

namespace cairn::testing {

struct BackendUnderTest {
  std::string name;
  // A fresh, empty storage root. The returned object keeps whatever backs it
  // (a temp dir, a server) alive and removes it when destroyed.
  std::function<std::shared_ptr<Storage>()> make;
  bool has_local_paths = false;
};

}  // namespace cairn::testing
