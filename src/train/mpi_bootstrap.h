// Joining the MPI job: learn every process's host name, and broadcast one
// string from rank 0. After the bootstrap the launch's control goes over TCP
// (mpi.h); MPI itself carries only the memory tier's files between hosts
// (mpi_peer.h, on a communicator of its own made here).
//
// MPI is initialized on first use if the program has not done so (and
// finalized at exit); a program that initialized MPI itself keeps it.
// Collective: every process of the job must call these in the same order.
#pragma once

#include <string>
#include <vector>

namespace cairn::train_internal {

struct MpiWorld {
  int rank = 0;
  int size = 1;
  std::vector<std::string> hosts;  // index = MPI rank
  // How messages name a process ("MPI rank 3"); the torchrun-style launch
  // (env_launch.h) runs the same protocol with "rank".
  std::string label = "MPI rank";
};

MpiWorld mpi_join();

// Rank 0's `value` on every process.
std::string mpi_broadcast(const std::string& value);

// Throws kUnavailable naming `call` and MPI's message unless `rc` is
// MPI_SUCCESS (only where Cairn is built with MPI).
void check_mpi(int rc, const char* call);

}  // namespace cairn::train_internal
