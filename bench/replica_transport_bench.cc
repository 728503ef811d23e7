// How fast a memory-tier replica moves from one process to another over
// MPI point-to-point, the transport issue 28's peer replicas would use
// (docs/memory-tier.md, "The replica transport, measured"). Run under
// `mpirun -np 2`; bench/replica_transport_run.py runs it with each of Open
// MPI's byte transfer layers and the same transfer over torch.distributed's
// Gloo, and prints them side by side.
//
// Rank 0 sends --mib MiB in --chunk-mib chunks, --in-flight at a time
// (MPI_Isend); rank 1 receives them into its own buffer (MPI_Irecv), checks
// them with XXH3 as a replica holder would before acknowledging, and sends
// a one-int ack. A round is rank 0's time from the first send to the ack.
// Both buffers are touched before the first round (fresh memory is slow to
// touch on these machines: PERF-NOTES), and the rounds after the first are
// the steady state. In the same run rank 0 times a memcpy of the buffer,
// the floor of any copy from one process's memory to another's.
//
// Prints one JSON object on rank 0's stdout.
// The MPI C API only, as src/train/mpi_bootstrap.cc.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "util/hash.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    std::fprintf(stderr, "replica_transport_bench: %s failed (%d)\n", what, rc);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("A memory-tier replica over MPI point-to-point (docs/memory-tier.md)",
               "replica_transport_bench");
  int mib = 1024, chunk_mib = 64, in_flight = 4, rounds = 5;
  app.add_option("--mib", mib, "bytes to move, in MiB")->check(CLI::PositiveNumber);
  app.add_option("--chunk-mib", chunk_mib, "one message, in MiB")->check(CLI::PositiveNumber);
  app.add_option("--in-flight", in_flight, "messages outstanding at once")
      ->check(CLI::PositiveNumber);
  app.add_option("--rounds", rounds, "rounds (the first is not counted)")
      ->check(CLI::Range(2, 1000));
  CLI11_PARSE(app, argc, argv);

  check(MPI_Init(&argc, &argv), "MPI_Init");
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 2) {
    if (rank == 0) std::fprintf(stderr, "replica_transport_bench: run it with mpirun -np 2\n");
    MPI_Finalize();
    return 2;
  }
  const size_t bytes = static_cast<size_t>(mib) << 20;
  const size_t chunk = std::min(bytes, static_cast<size_t>(chunk_mib) << 20);
  const size_t chunks = (bytes + chunk - 1) / chunk;
  std::vector<char> buffer(bytes);
  for (size_t i = 0; i < bytes; i += 4096) buffer[i] = static_cast<char>(i / 4096 * 31 + rank);
  std::vector<char> copy(rank == 0 ? bytes : 0);
  if (rank == 0) std::memset(copy.data(), 1, bytes);

  std::vector<double> transfer_s, check_s, memcpy_s;
  for (int round = 0; round < rounds; ++round) {
    check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    const auto start = Clock::now();
    std::vector<MPI_Request> window;
    auto drain = [&](size_t keep) {
      while (window.size() > keep) {
        check(MPI_Wait(&window.front(), MPI_STATUS_IGNORE), "MPI_Wait");
        window.erase(window.begin());
      }
    };
    for (size_t c = 0; c < chunks; ++c) {
      const size_t at = c * chunk;
      const int n = static_cast<int>(std::min(chunk, bytes - at));
      MPI_Request r;
      if (rank == 0) {
        check(MPI_Isend(buffer.data() + at, n, MPI_BYTE, 1, 0, MPI_COMM_WORLD, &r), "MPI_Isend");
      } else {
        check(MPI_Irecv(buffer.data() + at, n, MPI_BYTE, 0, 0, MPI_COMM_WORLD, &r), "MPI_Irecv");
      }
      window.push_back(r);
      drain(static_cast<size_t>(in_flight) - 1);
    }
    drain(0);
    int ack = 0;
    if (rank == 1) {
      const auto hashed = Clock::now();
      const uint64_t h = cairn::xxh3_64(std::string_view(buffer.data(), bytes));
      ack = static_cast<int>(h & 0x7fff);
      const double s = seconds_since(hashed);
      check(MPI_Send(&ack, 1, MPI_INT, 0, 1, MPI_COMM_WORLD), "MPI_Send");
      check(MPI_Send(&s, 1, MPI_DOUBLE, 0, 2, MPI_COMM_WORLD), "MPI_Send");
    } else {
      double s = 0;
      check(MPI_Recv(&ack, 1, MPI_INT, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv");
      const double total = seconds_since(start);
      check(MPI_Recv(&s, 1, MPI_DOUBLE, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv");
      const auto copied = Clock::now();
      std::memcpy(copy.data(), buffer.data(), bytes);
      const double m = seconds_since(copied);
      if (round > 0) {
        transfer_s.push_back(total);
        check_s.push_back(s);
        memcpy_s.push_back(m);
      }
    }
  }
  if (rank == 0) {
    const double gib = static_cast<double>(bytes) / (1ull << 30);
    const double t = median(transfer_s), h = median(check_s), m = median(memcpy_s);
    const nlohmann::json out = {{"mib", mib},
                                {"chunk_mib", chunk_mib},
                                {"in_flight", in_flight},
                                {"rounds", rounds - 1},
                                {"replica_s", t},
                                {"replica_gib_per_s", gib / t},
                                {"check_s", h},
                                {"send_gib_per_s", gib / (t - h)},
                                {"memcpy_s", m},
                                {"memcpy_gib_per_s", gib / m},
                                {"replica_vs_memcpy", t / m}};
    std::printf("%s\n", out.dump().c_str());
  }
  MPI_Finalize();
  return 0;
}
