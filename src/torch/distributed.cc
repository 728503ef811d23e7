// Data-parallel training over c10d's ProcessGroupGloo (cairn/torch_distributed.h).
//
// Rendezvous: rank 0 runs a c10d::TCPStore server on the port the driver
// reserved for this attempt (bound with SO_REUSEADDR and never listening,
// so the store can still listen on it), the others connect to it, and
// ProcessGroupGloo exchanges every rank's Gloo address through the store and
// connects every pair. Each worker is a forked process of one attempt, so a
// process-wide group is per attempt.
#include "cairn/torch_distributed.h"

#include <netinet/in.h>
#include <unistd.h>

#include <arpa/inet.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "cairn/error.h"
#include "cairn/train.h"
#include "util/settings.h"

namespace cairn::libtorch {

namespace {

int64_t bytes_of(const std::vector<torch::Tensor>& tensors) {
  int64_t n = 0;
  for (const auto& t : tensors) n += t.numel() * static_cast<int64_t>(t.element_size());
  return n;
}

// An exception's message without c10's backtrace (c10::Error::what() has one).
std::string message_of(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

bool is_loopback(const std::string& address) {
  in_addr a4{};
  if (::inet_pton(AF_INET, address.c_str(), &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
  in6_addr a6{};
  if (::inet_pton(AF_INET6, address.c_str(), &a6) == 1) return IN6_IS_ADDR_LOOPBACK(&a6);
  return address == "localhost";
}

// Where this rank's Gloo endpoint listens for its peers: on loopback when the
// whole group is on one node (the rendezvous is there), else on
// $GLOO_SOCKET_IFNAME's interface, else the address this host name resolves
// to (Gloo falls back to loopback if it resolves to none).
std::shared_ptr<::gloo::transport::Device> gloo_device(const std::string& master_addr) {
  if (is_loopback(master_addr)) return c10d::ProcessGroupGloo::createDeviceForHostname(master_addr);
  if (std::string ifname = Settings::from(Environment::process()).gloo_socket_ifname;
      !ifname.empty()) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

struct Joined {
  pid_t pid = 0;
  std::unique_ptr<ProcessGroup> group;
};

Joined& joined() {
  static auto* j = new Joined;  // never destroyed: a worker leaves with _exit()
  return *j;
}

std::unique_ptr<ProcessGroup> join(const TrainContext& c, const DistributedOptions& options) {
  const std::string where = fmt::format("{}:{}", c.master_addr, c.master_port);
  if (c.master_port <= 0 || c.master_port > 65535 || c.master_addr.empty()) {
    throw Error(ErrorCode::kFailedPrecondition,
                fmt::format("rank {}: this worker has no rendezvous address (master_addr \"{}\", "
                            "master_port {})",
                            c.world_rank, c.master_addr, c.master_port));
  }
  try {
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<std::uint16_t>(c.master_port);
    store_options.isServer = c.world_rank == 0;
    store_options.numWorkers = static_cast<size_t>(c.world_size);
    store_options.waitWorkers = false;  // ProcessGroupGloo waits for every rank itself
    // Also the store's wait while ProcessGroupGloo connects every pair.
    store_options.timeout = options.rendezvous_timeout;
    auto store = c10::make_intrusive<c10d::TCPStore>(c.master_addr, store_options);
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
    gloo_options->devices.push_back(gloo_device(c.master_addr));
    auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, c.world_rank, c.world_size,
                                                            gloo_options);
    // A c10d::ProcessGroup dispatches to a backend per device type (PyTorch
    // 2): Gloo serves the CPU tensors.
    auto group = c10::make_intrusive<c10d::ProcessGroup>(store, c.world_rank, c.world_size);
    group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
    group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
    return std::make_unique<ProcessGroup>(std::move(group), options);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    const std::string what = message_of(e);
    const bool timed_out =
        what.find("imeout") != std::string::npos || what.find("imed out") != std::string::npos;
    throw Error(timed_out ? ErrorCode::kTimeout : ErrorCode::kUnavailable,
                fmt::format("rank {} of {}: could not join the process group at rendezvous {} "
                            "(attempt {}; rendezvous_timeout {} ms): {}",
                            c.world_rank, c.world_size, where, c.attempt,
                            options.rendezvous_timeout.count(), what));
  }
}

}  // namespace

ProcessGroup::ProcessGroup(c10::intrusive_ptr<c10d::ProcessGroup> group, DistributedOptions options)
    : group_(std::move(group)), options_(options) {}

void ProcessGroup::wait(const c10::intrusive_ptr<c10d::Work>& work, const char* operation,
                        const std::vector<torch::Tensor>& tensors) const {
  try {
    work->wait(options_.timeout);
  } catch (const std::exception& e) {
    const std::string what = message_of(e);
    const bool timed_out =
        what.find("imeout") != std::string::npos || what.find("imed out") != std::string::npos;
    throw Error(
        timed_out ? ErrorCode::kTimeout : ErrorCode::kUnavailable,
        fmt::format("rank {} of {}: {} of {} tensor(s) ({} bytes) failed ({}; timeout "
                    "{} ms): {}",
                    rank(), size(), operation, tensors.size(), bytes_of(tensors),
                    timed_out ? "another rank did not take part in time" : "another rank is gone",
                    options_.timeout.count(), what));
  }
}

void ProcessGroup::all_reduce(std::vector<torch::Tensor>& tensors, c10d::ReduceOp op) const {
  c10d::AllreduceOptions o;
  o.reduceOp = op;
  o.timeout = options_.timeout;
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = group_->allreduce(tensors, o);
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kUnavailable,
                fmt::format("rank {} of {}: all_reduce of {} tensor(s) could not start: {}", rank(),
                            size(), tensors.size(), message_of(e)));
  }
  wait(work, "all_reduce", tensors);
}

void ProcessGroup::all_reduce(torch::Tensor& tensor, c10d::ReduceOp op) const {
  std::vector<torch::Tensor> one{tensor};
  all_reduce(one, op);
}

void ProcessGroup::broadcast(std::vector<torch::Tensor>& tensors, int root) const {
  if (root < 0 || root >= size()) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("rank {}: broadcast from rank {}, but the group has ranks 0 to {}",
                            rank(), root, size() - 1));
  }
  c10d::BroadcastOptions o;
  o.rootRank = root;
  o.timeout = options_.timeout;
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = group_->broadcast(tensors, o);
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kUnavailable,
                fmt::format("rank {} of {}: broadcast of {} tensor(s) could not start: {}", rank(),
                            size(), tensors.size(), message_of(e)));
  }
  wait(work, "broadcast", tensors);
}

