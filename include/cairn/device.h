// Device memory: tensors whose bytes live where the CPU cannot read them (a
// GPU's memory), and how Cairn's engine moves them.
//
// A StateDict entry made with StateDict::add_device() records its Device.
// The engine never dereferences such an entry's pointer on the CPU; it moves
// the bytes through a DeviceStream instead:
//   - Saves (save_file, save, save_checkpoint, the managers, sharded saves,
//     StateStager) copy device tensors into host memory first: an
//     AsyncSaver into its staging buffers, which it page-locks ("pins") for
//     the device once and reuses; a synchronous save into a per-process
//     pinned staging buffer that grows with the largest state saved. The
//     copies are ordered after the work the device's producer had queued
//     when the save was called (Device::open_stream), and the save returns,
//     or takes its snapshot, only once they are complete: after that the
//     caller may change the tensors (on any stream) without changing what
//     is written.
//   - Loads (load_into, the managers' restores, sharded loads) read the file
//     through pinned bounce buffers and copy each buffer to the device while
//     the next one is read; checksums are checked over the bytes read, as
//     for host tensors.
// Devices are implemented outside the core library: cairn/cuda.h (built with
// CAIRN_CUDA) for CUDA devices; tests use a fake device whose memory the CPU
// cannot touch.
//
// Failure: a DeviceStream method that fails throws cairn::Error (kIO) naming
// the device and the operation; the engine adds the file and tensor.
//
// Thread-safety: a Device may be used from any thread; a DeviceStream by one
// thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace cairn {

// One ordered queue of copies between host and device memory (a CUDA
// stream). Copies may run asynchronously; their host buffers must stay
// valid, and unchanged for copies to the device, until they complete.
class DeviceStream {
 public:
  virtual ~DeviceStream() = default;
  // Copies `n` bytes from device address `device` to host memory `host`.
  virtual void to_host(void* host, const void* device, size_t n) = 0;
  // Copies `n` bytes from host memory `host` to device address `device`.
  virtual void to_device(void* device, const void* host, size_t n) = 0;
  // A mark after the copies enqueued so far; wait(mark) blocks until they
  // are complete (used to reuse a bounce buffer while later copies run).
  virtual uint64_t mark() = 0;
  virtual void wait(uint64_t mark) = 0;
  // Blocks until every copy enqueued so far is complete.
  virtual void synchronize() = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  // "cuda:0", for messages.
  virtual std::string name() const = 0;
  // A new stream whose copies run after the work the tensors' producer (for
  // CUDA, the caller's current stream) has queued at the time of this call.
  virtual std::unique_ptr<DeviceStream> open_stream() const = 0;
  // Page-locks host memory [data, data + size) for fast, asynchronous copies
  // with this device. Returns false when the memory cannot be pinned (the
  // copies then still work, more slowly): callers fall back, they do not
  // fail. Each successful pin() is undone by one unpin(data).
  virtual bool pin(void* data, size_t size) const = 0;
  virtual void unpin(void* data) const = 0;
};

}  // namespace cairn
