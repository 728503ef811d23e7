// GPUs handed to concurrent trials (TuneConfig::resources_per_trial.gpu),
// apart from processes so it is tested alone. A trial asks for a whole
// number of GPUs, which no other trial holds any share of, or for a
// fraction of one (Ray's fractional GPUs), which shares that GPU with other
// fractional trials up to a whole. Shares are counted in ten-thousandths,
// so 1/3 three times fits one GPU.
//
// Thread-safety: none; the Tuner's driver thread owns the pool.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cairn::tune::tuner_internal {

class GpuPool {
 public:
  // `ids`: the devices trials may be given, as CUDA_VISIBLE_DEVICES names
  // them ("0", "1", or UUIDs).
  explicit GpuPool(std::vector<std::string> ids);

  // Throws kInvalidArgument naming the request when it is negative, not
  // finite, smaller than the smallest share, or above 1 and not whole.
  static void check_form(double gpus);
  // check_form, and kInvalidArgument when it asks more GPUs than the pool
  // has (it would never fit).
  void check_request(double gpus) const;
  // The ids for one trial asking `gpus` (> 0), taken from the pool; nullopt
  // when they are not free now. A fraction goes to the GPU with the least
  // share left that still holds it (so fractions pack and whole GPUs stay
  // free), whole GPUs to the lowest free ids.
  std::optional<std::vector<std::string>> acquire(double gpus);
  // Gives back what acquire() returned for the same `gpus`.
  void release(const std::vector<std::string>& ids, double gpus);

  std::size_t size() const { return ids_.size(); }

  // The devices this process may use: CUDA_VISIBLE_DEVICES' entries when it
  // is set (none when it is empty, "-1" or "NoDevFiles"), else one id per
  // /proc/driver/nvidia/gpus entry ("0", "1", ...), else none.
  static std::vector<std::string> visible_devices(const std::optional<std::string>& env);

 private:
  static constexpr int64_t kWhole = 10000;
  static int64_t units(double gpus);
  std::vector<std::string> ids_;
  std::vector<int64_t> used_;  // per id, in units of 1 / kWhole
};

}  // namespace cairn::tune::tuner_internal
