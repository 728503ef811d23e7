// The in-memory backend's fault injection, which the failure-path tests of
// the rest of the system depend on.
#include <gtest/gtest.h>

#include "cairn/error.h"
#include "storage/backends.h"

namespace cairn::testing {
namespace {

TEST(MemoryStorage, CapacityMakesWritesFailWithNoSpaceAndKeepsCommittedObjects) {
  clear_memory_bucket("cap");
  set_memory_faults("cap", MemoryFaults{100, nullptr});
  auto s = open_storage("memory://cap");
  s->put("small", std::string(60, 'a'));
  try {
    s->put("large", std::string(60, 'b'));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNoSpace);
    EXPECT_NE(std::string(e.what()).find("large"), std::string::npos);
  }
  EXPECT_EQ(s->get("small"), std::string(60, 'a'));
  EXPECT_FALSE(s->exists("large"));
  s->remove("small");
  EXPECT_NO_THROW(s->put("large", std::string(60, 'b'))) << "space is given back on remove";
  clear_memory_bucket("cap");
}

TEST(MemoryStorage, InjectedFailuresHitTheNamedOperation) {
  clear_memory_bucket("inject");
  set_memory_faults("inject",
                    MemoryFaults{std::nullopt, [](std::string_view op, std::string_view key) {
                                   if (op == "commit" && key == "deny")
                                     throw Error(ErrorCode::kPermissionDenied,
                                                 "memory://inject/deny: denied");
                                 }});
  auto s = open_storage("memory://inject");
  EXPECT_NO_THROW(s->put("ok", "1"));
  EXPECT_THROW(s->put("deny", "1"), Error);
  EXPECT_FALSE(s->exists("deny"));
  clear_memory_bucket("inject");
}

TEST(MemoryStorage, BucketsAreSharedWithinTheProcessAndSeparateByName) {
  clear_memory_bucket("one");
  clear_memory_bucket("two");
  open_storage("memory://one/p")->put("k", "v");
  EXPECT_EQ(open_storage("memory://one")->get("p/k"), "v");
  EXPECT_FALSE(open_storage("memory://two")->exists("p/k"));
  EXPECT_THROW(open_storage("memory://"), Error);
}

}  // namespace
}  // namespace cairn::testing
