#include "tune/gpu_pool.h"

#include <cmath>
#include <filesystem>
#include <sstream>

#include <fmt/format.h>

#include "cairn/error.h"

namespace cairn::tune::tuner_internal {

GpuPool::GpuPool(std::vector<std::string> ids) : ids_(std::move(ids)), used_(ids_.size(), 0) {}

int64_t GpuPool::units(double gpus) { return std::llround(gpus * kWhole); }

void GpuPool::check_form(double gpus) {
  if (!std::isfinite(gpus) || gpus < 0 || gpus > 1e6) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("resources_per_trial.gpu must be a number of GPUs >= 0, got {}", gpus));
  }
  if (gpus == 0) return;
  const int64_t u = units(gpus);
  if (u == 0) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("resources_per_trial.gpu = {} is below the smallest share, 1/{}", gpus,
                            kWhole));
  }
  if (u > kWhole && u % kWhole != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("resources_per_trial.gpu = {}: above one GPU a trial asks for a "
                            "whole number of them (a fraction shares one GPU)",
                            gpus));
  }
}

void GpuPool::check_request(double gpus) const {
  check_form(gpus);
  if (gpus == 0) return;
  const int64_t u = units(gpus);
  const auto whole = static_cast<std::size_t>((u + kWhole - 1) / kWhole);
  if (whole > ids_.size()) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("resources_per_trial.gpu = {}, but {} GPU(s) can be given to trials "
                            "(CUDA_VISIBLE_DEVICES, the machine's GPUs or TuneConfig::gpu_ids): "
                            "no trial could ever start",
                            gpus, ids_.size()));
  }
}

std::optional<std::vector<std::string>> GpuPool::acquire(double gpus) {
  const int64_t u = units(gpus);
  if (u <= 0) return std::vector<std::string>{};
  if (u < kWhole) {
    std::optional<std::size_t> best;
    for (std::size_t i = 0; i < ids_.size(); ++i) {
      if (kWhole - used_[i] < u) continue;
      if (!best || used_[i] > used_[*best]) best = i;
    }
    if (!best) return std::nullopt;
    used_[*best] += u;
    return std::vector<std::string>{ids_[*best]};
  }
  const auto want = static_cast<std::size_t>(u / kWhole);
  std::vector<std::size_t> free;
  for (std::size_t i = 0; i < ids_.size() && free.size() < want; ++i) {
    if (used_[i] == 0) free.push_back(i);
  }
  if (free.size() < want) return std::nullopt;
  std::vector<std::string> out;
  for (std::size_t i : free) {
    used_[i] = kWhole;
    out.push_back(ids_[i]);
  }
  return out;
}

void GpuPool::release(const std::vector<std::string>& ids, double gpus) {
  const int64_t u = units(gpus);
  const int64_t each = u < kWhole ? u : kWhole;
  for (const std::string& id : ids) {
    for (std::size_t i = 0; i < ids_.size(); ++i) {
      if (ids_[i] != id) continue;
      used_[i] = std::max<int64_t>(0, used_[i] - each);
      break;
    }
  }
}

std::vector<std::string> GpuPool::visible_devices(const std::optional<std::string>& env) {
  std::vector<std::string> ids;
  if (env) {
    if (*env == "-1" || *env == "NoDevFiles") return ids;
    std::stringstream in(*env);
    for (std::string id; std::getline(in, id, ',');) {
      if (!id.empty()) ids.push_back(id);
    }
    return ids;
  }
  std::error_code ec;
  std::size_t n = 0;
  for (std::filesystem::directory_iterator it("/proc/driver/nvidia/gpus", ec), end;
       !ec && it != end; it.increment(ec)) {
    ++n;
  }
  for (std::size_t i = 0; i < n; ++i) ids.push_back(std::to_string(i));
  return ids;
}

}  // namespace cairn::tune::tuner_internal
