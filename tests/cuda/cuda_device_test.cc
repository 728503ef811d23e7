// CUDA devices through the runtime API alone (no LibTorch): device memory
// saved and loaded by the engine, ordering after the producer's stream,
// pinned staging, and the errors. Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cairn/async_save.h"
#include "cairn/cuda.h"
#include "cairn/error.h"
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

TEST_F(CudaDevice, AnIndexOutOfRangeIsAnErrorNamingTheDevice) {
  expect_invalid_argument([] { (void)cuda::device(1000); }, "cuda:1000");
}

}  // namespace
}  // namespace cairn::testing
