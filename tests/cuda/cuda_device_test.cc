// CUDA devices through the runtime API alone (no LibTorch): device memory
// saved and loaded by the engine, ordering after the producer's stream,
// pinned staging, sharded saves and re-sharded loads, and the errors. Skips
// without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <memory>
#include <vector>

#include "cairn/async_save.h"
#include "cairn/cuda.h"
#include "cairn/error.h"
#include "cairn/sharded.h"
#include "cairn/state.h"
#include "support/errors.h"
#include "support/temp_dir.h"

namespace cairn::testing {
namespace {

class CudaDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  }
};

// Device memory freed with the test.
struct DeviceBuffer {
  explicit DeviceBuffer(size_t n) : size(n) { EXPECT_EQ(cudaMalloc(&ptr, n), cudaSuccess); }
  ~DeviceBuffer() { cudaFree(ptr); }
  std::span<std::byte> span() const { return {static_cast<std::byte*>(ptr), size}; }
  std::vector<std::byte> read() const {
    std::vector<std::byte> out(size);
    EXPECT_EQ(cudaMemcpy(out.data(), ptr, size, cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
  void* ptr = nullptr;
  size_t size;
};

TEST_F(CudaDevice, SavesAndLoadsDeviceMemoryBitForBit) {
  auto gpu = cuda::device(0);
  EXPECT_EQ(gpu->name(), "cuda:0");
  std::vector<std::byte> host(size_t{24} << 20);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<std::byte>((i * 131) >> 3);
  DeviceBuffer d(host.size());
  ASSERT_EQ(cudaMemcpy(d.ptr, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
  StateDict state;
  state.add_device("w", DType::kU8, {host.size()}, d.span(), gpu, nullptr, true);
  TempDir dir;
  save_file(state, dir / "a.safetensors");
  MappedState file = MappedState::open(dir / "a.safetensors");
  TensorView v = file.tensor("w");
  ASSERT_EQ(v.bytes.size(), host.size());
  EXPECT_EQ(std::memcmp(v.bytes.data(), host.data(), host.size()), 0);

  ASSERT_EQ(cudaMemset(d.ptr, 0, host.size()), cudaSuccess);
  load_into(dir / "a.safetensors", state);
  EXPECT_EQ(d.read(), host);
}

TEST_F(CudaDevice, AsyncSnapshotFollowsTheProducersQueuedWorkAndIgnoresLaterWork) {
  cudaStream_t producer;
  ASSERT_EQ(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking), cudaSuccess);
  auto gpu = cuda::device(0, [&] { return static_cast<void*>(producer); });
  const size_t n = size_t{256} << 20;
  DeviceBuffer d(n), big(n);
  ASSERT_EQ(cudaMemset(d.ptr, 0x11, n), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // Queued before the save: slow copies, then the value the file must hold.
  for (int i = 0; i < 20; ++i) {
    ASSERT_EQ(cudaMemcpyAsync(big.ptr, d.ptr, n, cudaMemcpyDeviceToDevice, producer), cudaSuccess);
  }
  ASSERT_EQ(cudaMemsetAsync(d.ptr, 0x22, n, producer), cudaSuccess);
  StateDict state;
  state.add_device("w", DType::kU8, {n}, d.span(), gpu, nullptr, true);
  TempDir dir;
  AsyncSaver saver;
  SaveHandle h = saver.save(state, Checkpoint::from_directory((dir / "cp").string()));
  // Queued after save() returned: must not reach the file.
  ASSERT_EQ(cudaMemsetAsync(d.ptr, 0x33, n, producer), cudaSuccess);
  h.wait();
  MappedState file = MappedState::open(h.checkpoint().storage(), kStateFileName);
  TensorView v = file.tensor("w");
  std::vector<std::byte> want(n, std::byte{0x22});
  EXPECT_EQ(std::memcmp(v.bytes.data(), want.data(), n), 0);
  EXPECT_EQ(saver.stats().staging_pinned_bytes, saver.stats().staging_bytes);
  ASSERT_EQ(cudaStreamSynchronize(producer), cudaSuccess);
  EXPECT_EQ(d.read()[0], std::byte{0x33});
  cudaStreamDestroy(producer);
}

TEST_F(CudaDevice, StagingIsPageLockedMemory) {
  auto gpu = cuda::device(0);
  DeviceBuffer d(size_t{4} << 20);
  StateDict state;
  state.add_device("w", DType::kU8, {d.size}, d.span(), gpu, nullptr, true);
  AsyncSaver saver;
  saver.reserve(state);
  EXPECT_GT(saver.stats().staging_pinned_bytes, 0u);
}

// Two ranks' row halves of a 1001 x 1024 float32 tensor, each in CUDA memory,
// saved synchronously (save_rank_shards + commit_sharded) and asynchronously
// (AsyncSaver::save_sharded), then loaded by three ranks into CUDA memory and
// by one rank whole: every box holds the bytes of the same rows.
TEST_F(CudaDevice, ShardedSavesOfCudaShardsReshardIntoCudaTensorsBitForBit) {
  auto gpu = cuda::device(0);
  const Shape global = {1001, 1024};
  const size_t row = 1024 * 4;
  std::vector<std::byte> host(global[0] * row);
  for (size_t i = 0; i < host.size(); ++i)
    host[i] = static_cast<std::byte>((i * 2654435761u) >> 13);
  auto rows_of = [&](const Box& b) {
    return std::vector<std::byte>(
        host.begin() + static_cast<std::ptrdiff_t>(b.offsets[0] * row),
        host.begin() + static_cast<std::ptrdiff_t>((b.offsets[0] + b.shape[0]) * row));
  };
  std::vector<std::unique_ptr<DeviceBuffer>> held;
  std::vector<ShardedPart> parts;
  for (int r = 0; r < 2; ++r) {
    const Box box = even_split(global, 0, r, 2);
    const std::vector<std::byte> bytes = rows_of(box);
    held.push_back(std::make_unique<DeviceBuffer>(bytes.size()));
    ASSERT_EQ(cudaMemcpy(held.back()->ptr, bytes.data(), bytes.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    ShardedPart p;
    p.rank = r;
    p.state.add_device("w", DType::kF32, box.shape, held.back()->span(), gpu, nullptr, true);
    p.specs["w"] = ShardSpec{global, box.offsets};
    parts.push_back(std::move(p));
  }
  TempDir dir;
  Checkpoint sync_cp = Checkpoint::from_directory((dir / "sync").string());
  std::vector<RankShards> ranks;
  for (const ShardedPart& p : parts) {
    ranks.push_back(save_rank_shards(p.state, p.specs, sync_cp, p.rank));
  }
  commit_sharded(sync_cp, ranks);
  Checkpoint async_cp = Checkpoint::from_directory((dir / "async").string());
  AsyncSaver saver;
  saver.save_sharded(parts, async_cp).wait();

  for (const Checkpoint& cp : {sync_cp, async_cp}) {
    SCOPED_TRACE(cp.uri());
    ShardedReader reader(cp);
    for (int r = 0; r < 3; ++r) {
      const Box box = even_split(global, 0, r, 3);
      DeviceBuffer d(box.shape[0] * row);
      ASSERT_EQ(cudaMemset(d.ptr, 0, d.size), cudaSuccess);
      StateDict local;
      local.add_device("w", DType::kF32, box.shape, d.span(), gpu, nullptr, true);
      reader.load(local, {{"w", ShardSpec{global, box.offsets}}});
      EXPECT_EQ(d.read(), rows_of(box)) << "rank " << r << " of 3";
    }
    DeviceBuffer whole(host.size());
    StateDict all;
    all.add_device("w", DType::kF32, global, whole.span(), gpu, nullptr, true);
    reader.load(all, {});
    EXPECT_EQ(whole.read(), host);
  }
}

TEST_F(CudaDevice, AnIndexOutOfRangeIsAnErrorNamingTheDevice) {
  expect_invalid_argument([] { (void)cuda::device(1000); }, "cuda:1000");
}

}  // namespace
}  // namespace cairn::testing
