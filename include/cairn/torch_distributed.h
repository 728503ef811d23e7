// Data-parallel training (DDP) with LibTorch inside a Trainer's train_fn:
// the ranks of the running group talk through c10d's ProcessGroupGloo,
// rendezvousing at the address and port the driver reserved for this attempt
// (TrainContext::master_addr/master_port). docs/torch.md, "Data-parallel
// training (DDP)", is the guide.
//
//   void train_fn(const nlohmann::json& config) {
//     Net model;                                  // same structure on every rank
//     cairn::libtorch::DistributedDataParallel ddp(*model);  // rank 0's weights everywhere
//     torch::optim::SGD opt(model->parameters(), 0.1);
//     torch::Tensor mine = cairn::libtorch::shard_indices(X.size(0));  // this rank's rows
//     for (...) {
//       opt.zero_grad();
//       loss_of(model, X.index_select(0, mine)).backward();  // gradients averaged over ranks
//       opt.step();                               // identical on every rank
//       cairn::train::report(metrics, same_checkpoint_on_every_rank);
//     }
//   }
//
// Processes and lifetime. A worker is a process of one attempt, so its
// process group is too: process_group() creates it on first use and it
// lives until the worker exits. A restarted group's workers form a new one on
// the attempt's new port.
//
// Failure. Every collective waits at most DistributedOptions::timeout. A rank
// that dies (SIGKILL included) closes its connections, so the others' pending
// or next collective fails at once with cairn::Error(kUnavailable) naming
// this rank and the operation; a rank that stops taking part (hangs, or
// skips a collective) makes the others fail with kTimeout once the timeout
// has passed. Let the error propagate out of train_fn: the Trainer then stops
// the group and restarts it as FailureConfig allows. After such an error the
// process group is unusable (a later call fails too).
//
// Devices. Tensors must be on the CPU. Debian's LibTorch is built without
// CUDA, so there is no NCCL backend; Gloo's CPU collectives are used.
//
// Thread-safety: the process group's collectives are matched across ranks in
// the order they are issued, so issue them from one thread (train_fn's).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

