#include "train/mpi.h"

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>

#include "cairn/error.h"

namespace cairn::train_internal {

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
    if (std::getenv(v) != nullptr) return true;
  }
  return false;
}

void check_shared_storage(const std::vector<std::string>& hosts,
                          const std::vector<bool>& probe_seen, std::string_view experiment_uri) {
  std::vector<std::string> distinct;
  for (const auto& h : hosts) {
    if (std::find(distinct.begin(), distinct.end(), h) == distinct.end()) distinct.push_back(h);
  }
  for (size_t r = 0; r < probe_seen.size(); ++r) {
    if (probe_seen[r]) continue;
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("storage path {} is not shared: rank {} on host {} cannot see a file "
                            "the driver on host {} wrote there; a multi-node run ({} hosts) "
                            "needs storage every node reaches (a shared mount or an object "
                            "store)",
                            experiment_uri, r, hosts.at(r), hosts.at(0), distinct.size()));
  }
}

Result fit_mpi(DriverSpec, int) {
  throw Error(ErrorCode::kFailedPrecondition,
              "launching workers with MPI is not available yet (docs/train.md, \"Multi-node\"): "
              "the program was started by an MPI launcher or asked for Launcher::kMpi; run it "
              "without mpirun and use Launcher::kLocal");
}
}  // namespace cairn::train_internal