void ProcessGroup::barrier() const {
  c10d::BarrierOptions o;
  o.timeout = options_.timeout;
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = group_->barrier(o);
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kUnavailable, fmt::format("rank {} of {}: barrier could not start: {}",
                                                     rank(), size(), message_of(e)));
  }
  wait(work, "barrier", {});
}

ProcessGroup& process_group(const DistributedOptions& options) {
  TrainContext context;
  try {
    context = train::get_context();
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kFailedPrecondition) throw;
    throw Error(ErrorCode::kFailedPrecondition,
                "cairn::libtorch::process_group() called outside a Trainer worker; call it "
                "inside the train_fn run by Trainer::fit()");
  }
  Joined& j = joined();
  if (j.group && j.pid != ::getpid()) {
    throw Error(ErrorCode::kFailedPrecondition,
                fmt::format("rank {}: process_group() called in a process forked from the "
                            "worker that created it (pid {}); only that process may use it",
                            context.world_rank, j.pid));
  }
  if (!j.group) {
    j.group = join(context, options);
    j.pid = ::getpid();
    return *j.group;
  }
  const DistributedOptions& had = j.group->options();
  if (had.timeout != options.timeout || had.rendezvous_timeout != options.rendezvous_timeout) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("rank {}: process_group() was created with timeout {} ms and "
                            "rendezvous_timeout {} ms; it cannot be asked for again with {} ms "
                            "and {} ms",
                            context.world_rank, had.timeout.count(), had.rendezvous_timeout.count(),
                            options.timeout.count(), options.rendezvous_timeout.count()));
  }
  return *j.group;
}

