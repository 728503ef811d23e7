#include "train/mpi_bootstrap.h"

#include <cstdlib>

#include <fmt/format.h>

#include "cairn/error.h"
#include "train/control/net.h"
#include "train/mpi_peer.h"

#if CAIRN_HAVE_MPI
// The C API only: the deprecated C++ bindings would need libmpi_cxx.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace cairn::train_internal {

#if CAIRN_HAVE_MPI

void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(ErrorCode::kUnavailable, fmt::format("{} failed: {}", call, text));
}

namespace {

constexpr int kHostChars = 256;

void check(int rc, const char* call) { check_mpi(rc, call); }

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void ensure_initialized() {
  int initialized = 0;
  check(MPI_Initialized(&initialized), "MPI_Initialized");
  if (initialized) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) {
      throw Error(ErrorCode::kFailedPrecondition,
                  "MPI was already finalized; the Trainer's MPI launcher needs it running");
    }
    return;
  }
  // Funneled: the driver and the agents call MPI from the thread that
  // called fit() only; their other threads (persistence, storage clients)
  // never do.
  int provided = 0;
  check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  std::atexit(finalize_at_exit);
}

}  // namespace

MpiWorld mpi_join() {
  ensure_initialized();
  MpiWorld w;
  check(MPI_Comm_rank(MPI_COMM_WORLD, &w.rank), "MPI_Comm_rank");
  check(MPI_Comm_size(MPI_COMM_WORLD, &w.size), "MPI_Comm_size");
  std::string mine = host_name();
  mine.resize(kHostChars, '\0');
  std::string all(static_cast<size_t>(kHostChars) * static_cast<size_t>(w.size), '\0');
  check(MPI_Allgather(mine.data(), kHostChars, MPI_CHAR, all.data(), kHostChars, MPI_CHAR,
                      MPI_COMM_WORLD),
        "MPI_Allgather");
  for (int r = 0; r < w.size; ++r) {
    w.hosts.emplace_back(all.c_str() + static_cast<size_t>(r) * kHostChars);
  }
  init_peer_transport();
  return w;
}

std::string mpi_broadcast(const std::string& value) {
  unsigned long long n = value.size();
  check(MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD), "MPI_Bcast");
  std::string out = value;
  out.resize(n);
  check(MPI_Bcast(out.data(), static_cast<int>(n), MPI_CHAR, 0, MPI_COMM_WORLD), "MPI_Bcast");
  return out;
}

#else

namespace {
[[noreturn]] void unavailable() {
  throw Error(ErrorCode::kFailedPrecondition,
              "this Cairn was built without MPI (CAIRN_MPI=OFF), so the Trainer cannot launch "
              "workers under mpirun; rebuild with libopenmpi-dev installed, or run without "
              "mpirun and use Launcher::kLocal");
}
}  // namespace

MpiWorld mpi_join() { unavailable(); }
std::string mpi_broadcast(const std::string&) { unavailable(); }

#endif

}  // namespace cairn::train_internal
