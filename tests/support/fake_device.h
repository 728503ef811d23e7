// Test support: a Device (cairn/device.h) without a GPU, strict enough to
// catch an engine that treats device memory as host memory or forgets to
// wait for a copy.
//
//   - Its memory is a memfd mapped twice: at the addresses handed out by
//     allocate() it is PROT_NONE, so any CPU read or write of a device
//     tensor crashes the test; the fake's own copies go through a second,
//     read-write mapping.
//   - Copies run on each stream's own thread, each after copy_delay, so a
//     caller that does not wait (mark/wait, synchronize) sees stale bytes.
//   - A producer queue runs "kernels" (fills of device memory) in order on
//     another thread; a stream's copies wait for every kernel queued before
//     the stream was opened, as a CUDA stream ordered after the training
//     stream's pending work does.
//   - pin() can be refused and copies made to fail; counters tell how often
//     each thing happened and whether host memory was pinned when copied.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "cairn/device.h"

namespace cairn::testing {

class FakeDevice : public Device, public std::enable_shared_from_this<FakeDevice> {
 public:
  // A device of `capacity` bytes of memory.
  static std::shared_ptr<FakeDevice> create(size_t capacity);
  ~FakeDevice() override;

  // `n` bytes of device memory, 256-byte aligned (never freed).
  std::span<std::byte> allocate(size_t n);
  // Test-side access to device memory, immediate (not ordered with kernels).
  void write(std::span<std::byte> device, std::span<const std::byte> host);
  std::vector<std::byte> read(std::span<const std::byte> device) const;
  // Queues a kernel that, after `delay`, fills `device` with `value`.
  void enqueue_fill(std::span<std::byte> device, std::byte value,
                    std::chrono::milliseconds delay = std::chrono::milliseconds(0));
  // Waits for every queued kernel.
  void drain();

  void set_copy_delay(std::chrono::microseconds d) { copy_delay_us_ = d.count(); }
  void refuse_pin(bool refuse) { refuse_pin_ = refuse; }
  void fail_copies(bool fail) { fail_copies_ = fail; }

  struct Counters {
    uint64_t streams = 0;
    uint64_t pins = 0;
    uint64_t unpins = 0;
    uint64_t to_host = 0;
    uint64_t to_device = 0;
    uint64_t unpinned_copies = 0;  // copies whose host side was not pinned
    uint64_t pinned_bytes = 0;     // pinned now
  };
  Counters counters() const;

  // Device
  std::string name() const override { return "fake:0"; }
  std::unique_ptr<DeviceStream> open_stream() const override;
  bool pin(void* data, size_t size) const override;
  void unpin(void* data) const override;

  // For the stream: host address of device memory [p, p + n); throws
  // kInternal when the range is not device memory.
  std::byte* backing(const void* p, size_t n) const;
  bool host_pinned(const void* p, size_t n) const;
  void count_copy(bool to_host, const void* host, size_t n) const;
  // Blocks until the producer has run `ticket` kernels.
  void wait_producer(uint64_t ticket) const;
  uint64_t producer_ticket() const;
  std::chrono::microseconds copy_delay() const {
    return std::chrono::microseconds(copy_delay_us_.load());
  }
  bool copies_fail() const { return fail_copies_; }

 private:
  FakeDevice() = default;
  void run_producer();

  int fd_ = -1;
  size_t capacity_ = 0;
  std::byte* device_ = nullptr;   // PROT_NONE view
  std::byte* backing_ = nullptr;  // read-write view
  std::atomic<int64_t> copy_delay_us_{0};
  std::atomic<bool> refuse_pin_{false};
  std::atomic<bool> fail_copies_{false};

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  size_t used_ = 0;
  struct Kernel {
    std::span<std::byte> device;
    std::byte value;
    std::chrono::milliseconds delay;
  };
  std::deque<Kernel> kernels_;
  uint64_t queued_ = 0, done_ = 0;
  bool stopping_ = false;
  mutable Counters counters_;
  mutable std::map<const std::byte*, size_t> pinned_;
  std::thread producer_;
};

}  // namespace cairn::testing