std::vector<torch::Tensor> ProcessGroup::all_gather(const torch::Tensor& tensor) const {
  std::vector<std::vector<torch::Tensor>> outputs(1);
  for (int r = 0; r < size(); ++r) outputs[0].push_back(torch::empty_like(tensor));
  std::vector<torch::Tensor> inputs{tensor};
  c10d::AllgatherOptions o;
  o.timeout = options_.timeout;
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = group_->allgather(outputs, inputs, o);
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kUnavailable,
                fmt::format("rank {} of {}: all_gather could not start: {}", rank(), size(),
                            message_of(e)));
  }
  wait(work, "all_gather", inputs);
  return outputs[0];
}

// ---------------------------------------------------------------- DDP

namespace {

void check_dense_cpu(const torch::Tensor& t, const std::string& name, const char* kind) {
  if (!t.device().is_cpu()) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{} \"{}\" is on {}; data-parallel training here needs CPU tensors "
                            "(this LibTorch has no NCCL)",
                            kind, name, t.device().str()));
  }
  if (t.layout() != torch::kStrided) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{} \"{}\" is not a dense tensor", kind, name));
  }
}

// Consecutive runs of one dtype's tensors, in order, each up to `cap` bytes
// (a larger tensor alone): a bucket is closed when the next tensor of its
// dtype would overflow it. Only shapes and dtypes decide, so every rank
// plans the same buckets.
std::vector<std::vector<size_t>> plan_buckets(const std::vector<torch::Tensor>& tensors,
                                              int64_t cap) {
  std::vector<std::vector<size_t>> buckets;
  std::map<torch::ScalarType, std::pair<size_t, int64_t>> open;  // dtype -> bucket, bytes
  for (size_t i = 0; i < tensors.size(); ++i) {
    const torch::Tensor& t = tensors[i];
    const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
    auto it = open.find(t.scalar_type());
    if (it == open.end() || it->second.second + bytes > cap) {
      buckets.emplace_back();
      it = open.insert_or_assign(t.scalar_type(), std::make_pair(buckets.size() - 1, int64_t{0}))
               .first;
    }
    buckets[it->second.first].push_back(i);
    it->second.second += bytes;
  }
  return buckets;
}

int64_t numel_of(const std::vector<torch::Tensor>& tensors, const std::vector<size_t>& bucket) {
  int64_t n = 0;
  for (size_t i : bucket) n += tensors[i].numel();
  return n;
}

// FNV-1a, so that every rank computes the same value.
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

// What the autograd hooks and the object share: a DistributedDataParallel
// may be moved while its hooks stay registered on the parameters, and a hook
// may outlive it inside a graph still being run.
struct DistributedDataParallel::State {
  torch::nn::Module* module = nullptr;
  ProcessGroup* group = nullptr;
  std::vector<torch::Tensor> params;  // those that require a gradient
  std::vector<std::vector<size_t>> buckets;
  int64_t bucket_bytes = 0;
  // Each parameter's gradient accumulator (kept alive, as the tensor holds
  // it weakly) and the key of the hook registered on it.
  std::vector<std::pair<c10::intrusive_ptr<torch::autograd::Node>, uintptr_t>> hooks;
  bool callback_queued = false;  // in the backward pass now running
  bool averaged = false;         // gradients are the ranks' mean since the last backward pass

  void average();
};

