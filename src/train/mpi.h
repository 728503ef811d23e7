// The MPI launcher (docs/train.md, "Multi-node"). NOT IMPLEMENTED YET: only
// launch detection and the shared-storage rule exist; fit_mpi() throws. The
// design it is to follow: every process started by
// mpirun runs the program and calls Trainer::fit(); MPI is used only to
// bootstrap (rank 0 broadcasts its control address) and to wait for the end.
// MPI rank 0 is the driver; every MPI process, rank 0 included, is an agent
// that forks the worker for its rank and relays its messages to the driver
// over TCP, so a worker that dies is restarted without ending the MPI job.
#pragma once

#include "cairn/train.h"
#include "train/driver.h"

namespace cairn::train_internal {

// True when an MPI launcher started this process (OMPI_COMM_WORLD_SIZE,
// PMI_SIZE or PMIX_RANK is set).
bool launched_by_mpi();

// fit() under MPI. For now throws kFailedPrecondition saying it is not available.
Result fit_mpi(DriverSpec spec, int num_workers);

// Multi-node storage rule, as a pure function for tests: a run whose ranks
// are on more than one host must use storage every host reaches. `hosts` has
// one entry per rank; `probe_seen` says whether each rank saw a file the
// driver wrote into the experiment folder. Throws kInvalidArgument naming the
// first rank that cannot see it.
void check_shared_storage(const std::vector<std::string>& hosts,
                          const std::vector<bool>& probe_seen, std::string_view experiment_uri);

}  // namespace cairn::train_internal
