// CUDA devices for Cairn's engine (cairn/device.h): tensors in a GPU's
// memory are saved and loaded like host tensors, copied over PCIe/NVLink by
// the GPU's copy engines.
//
//   auto gpu = cairn::cuda::device(0);
//   StateDict state;
//   state.add_device("w", DType::kF32, {n}, {static_cast<std::byte*>(d_ptr), n * 4}, gpu,
//                    nullptr, /*writable=*/true);
//   saver.save(state, manager);  // returns once the device-to-host copy is complete
//
// The LibTorch adapter (cairn/torch.h) does this for CUDA tensors itself,
// with the caller's current CUDA stream as the producer.
//
// Built only with CAIRN_CUDA (the Cairn::cuda component, which links the CUDA
// runtime); Cairn has no kernels, so only the runtime API is needed.
//
// Ordering: each save or load opens a stream of its own (non-blocking), which
// first waits for an event recorded on the producer's stream at that moment,
// so its copies follow the work queued before the call and run beside the
// work queued after it. Pinning uses cudaHostRegister with the portable flag:
// memory pinned once serves every device of the process.
//
// Failure: a CUDA call that fails throws cairn::Error (kIO) naming the device
// ("cuda:0"), the call and CUDA's message; an index out of range is
// kInvalidArgument. A pin that CUDA refuses is not an error (Device::pin).
//
// Thread-safety: devices may be used from any thread; each call sets the
// calling thread's current device for its own duration and restores it.
#pragma once

#include <functional>
#include <memory>

#include "cairn/device.h"

namespace cairn::cuda {

// The number of CUDA devices the runtime sees (0 without a driver or GPU).
int device_count();

// Returns the producer's stream (a cudaStream_t) when a save or load opens
// its stream; empty means the legacy default stream (stream 0).
using ProducerStream = std::function<void*()>;

// The CUDA device `index`.
std::shared_ptr<const Device> device(int index, ProducerStream producer = {});

}  // namespace cairn::cuda