namespace {

// Registered on every parameter's gradient accumulator: the first one to run
// in a backward pass queues the averaging for the end of that pass, when
// every gradient of it has been accumulated (PyTorch's DDP finalizes its
// reducer the same way). Only gradients accumulated into .grad run these
// hooks: torch::autograd::grad() leaves them alone.
void on_gradient_accumulated(const std::weak_ptr<DistributedDataParallel::State>& weak) {
  std::shared_ptr<DistributedDataParallel::State> state = weak.lock();
  if (!state) return;
  state->averaged = false;
  if (state->callback_queued) return;
  state->callback_queued = true;
  torch::autograd::Engine::get_default_engine().queue_callback([weak] {
    std::shared_ptr<DistributedDataParallel::State> s = weak.lock();
    if (!s) return;
    s->callback_queued = false;
    // A failure (a rank gone, a timeout) is rethrown by backward() as the
    // cairn::Error it is.
    s->average();
    s->averaged = true;
  });
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(torch::nn::Module& module, ProcessGroup& group,
                                                 DataParallelOptions options)
    : state_(std::make_shared<State>()) {
  State& s = *state_;
  s.module = &module;
  s.group = &group;
  s.bucket_bytes = options.bucket_bytes;
  if (s.bucket_bytes <= 0) {
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("DataParallelOptions::bucket_bytes must be positive, got {}", s.bucket_bytes));
  }
  // Every rank must hold the same parameters and buffers: a signature of
  // names, shapes, dtypes and which need a gradient, compared across ranks
  // before any collective depends on it.
  std::string signature;
  for (const auto& item : module.named_parameters()) {
    check_dense_cpu(item.value(), item.key(), "parameter");
    signature +=
        fmt::format("p {} {} {} {};", item.key(), fmt::join(item.value().sizes(), "x"),
                    c10::toString(item.value().scalar_type()), item.value().requires_grad());
    if (item.value().requires_grad()) s.params.push_back(item.value());
  }
  for (const auto& item : module.named_buffers()) {
    check_dense_cpu(item.value(), item.key(), "buffer");
    signature += fmt::format("b {} {} {};", item.key(), fmt::join(item.value().sizes(), "x"),
                             c10::toString(item.value().scalar_type()));
  }
  const int64_t mine = static_cast<int64_t>(fnv1a(signature));
  std::vector<torch::Tensor> all = group.all_gather(torch::tensor({mine}, torch::kLong));
  std::vector<int> differ;
  for (int r = 1; r < group.size(); ++r) {
    if (all[static_cast<size_t>(r)].item<int64_t>() != all[0].item<int64_t>()) differ.push_back(r);
  }
  if (!differ.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("rank {}: DistributedDataParallel needs the same module on every "
                            "rank, but rank(s) {} hold parameters or buffers (names, shapes, "
                            "dtypes) that differ from rank 0's",
                            group.rank(), fmt::join(differ, ", ")));
  }
  s.buckets = plan_buckets(s.params, s.bucket_bytes);
  broadcast_state(0);
  // Plain loss.backward() averages the gradients, as with PyTorch's DDP.
  std::weak_ptr<State> weak = state_;
  for (const torch::Tensor& p : s.params) {
    c10::intrusive_ptr<torch::autograd::Node> accumulator =
        torch::autograd::impl::grad_accumulator(p);
    const uintptr_t key =
        accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
            [weak](const torch::autograd::variable_list& outputs,
                   const torch::autograd::variable_list& /*inputs*/) {
              on_gradient_accumulated(weak);
              return outputs;
            }));
    s.hooks.emplace_back(std::move(accumulator), key);
  }
}

DistributedDataParallel::~DistributedDataParallel() {
  if (!state_) return;  // moved from
  for (auto& [accumulator, key] : state_->hooks) accumulator->del_post_hook(key);
}

DistributedDataParallel::DistributedDataParallel(DistributedDataParallel&&) noexcept = default;

DistributedDataParallel& DistributedDataParallel::operator=(
    DistributedDataParallel&& other) noexcept {
  if (this != &other) {
    DistributedDataParallel gone(std::move(*this));  // removes this one's hooks
    state_ = std::move(other.state_);
  }
  return *this;
}

torch::nn::Module& DistributedDataParallel::module() const { return *state_->module; }
ProcessGroup& DistributedDataParallel::group() const { return *state_->group; }
const std::vector<std::vector<size_t>>& DistributedDataParallel::buckets() const {
  return state_->buckets;
}

