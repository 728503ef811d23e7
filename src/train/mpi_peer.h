// Moving the memory tier's files between the hosts of an MPI launch
// (docs/memory-tier.md, "Across hosts"): MPI point-to-point on a
// communicator of Cairn's own, duplicated from MPI_COMM_WORLD when the job
// boots (mpi_join), so no message of the user's program is ever matched.
// Chosen by measurement (bench/replica_transport_run.py): Open MPI takes the
// fastest layer a cluster has, and the launch's processes are MPI processes
// already.
//
// Each call is collective between the processes it names: every send must be
// met by the peer's receive of the same file, in the same order. Files
// between one pair go one after the other, in the order of the lists (one
// tag per pair: MPI keeps messages between a pair in order); different
// peers' files move at once.
//
// Failure: kUnavailable when MPI fails or the launch has no MPI (a
// torchrun-style launch); kCorruption naming the file and the peer when a
// received file does not match its size or XXH3; kTimeout when a peer does
// not take part within the limit. A received file is written under a
// temporary name and renamed into place only when it is whole and checked.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace cairn::train_internal {

// One file to move: `path` under the caller's folder, with the size and
// XXH3-64 the receiver checks; `peer` is the other side's MPI rank.
struct PeerFile {
  std::string path;
  uint64_t size = 0;
  uint64_t xxh3 = 0;
  int peer = 0;
};

// Sends `sends` (read from `dir`) and receives `recvs` (written into `dir`).
void exchange_files(const std::filesystem::path& dir, const std::vector<PeerFile>& sends,
                    const std::vector<PeerFile>& recvs,
                    std::chrono::milliseconds limit = std::chrono::minutes(30));

// Sends `message` to MPI rank `to` while receiving one from MPI rank `from`
// (the headers of an exchange; a ring of them does not deadlock). Either
// may be -1: nothing sent, or nothing received (null returned).
nlohmann::json swap_json(int to, const nlohmann::json& message, int from,
                         std::chrono::milliseconds limit = std::chrono::minutes(5));

// Whether this process can use the calls above (it joined an MPI job).
bool peer_transport_ready();

}  // namespace cairn::train_internal

namespace cairn::train_internal {
// Called once by mpi_join(), collectively: duplicates MPI_COMM_WORLD.
void init_peer_transport();
}  // namespace cairn::train_internal
