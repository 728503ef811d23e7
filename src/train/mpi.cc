// The MPI launcher's pure parts: launch detection, rank placement, the
// control address and the shared-storage rule.
#include "train/mpi.h"

#include <algorithm>
#include <cstdlib>
#include <map>

#include <fmt/format.h>

#include "cairn/error.h"
#include "util/settings.h"

namespace cairn::train_internal {

bool launched_by_mpi() { return Settings::from(Environment::process()).launched_by_mpi; }

int launched_world_ranks(const ScalingConfig& scaling, int world_size, std::string_view job) {
  const int n = scaling.num_workers;
  if (n == 0 || n == world_size) return world_size;
  if (scaling.min_workers > 0) {
    if (world_size >= scaling.min_workers && world_size <= n) return world_size;
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{} has {} process(es), outside ScalingConfig's elastic range of "
                            "{} to {} workers (min_workers to num_workers); start that many "
                            "processes",
                            job, world_size, scaling.min_workers, n));
  }
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("ScalingConfig::num_workers is {} but {} has {} process(es); "
                          "when a launcher starts the processes every process runs one rank: set "
                          "num_workers to 0 (the launcher's world size) or {}, or start {} "
                          "processes",
                          n, job, world_size, world_size, n));
}

std::vector<TrainContext> plan_places(const std::vector<std::string>& hosts) {
  std::vector<std::string> nodes;  // in order of first rank
  std::map<std::string, int> per_host;
  for (const auto& h : hosts) {
    if (std::find(nodes.begin(), nodes.end(), h) == nodes.end()) nodes.push_back(h);
    ++per_host[h];
  }
  std::map<std::string, int> seen;
  std::vector<TrainContext> out;
  for (size_t r = 0; r < hosts.size(); ++r) {
    TrainContext c;
    c.world_rank = static_cast<int>(r);
    c.world_size = static_cast<int>(hosts.size());
    c.node_rank = static_cast<int>(std::find(nodes.begin(), nodes.end(), hosts[r]) - nodes.begin());
    c.local_rank = seen[hosts[r]]++;
    c.local_world_size = per_host[hosts[r]];
    out.push_back(std::move(c));
  }
  return out;
}

ControlAddress choose_control_address(const std::vector<std::string>& hosts,
                                      const std::string& override_address,
                                      const std::vector<std::string>& interface_addresses,
                                      const std::string& driver_host) {
  if (!override_address.empty()) return {override_address, {override_address}};
  const bool one_host = std::all_of(hosts.begin(), hosts.end(),
                                    [&](const std::string& h) { return h == hosts.front(); });
  if (one_host) return {"127.0.0.1", {"127.0.0.1"}};
  ControlAddress a;
  a.advertise = interface_addresses;
  a.advertise.push_back(driver_host);
  return a;
}

Error storage_not_shared(const std::vector<std::string>& hosts, size_t rank,
                         std::string_view experiment_uri, std::string_view why_not) {
  std::vector<std::string> distinct;
  for (const auto& h : hosts) {
    if (std::find(distinct.begin(), distinct.end(), h) == distinct.end()) distinct.push_back(h);
  }
  const std::string detail = why_not.empty() ? "" : fmt::format(" ({})", why_not);
  return Error(
      ErrorCode::kInvalidArgument,
      fmt::format("storage path {} is not shared: rank {} on host {} cannot see a file "
                  "the driver on host {} wrote there{}; every rank of an MPI run ({} "
                  "host(s)) must reach the same storage (a shared mount or an object "
                  "store), not a path local to one node",
                  experiment_uri, rank, hosts.at(rank), hosts.at(0), detail, distinct.size()));
}

void check_shared_storage(const std::vector<std::string>& hosts,
                          const std::vector<bool>& probe_seen, std::string_view experiment_uri,
                          const std::vector<std::string>& why_not) {
  for (size_t r = 0; r < probe_seen.size(); ++r) {
    if (probe_seen[r]) continue;
    throw storage_not_shared(hosts, r, experiment_uri, r < why_not.size() ? why_not[r] : "");
  }
}

}  // namespace cairn::train_internal