void DistributedDataParallel::backward(const torch::Tensor& loss) {
  loss.backward();         // the hooks average the gradients at its end
  all_reduce_gradients();  // a no-op then; averages if no hook ran on any rank
}

void DistributedDataParallel::all_reduce_gradients() {
  if (state_->averaged) return;
  state_->average();
  state_->averaged = true;
}

void DistributedDataParallel::State::average() {
  torch::NoGradGuard no_grad;
  const double world = group->size();
  for (const auto& bucket : buckets) {
    torch::Tensor flat =
        torch::empty({numel_of(params, bucket)}, params[bucket[0]].options().requires_grad(false));
    int64_t offset = 0;
    for (size_t i : bucket) {
      const torch::Tensor& p = params[i];
      torch::Tensor slice = flat.narrow(0, offset, p.numel());
      offset += p.numel();
      const torch::Tensor& g = p.grad();
      if (!g.defined()) {
        slice.zero_();  // takes part all the same: the collective sequence stays matched
        continue;
      }
      if (g.layout() != torch::kStrided || !g.device().is_cpu()) {
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("rank {}: the gradient of parameter #{} is not a dense CPU tensor",
                                group->rank(), i));
      }
      slice.copy_(g.reshape({-1}));
    }
    group->all_reduce(flat);
    if (world > 1) flat.div_(world);
    offset = 0;
    for (size_t i : bucket) {
      torch::Tensor p = params[i];
      torch::Tensor mean = flat.narrow(0, offset, p.numel()).view(p.sizes());
      offset += p.numel();
      if (p.grad().defined()) {
        p.mutable_grad().copy_(mean);
      } else {
        p.mutable_grad() = mean.clone();
      }
    }
  }
}

void DistributedDataParallel::broadcast_state(int root) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> state;
  for (const auto& p : state_->module->parameters()) state.push_back(p);
  for (const auto& b : state_->module->buffers()) state.push_back(b);
  for (const auto& bucket : plan_buckets(state, state_->bucket_bytes)) {
    std::vector<torch::Tensor> flat_parts;
    for (size_t i : bucket) flat_parts.push_back(state[i].reshape({-1}));
    std::vector<torch::Tensor> flat{torch::cat(flat_parts)};
    state_->group->broadcast(flat, root);
    int64_t offset = 0;
    for (size_t i : bucket) {
      state[i].copy_(flat[0].narrow(0, offset, state[i].numel()).view(state[i].sizes()));
      offset += state[i].numel();
    }
  }
}

// ---------------------------------------------------------------- sharding

torch::Tensor shard_indices(int64_t dataset_size, int rank, int world_size,
                            const ShardOptions& options) {
  if (world_size <= 0 || rank < 0 || rank >= world_size) {
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("shard_indices: rank {} is not one of world_size {}", rank, world_size));
  }
  if (dataset_size < 0) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("shard_indices: dataset_size {} is negative", dataset_size));
  }
  torch::Tensor order;
  if (options.shuffle) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(
        options.seed + static_cast<uint64_t>(options.epoch));
    order = torch::randperm(dataset_size, gen, torch::kLong);
  } else {
    order = torch::arange(dataset_size, torch::kLong);
  }
  const int64_t per_rank =
      options.drop_last ? dataset_size / world_size : (dataset_size + world_size - 1) / world_size;
  const int64_t total = per_rank * world_size;
  if (total <= dataset_size) {
    order = order.narrow(0, 0, total);
  } else {
    // Pad with the first indices (again, if the dataset is smaller than the
    // padding), as DistributedSampler does.
    const int64_t pad = total - dataset_size;
    order = torch::cat(
        {order, order.repeat({(pad + dataset_size - 1) / dataset_size}).narrow(0, 0, pad)});
  }
  return order.slice(0, rank, total, world_size).contiguous();
}

torch::Tensor shard_indices(int64_t dataset_size, const ShardOptions& options) {
  const TrainContext& c = train::get_context();
  return shard_indices(dataset_size, c.world_rank, c.world_size, options);
}

}  // namespace cairn::libtorch