namespace cairn::libtorch {

struct DistributedOptions {
  // Longest wait of one collective (all_reduce, broadcast, barrier) for the
  // other ranks.
  std::chrono::milliseconds timeout{60'000};
  // Longest wait to join: for rank 0's store to accept the connection, and
  // for every rank to arrive and connect to every other.
  std::chrono::milliseconds rendezvous_timeout{60'000};
};

// The ranks of the running Trainer group (one per worker), as one
// communicator. Every member function is collective: every rank calls the
// same ones, in the same order, with tensors of the same shapes and dtypes.
// Each blocks until the operation completes on this rank and throws
// cairn::Error as the file comment says.
class ProcessGroup {
 public:
  ProcessGroup(c10::intrusive_ptr<c10d::ProcessGroup> group, DistributedOptions options);

  int rank() const { return group_->getRank(); }
  int size() const { return group_->getSize(); }

  // In place on every rank: each tensor becomes the sum (or `op`) over the
  // ranks.
  void all_reduce(std::vector<torch::Tensor>& tensors,
                  c10d::ReduceOp op = c10d::ReduceOp::SUM) const;
  void all_reduce(torch::Tensor& tensor, c10d::ReduceOp op = c10d::ReduceOp::SUM) const;
  // In place: every rank's tensors become rank `root`'s.
  void broadcast(std::vector<torch::Tensor>& tensors, int root = 0) const;
  void barrier() const;
  // Every rank's `tensor`, by rank.
  std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor) const;

  // c10d's group itself, for operations not wrapped here (all_gather, ...).
  // Its errors are c10::Error, not cairn::Error.
  const c10::intrusive_ptr<c10d::ProcessGroup>& c10d() const { return group_; }
  const DistributedOptions& options() const { return options_; }

 private:
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const char* operation,
            const std::vector<torch::Tensor>& tensors) const;

  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  DistributedOptions options_;
};

// This worker's process group over every rank, created on the first call
// (collective then: every rank must call it; it returns when all have
// joined, or throws kTimeout/kUnavailable after options.rendezvous_timeout
// naming the rendezvous address and port) with `options`; later calls
// return the same group and must pass the same options (else
// kInvalidArgument). Outside a Trainer worker (no train::get_context()):
// kFailedPrecondition.
ProcessGroup& process_group(const DistributedOptions& options = {});

struct DataParallelOptions {
  // Gradients of one dtype are flattened into buckets of about this many
  // bytes (a tensor larger than that gets one of its own), one all-reduce
  // each, as PyTorch DDP's bucket_cap_mb = 25.
  int64_t bucket_bytes = 25 << 20;
};

// Data parallelism over a module, as PyTorch's DistributedDataParallel:
// construct it on every rank over modules of the same structure, call
// loss.backward() (or backward(loss), the same) every step on every rank,
// then step the optimizer. At the end of every backward pass that
// accumulates into the parameters' gradients, autograd hooks on their
// gradient accumulators (registered here, removed by the destructor) average
// the gradients over the ranks, so every rank then holds the same gradients,
// bit for bit, and the same optimizer keeps every rank's weights bitwise
// identical. A collective failure in that averaging is thrown by
// loss.backward() as the cairn::Error the file comment describes.
// torch::autograd::grad(), which does not accumulate into .grad, averages
// nothing. Several backward passes before a step (gradient accumulation)
// each average what has accumulated so far, which is the same mean.
//
// Parameters are those of module.parameters() that require a gradient, in
// that order. A parameter without a gradient on a rank (not used in its
// forward pass) counts as zeros there, so the collectives stay matched, and
// gets the averaged gradient like the others. Every rank must run the same
// backward passes over the model (at least one of its parameters taking
// part in each), as the collectives are matched in order.
//
// The module must outlive this object and keep its parameters (their
// number, order, shapes and dtypes). Move-only. Not thread-safe.
class DistributedDataParallel {
 public:
  // Collective. Checks that every rank's module has the same parameters and
  // buffers (counts, shapes and dtypes; kInvalidArgument otherwise, on every
  // rank), then copies rank 0's parameters and buffers to every rank, and
  // hooks the parameters' gradient accumulators.
  // kInvalidArgument for a tensor not on the CPU or a sparse one.
  explicit DistributedDataParallel(torch::nn::Module& module, ProcessGroup& group = process_group(),
                                   DataParallelOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(DistributedDataParallel&&) noexcept;
  DistributedDataParallel& operator=(DistributedDataParallel&&) noexcept;
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // loss.backward(), which averages the gradients.
  void backward(const torch::Tensor& loss);
  // Collective. Every parameter's gradient becomes the mean over the ranks,
  // unless they already are since the last backward pass (then it does
  // nothing, on every rank alike).
  void all_reduce_gradients();
  // Collective. Every rank's parameters and buffers become rank `root`'s.
  void broadcast_state(int root = 0);

  torch::nn::Module& module() const;
  ProcessGroup& group() const;
  // The buckets' parameter indices (into the parameters above), in the
  // order they are all-reduced.
  const std::vector<std::vector<size_t>>& buckets() const;

  // What the object and its autograd hooks share (distributed.cc).
  struct State;

 private:
  std::shared_ptr<State> state_;
};

// prepare_model(module): Ray Train's name for the same thing.
inline DistributedDataParallel prepare_model(torch::nn::Module& module,
                                             DataParallelOptions options = {}) {
  return DistributedDataParallel(module, process_group(), options);
}

struct ShardOptions {
  // A permutation of the whole dataset first, the same on every rank for
  // the same seed and epoch (set the epoch each epoch for a new order).
  bool shuffle = false;
  uint64_t seed = 0;
  int64_t epoch = 0;
  // Drop the tail that does not divide evenly; otherwise the first indices
  // are repeated so that every rank gets the same count.
  bool drop_last = false;
};

// The dataset rows (int64 indices, for index_select) rank `rank` of
// `world_size` trains on, as PyTorch's DistributedSampler: rows rank,
// rank + world_size, rank + 2 * world_size, ... of the (padded or cut,
// perhaps shuffled) order. Every rank gets the same count, so the ranks
// take the same number of steps. Pure. kInvalidArgument for a rank outside
// [0, world_size) or a negative size.
torch::Tensor shard_indices(int64_t dataset_size, int rank, int world_size,
                            const ShardOptions& options = {});
// The same for the running worker's rank and world size (train::get_context()).
torch::Tensor shard_indices(int64_t dataset_size, const ShardOptions& options = {});

}  // namespace cairn::libtorch
