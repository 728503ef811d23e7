// Handing GPUs to concurrent trials: whole GPUs alone, fractions packed up
// to a whole, and requests that could never fit refused by name.
#include "tune/gpu_pool.h"

#include <gtest/gtest.h>

#include "cairn/error.h"
#include "support/errors.h"

namespace cairn::tune::tuner_internal {
namespace {

using Ids = std::vector<std::string>;

TEST(GpuPool, WholeGpusGoToOneTrialEachLowestFirstAndComeBack) {
  GpuPool pool({"0", "1", "2"});
  EXPECT_EQ(pool.acquire(1), Ids{"0"});
  EXPECT_EQ(pool.acquire(2), (Ids{"1", "2"}));
  EXPECT_FALSE(pool.acquire(1));
  pool.release({"1", "2"}, 2);
  EXPECT_EQ(pool.acquire(1), Ids{"1"});
  EXPECT_FALSE(pool.acquire(2)) << "only GPU 2 is free";
  EXPECT_EQ(pool.acquire(0), Ids{}) << "a trial without GPUs always fits";
}

TEST(GpuPool, FractionsShareAGpuUpToAWholeAndPackBeforeTakingAnother) {
  GpuPool pool({"a", "b"});
  EXPECT_EQ(pool.acquire(0.5), Ids{"a"});
  EXPECT_EQ(pool.acquire(0.25), Ids{"a"}) << "packed onto the GPU already in use";
  EXPECT_EQ(pool.acquire(0.5), Ids{"b"}) << "a holds only 0.25 more";
  EXPECT_EQ(pool.acquire(0.25), Ids{"a"}) << "the fuller one that still holds it";
  EXPECT_EQ(pool.acquire(0.25), Ids{"b"});
  EXPECT_EQ(pool.acquire(0.25), Ids{"b"});
  EXPECT_FALSE(pool.acquire(0.25));
  EXPECT_FALSE(pool.acquire(1)) << "no GPU is wholly free";
  pool.release({"a"}, 0.5);
  pool.release({"a"}, 0.25);
  pool.release({"a"}, 0.25);
  EXPECT_EQ(pool.acquire(1), Ids{"a"});
}

TEST(GpuPool, ThirdsFillOneGpuExactly) {
  GpuPool pool({"0"});
  for (int i = 0; i < 3; ++i) EXPECT_EQ(pool.acquire(1.0 / 3), Ids{"0"}) << i;
  EXPECT_FALSE(pool.acquire(1.0 / 3));
}

TEST(GpuPool, RequestsThatCouldNeverFitAreRefusedNamingTheField) {
  GpuPool two({"0", "1"});
  two.check_request(0);
  two.check_request(0.5);
  two.check_request(2);
  for (double bad : {-1.0, 1.5, 3.0, 1e-9}) {
    testing::expect_invalid_argument([&] { two.check_request(bad); }, "resources_per_trial.gpu");
  }
  GpuPool none({});
  testing::expect_invalid_argument([&] { none.check_request(0.5); }, "0 GPU(s)");
}

TEST(GpuPool, VisibleDevicesComeFromCudaVisibleDevicesWhenSet) {
  EXPECT_EQ(GpuPool::visible_devices(std::string("0,2")), (Ids{"0", "2"}));
  EXPECT_EQ(GpuPool::visible_devices(std::string("GPU-1a2b,GPU-3c4d")),
            (Ids{"GPU-1a2b", "GPU-3c4d"}));
  EXPECT_EQ(GpuPool::visible_devices(std::string("")), Ids{});
  EXPECT_EQ(GpuPool::visible_devices(std::string("-1")), Ids{});
  EXPECT_EQ(GpuPool::visible_devices(std::string("NoDevFiles")), Ids{});
}

}  // namespace
}  // namespace cairn::tune::tuner_internal
