// The memory tier's peer transport (train/mpi_peer.h) between two MPI
// processes, started by mpirun (tests/train/mpi_test.cc):
//
//   train_mpi_peer_program OUT_DIR
//
// Each process, in OUT/<MPI rank>/, sends the other out-good (1 MiB and 3
// bytes: several pieces), out-empty and out-bad, and receives them as
// in-good, in-empty and in-bad, expecting the true XXH3 of the first two and
// a wrong one for the third. It writes OUT/result-<rank>.json: the error the
// exchange threw, whether in-good and in-empty arrived intact, whether in-bad
// exists, and whether a temporary file was left behind.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cairn/error.h"
#include "support/files.h"
#include "train/mpi_bootstrap.h"
#include "train/mpi_peer.h"
#include "util/hash.h"

namespace fs = std::filesystem;
using cairn::train_internal::PeerFile;

namespace {

uint64_t xxh3(const std::string& bytes) {
  cairn::Hasher h;
  h.update(std::as_bytes(std::span(bytes)));
  return h.digest();
}

// The "good" file of MPI rank `rank`.
std::string good_of(int rank) {
  std::string g((1 << 20) + 3, '\0');
  for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<char>(i * 7 + static_cast<size_t>(rank));
  return g;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const cairn::train_internal::MpiWorld w = cairn::train_internal::mpi_join();
  const int peer = 1 - w.rank;
  const fs::path dir = fs::path(argv[1]) / std::to_string(w.rank);
  fs::create_directories(dir);
  const std::string good = good_of(w.rank);
  const std::string bad = "not what was announced";
  std::ofstream(dir / "out-good", std::ios::binary) << good;
  std::ofstream(dir / "out-empty", std::ios::binary);
  std::ofstream(dir / "out-bad", std::ios::binary) << bad;
  const std::vector<PeerFile> sends = {{"out-good", good.size(), xxh3(good), peer},
                                       {"out-empty", 0, xxh3(""), peer},
                                       {"out-bad", bad.size(), xxh3(bad), peer}};
  const std::string theirs = good_of(peer);
  const std::vector<PeerFile> recvs = {{"in-good", theirs.size(), xxh3(theirs), peer},
                                       {"in-empty", 0, xxh3(""), peer},
                                       {"in-bad", bad.size(), xxh3(bad) ^ 1, peer}};
  nlohmann::json result = {{"error", nullptr}};
  try {
    cairn::train_internal::exchange_files(dir, sends, recvs);
  } catch (const cairn::Error& e) {
    result["error"] = e.what();
    result["code"] = std::string(cairn::error_code_name(e.code()));
  }
  result["good"] = fs::exists(dir / "in-good") && slurp(dir / "in-good") == theirs;
  result["empty"] = fs::exists(dir / "in-empty") && fs::file_size(dir / "in-empty") == 0;
  result["bad_exists"] = fs::exists(dir / "in-bad");
  result["leftover"] = false;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().find(".cairn-peer-tmp") != std::string::npos) {
      result["leftover"] = true;
    }
  }
  cairn::testing::write_file_atomically(fs::path(argv[1]) / fmt::format("result-{}.json", w.rank),
                                        result.dump());
  return 0;
}
