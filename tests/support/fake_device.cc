#include "support/fake_device.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <stdexcept>

#include "cairn/error.h"

namespace cairn::testing {

namespace {

// One stream: its operations run in order on its own thread.
class FakeStream : public DeviceStream {
 public:
  FakeStream(std::shared_ptr<const FakeDevice> device, uint64_t ticket)
      : device_(std::move(device)), ticket_(ticket), worker_([this] { run(); }) {}

  ~FakeStream() override {
    {
      std::lock_guard<std::mutex> g(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  void to_host(void* host, const void* device, size_t n) override {
    std::byte* from = device_->backing(device, n);
    device_->count_copy(true, host, n);
    push([=] { std::memcpy(host, from, n); });
  }

  void to_device(void* device, const void* host, size_t n) override {
    std::byte* to = device_->backing(device, n);
    device_->count_copy(false, host, n);
    push([=] { std::memcpy(to, host, n); });
  }

  uint64_t mark() override {
    std::lock_guard<std::mutex> g(mu_);
    return queued_;
  }

  void wait(uint64_t mark) override {
    std::unique_lock<std::mutex> g(mu_);
    cv_.wait(g, [&] { return done_ >= mark; });
    if (failed_) throw Error(ErrorCode::kIO, "fake:0: a copy failed");
  }

  void synchronize() override { wait(mark()); }

 private:
  void push(std::function<void()> op) {
    std::lock_guard<std::mutex> g(mu_);
    ops_.push_back(std::move(op));
    ++queued_;
    cv_.notify_all();
  }

  void run() {
    device_->wait_producer(ticket_);
    for (;;) {
      std::function<void()> op;
      {
        std::unique_lock<std::mutex> g(mu_);
        cv_.wait(g, [&] { return stopping_ || !ops_.empty(); });
        if (ops_.empty()) return;
        op = std::move(ops_.front());
        ops_.pop_front();
      }
      const auto delay = device_->copy_delay();
      if (delay.count() > 0) std::this_thread::sleep_for(delay);
      const bool fail = device_->copies_fail();
      if (!fail) op();
      {
        std::lock_guard<std::mutex> g(mu_);
        if (fail) failed_ = true;
        ++done_;
      }
      cv_.notify_all();
    }
  }

  std::shared_ptr<const FakeDevice> device_;
  uint64_t ticket_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> ops_;
  uint64_t queued_ = 0, done_ = 0;
  bool failed_ = false;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace

std::shared_ptr<FakeDevice> FakeDevice::create(size_t capacity) {
  std::shared_ptr<FakeDevice> d(new FakeDevice());
  d->capacity_ = (capacity + 4095) / 4096 * 4096;
  d->fd_ = ::memfd_create("cairn-fake-device", MFD_CLOEXEC);
  if (d->fd_ < 0 || ::ftruncate(d->fd_, static_cast<off_t>(d->capacity_)) != 0) {
    throw std::runtime_error("fake device: memfd");
  }
  void* dev = ::mmap(nullptr, d->capacity_, PROT_NONE, MAP_SHARED, d->fd_, 0);
  void* back = ::mmap(nullptr, d->capacity_, PROT_READ | PROT_WRITE, MAP_SHARED, d->fd_, 0);
  if (dev == MAP_FAILED || back == MAP_FAILED) throw std::runtime_error("fake device: mmap");
  d->device_ = static_cast<std::byte*>(dev);
  d->backing_ = static_cast<std::byte*>(back);
  d->producer_ = std::thread([raw = d.get()] { raw->run_producer(); });
  return d;
}

FakeDevice::~FakeDevice() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (producer_.joinable()) producer_.join();
  if (device_) ::munmap(device_, capacity_);
  if (backing_) ::munmap(backing_, capacity_);
  if (fd_ >= 0) ::close(fd_);
}

std::span<std::byte> FakeDevice::allocate(size_t n) {
  std::lock_guard<std::mutex> g(mu_);
  const size_t at = (used_ + 255) / 256 * 256;
  if (at + n > capacity_) throw std::runtime_error("fake device: out of memory");
  used_ = at + n;
  return {device_ + at, n};
}

std::byte* FakeDevice::backing(const void* p, size_t n) const {
  const auto* b = static_cast<const std::byte*>(p);
  if (b < device_ || b + n > device_ + capacity_) {
    throw Error(ErrorCode::kInternal, "fake:0: a device copy of memory that is not the device's");
  }
  return backing_ + (b - device_);
}

void FakeDevice::write(std::span<std::byte> device, std::span<const std::byte> host) {
  if (host.empty()) return;
  std::memcpy(backing(device.data(), host.size()), host.data(), host.size());
}

std::vector<std::byte> FakeDevice::read(std::span<const std::byte> device) const {
  const std::byte* from = backing(device.data(), device.size());
  return {from, from + device.size()};
}

void FakeDevice::enqueue_fill(std::span<std::byte> device, std::byte value,
                              std::chrono::milliseconds delay) {
  backing(device.data(), device.size());
  std::lock_guard<std::mutex> g(mu_);
  kernels_.push_back({device, value, delay});
  ++queued_;
  cv_.notify_all();
}

void FakeDevice::drain() { wait_producer(producer_ticket()); }

uint64_t FakeDevice::producer_ticket() const {
  std::lock_guard<std::mutex> g(mu_);
  return queued_;
}

void FakeDevice::wait_producer(uint64_t ticket) const {
  std::unique_lock<std::mutex> g(mu_);
  cv_.wait(g, [&] { return done_ >= ticket || stopping_; });
}

void FakeDevice::run_producer() {
  for (;;) {
    Kernel k;
    {
      std::unique_lock<std::mutex> g(mu_);
      cv_.wait(g, [&] { return stopping_ || !kernels_.empty(); });
      if (kernels_.empty()) return;
      k = kernels_.front();
      kernels_.pop_front();
    }
    if (k.delay.count() > 0) std::this_thread::sleep_for(k.delay);
    std::memset(backing(k.device.data(), k.device.size()), static_cast<int>(k.value),
                k.device.size());
    {
      std::lock_guard<std::mutex> g(mu_);
      ++done_;
    }
    cv_.notify_all();
  }
}

std::unique_ptr<DeviceStream> FakeDevice::open_stream() const {
  {
    std::lock_guard<std::mutex> g(mu_);
    ++counters_.streams;
  }
  return std::make_unique<FakeStream>(shared_from_this(), producer_ticket());
}

bool FakeDevice::pin(void* data, size_t size) const {
  if (refuse_pin_) return false;
  std::lock_guard<std::mutex> g(mu_);
  auto* b = static_cast<const std::byte*>(data);
  if (pinned_.count(b)) throw Error(ErrorCode::kInternal, "fake:0: memory pinned twice");
  pinned_[b] = size;
  ++counters_.pins;
  counters_.pinned_bytes += size;
  return true;
}

void FakeDevice::unpin(void* data) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = pinned_.find(static_cast<const std::byte*>(data));
  if (it == pinned_.end()) throw Error(ErrorCode::kInternal, "fake:0: unpin of unpinned memory");
  counters_.pinned_bytes -= it->second;
  pinned_.erase(it);
  ++counters_.unpins;
}

bool FakeDevice::host_pinned(const void* p, size_t n) const {
  auto* b = static_cast<const std::byte*>(p);
  auto it = pinned_.upper_bound(b);
  if (it == pinned_.begin()) return false;
  --it;
  return b + n <= it->first + it->second;
}

void FakeDevice::count_copy(bool to_host, const void* host, size_t n) const {
  std::lock_guard<std::mutex> g(mu_);
  ++(to_host ? counters_.to_host : counters_.to_device);
  if (!host_pinned(host, n)) ++counters_.unpinned_copies;
}

FakeDevice::Counters FakeDevice::counters() const {
  std::lock_guard<std::mutex> g(mu_);
  return counters_;
}

}  // namespace cairn::testing
