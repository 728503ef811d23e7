// The MPI launcher (docs/train.md, "Multi-node with MPI").
//
// Every process started by mpirun (or srun) runs the program and calls
// Trainer::fit(). MPI is used only to bootstrap: the processes exchange host
// names and MPI rank 0 broadcasts the TCP address it listens on. Then:
//   - MPI rank 0 is the driver (driver.cc, unchanged) and the agent of world
//     rank 0: it forks that rank's worker itself;
//   - every other MPI process is an agent: it connects to the driver, forks
//     the worker of its rank when told to and relays the report protocol
//     between the two, so a worker that fails is restarted by its agent
//     without ending the MPI job.
// Before the first attempt the driver writes a probe file into the
// experiment folder and every agent must see it: storage that some rank
// cannot reach (a node-local path on a multi-node run, memory://) is refused.
// In an elastic group a process started again for a lost rank passes the
// same probe before it joins; one that fails it is refused and stays out.
//
// This header holds the pure parts (tested alone) and fit_mpi().
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "cairn/error.h"
#include "cairn/train.h"
#include "train/control/driver.h"

namespace cairn::train_internal {

// True when an MPI launcher started this process (OMPI_COMM_WORLD_SIZE,
// PMI_SIZE or PMIX_RANK is set).
bool launched_by_mpi();

// fit() under MPI, on every MPI process. `spec` is the Trainer's (name and
// storage path not yet resolved); `scaling` the Trainer's ScalingConfig.
// Returns the same Result on every process; throws the driver's error on
// every process when the driver throws.
Result fit_mpi(DriverSpec spec, const ScalingConfig& scaling);

// The number of ranks for a ScalingConfig when a launcher (`job`: "the MPI
// job", ...) started `world_size` processes: num_workers 0 means the world
// size; otherwise it must equal num_workers, or, for an elastic config
// (min_workers > 0), lie in [min_workers, num_workers] (kInvalidArgument
// otherwise).
int launched_world_ranks(const ScalingConfig& scaling, int world_size,
                         std::string_view job = "the MPI job");

// Each rank's place, from every rank's host name (index = world rank): node
// ranks in order of a host's first rank, local ranks in world-rank order.
std::vector<TrainContext> plan_places(const std::vector<std::string>& hosts);

// Where the driver listens and what it tells the agents to connect to.
struct ControlAddress {
  std::string bind;                    // numeric address; "" = every interface
  std::vector<std::string> advertise;  // tried in order by the agents
};
// `override_address` is $CAIRN_MPI_ADDRESS (empty if unset): listen there
// and advertise only it. Otherwise a run on one host stays on 127.0.0.1, and
// a multi-host run listens everywhere and advertises `interface_addresses`
// followed by `driver_host`.
ControlAddress choose_control_address(const std::vector<std::string>& hosts,
                                      const std::string& override_address,
                                      const std::vector<std::string>& interface_addresses,
                                      const std::string& driver_host);

// The storage rule: every rank must see the probe file the driver wrote.
// `hosts` has one entry per rank; `probe_seen` whether each rank saw it;
// `why_not` (optional, per rank) what went wrong looking. Throws
// kInvalidArgument naming the first rank that cannot see it, its host and
// the storage.
void check_shared_storage(const std::vector<std::string>& hosts,
                          const std::vector<bool>& probe_seen, std::string_view experiment_uri,
                          const std::vector<std::string>& why_not = {});

// The error check_shared_storage throws for `rank`, which did not see the
// probe (`why_not`: what went wrong looking, or empty).
Error storage_not_shared(const std::vector<std::string>& hosts, size_t rank,
                         std::string_view experiment_uri, std::string_view why_not);

}  // namespace cairn::train_internal
