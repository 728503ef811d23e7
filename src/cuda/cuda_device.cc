// CUDA devices (cairn/cuda.h) through the CUDA runtime API.
#include "cairn/cuda.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cairn/error.h"
#include "util/log.h"

namespace cairn::cuda {

namespace {

void check(cudaError_t status, const std::string& device, const char* call) {
  if (status == cudaSuccess) return;
  cudaGetLastError();  // clear a sticky-free error so later calls start clean
  throw Error(ErrorCode::kIO,
              fmt::format("{}: {} failed: {}", device, call, cudaGetErrorString(status)));
}

// Makes `index` the calling thread's current device for the guard's life.
class DeviceGuard {
 public:
  DeviceGuard(int index, const std::string& name) {
    check(cudaGetDevice(&previous_), name, "cudaGetDevice");
    if (previous_ != index) check(cudaSetDevice(index), name, "cudaSetDevice");
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }  // ignore-error: restoring is best effort
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

class CudaStream : public DeviceStream {
 public:
  CudaStream(int index, std::string name, cudaStream_t producer)
      : index_(index), name_(std::move(name)) {
    DeviceGuard g(index_, name_);
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), name_,
          "cudaStreamCreateWithFlags");
    try {
      // The copies follow the work the producer has queued so far.
      cudaEvent_t queued = new_event();
      check(cudaEventRecord(queued, producer), name_, "cudaEventRecord");
      check(cudaStreamWaitEvent(stream_, queued, 0), name_, "cudaStreamWaitEvent");
    } catch (...) {
      release();
      throw;
    }
  }

  ~CudaStream() override { release(); }

  void to_host(void* host, const void* device, size_t n) override {
    DeviceGuard g(index_, name_);
    check(cudaMemcpyAsync(host, device, n, cudaMemcpyDeviceToHost, stream_), name_,
          "cudaMemcpyAsync (device to host)");
  }

  void to_device(void* device, const void* host, size_t n) override {
    DeviceGuard g(index_, name_);
    check(cudaMemcpyAsync(device, host, n, cudaMemcpyHostToDevice, stream_), name_,
          "cudaMemcpyAsync (host to device)");
  }

  uint64_t mark() override {
    DeviceGuard g(index_, name_);
    cudaEvent_t e = new_event();
    check(cudaEventRecord(e, stream_), name_, "cudaEventRecord");
    return events_.size();  // the event's index + 1
  }

  void wait(uint64_t mark) override {
    if (mark == 0 || mark > events_.size()) return;
    DeviceGuard g(index_, name_);
    check(cudaEventSynchronize(events_[mark - 1]), name_, "cudaEventSynchronize");
  }

  void synchronize() override {
    DeviceGuard g(index_, name_);
    check(cudaStreamSynchronize(stream_), name_, "cudaStreamSynchronize");
  }

 private:
  cudaEvent_t new_event() {
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), name_, "cudaEventCreate");
    events_.push_back(e);
    return e;
  }

  void release() {
    // ignore-error: a destructor cannot throw; a failed copy was reported by
    // synchronize() or wait(), and the stream must be waited for before the
    // buffers its copies use are freed.
    if (stream_) cudaStreamSynchronize(stream_);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    events_.clear();
    if (stream_) cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }

  int index_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> events_;
};

class CudaDevice : public Device {
 public:
  CudaDevice(int index, ProducerStream producer)
      : index_(index), name_(fmt::format("cuda:{}", index)), producer_(std::move(producer)) {}

  std::string name() const override { return name_; }

  std::unique_ptr<DeviceStream> open_stream() const override {
    auto producer = static_cast<cudaStream_t>(producer_ ? producer_() : nullptr);
    return std::make_unique<CudaStream>(index_, name_, producer);
  }

  bool pin(void* data, size_t size) const override {
    DeviceGuard g(index_, name_);
    cudaError_t status = cudaHostRegister(data, size, cudaHostRegisterPortable);
    if (status == cudaSuccess) return true;
    cudaGetLastError();
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      log::warn(
          fmt::format("{}: cannot pin {} bytes of staging memory ({}); device copies use "
                      "pageable memory and are slower",
                      name_, size, cudaGetErrorString(status)));
    }
    return false;
  }

  void unpin(void* data) const override {
    DeviceGuard g(index_, name_);
    cudaHostUnregister(data);  // ignore-error: nothing to do if unregistering fails
    cudaGetLastError();
  }

 private:
  int index_;
  std::string name_;
  ProducerStream producer_;
};

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::shared_ptr<const Device> device(int index, ProducerStream producer) {
  const int count = device_count();
  if (index < 0 || index >= count) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("cuda:{}: no such CUDA device ({} present)", index, count));
  }
  return std::make_shared<CudaDevice>(index, std::move(producer));
}

}  // namespace cairn::cuda
