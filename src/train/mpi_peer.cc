// MPI point-to-point for the memory tier's files (mpi_peer.h).
#include "train/mpi_peer.h"

#include <fcntl.h>

#include <algorithm>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "cairn/error.h"
#include "train/mpi_bootstrap.h"
#include "util/fs.h"
#include "util/hash.h"

#if CAIRN_HAVE_MPI
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace cairn::train_internal {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

#if CAIRN_HAVE_MPI

namespace {

// Moves in pieces of this size: MPI counts are ints, and one piece per
// stream in flight bounds the memory an exchange takes.
constexpr uint64_t kPiece = 32ull << 20;
constexpr int kFileTag = 1;
constexpr int kJsonTag = 2;

MPI_Comm g_comm = MPI_COMM_NULL;

// Waiting on MPI without a core to spare: the first polls only yield (a
// piece between processes of one host lands in microseconds), later ones
// sleep a little, so that a transfer that waits on its peer or the network
// leaves the CPU to the training (on 2 cores, spinning doubled its step).
class Backoff {
 public:
  void wait() {
    if (++polls_ < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  void reset() { polls_ = 0; }

 private:
  int polls_ = 0;
};

void check(int rc, const char* call) { check_mpi(rc, call); }

MPI_Comm comm() {
  if (g_comm == MPI_COMM_NULL) {
    throw Error(ErrorCode::kUnavailable,
                "the memory tier's peer transport needs an MPI launch (this process did not "
                "join one)");
  }
  return g_comm;
}

// The files to or from one peer, one after the other, one piece in flight.
struct Stream {
  bool send = false;
  int peer = 0;
  std::vector<const PeerFile*> files;
  size_t file = 0;      // the current one
  uint64_t offset = 0;  // of its next piece
  UniqueFd fd;          // closed when the current file failed here: zeros go, nothing is kept
  fs::path tmp;         // receiving: where the current file is written
  Hasher hash;
  std::vector<std::byte> buffer;
  MPI_Request request = MPI_REQUEST_NULL;
  uint64_t piece = 0;  // bytes of the piece in flight
};

// A failure here (a file that cannot be read or written, a checksum that
// does not match) does not stop the exchange: the peers' calls must meet,
// so the failing file goes on as zeros (sent) or is dropped (received), and
// the first failure is thrown once every piece has moved.
class Exchange {
 public:
  Exchange(const fs::path& dir, const std::vector<PeerFile>& sends,
           const std::vector<PeerFile>& recvs)
      : dir_(dir) {
    add(sends, true);
    add(recvs, false);
  }

  ~Exchange() {
    for (Stream& s : streams_) drop_tmp(s);  // after a timeout or an MPI failure
  }

  void run(std::chrono::milliseconds limit) {
    for (Stream& s : streams_) start_file(s);
    const auto deadline = Clock::now() + limit;
    std::vector<MPI_Request> requests(streams_.size());
    Backoff backoff;
    while (true) {
      size_t live = 0;
      for (size_t i = 0; i < streams_.size(); ++i) {
        requests[i] = streams_[i].request;
        live += streams_[i].request != MPI_REQUEST_NULL;
      }
      if (live == 0) break;
      int index = MPI_UNDEFINED;
      int flag = 0;
      check(MPI_Testany(static_cast<int>(requests.size()), requests.data(), &index, &flag,
                        MPI_STATUS_IGNORE),
            "MPI_Testany");
      if (!flag || index == MPI_UNDEFINED) {
        if (Clock::now() > deadline) {
          throw Error(ErrorCode::kTimeout, fmt::format("moving memory tier files under {}: a "
                                                       "peer did not take part within {} s",
                                                       dir_.string(), limit.count() / 1000));
        }
        backoff.wait();
        continue;
      }
      backoff.reset();
      Stream& s = streams_[static_cast<size_t>(index)];
      s.request = MPI_REQUEST_NULL;
      piece_done(s);
    }
    if (failed_) throw *failed_;
  }

 private:
  void add(const std::vector<PeerFile>& files, bool send) {
    for (const PeerFile& f : files) {
      auto it = std::find_if(streams_.begin(), streams_.end(),
                             [&](const Stream& s) { return s.send == send && s.peer == f.peer; });
      if (it == streams_.end()) {
        streams_.emplace_back();
        it = std::prev(streams_.end());
        it->send = send;
        it->peer = f.peer;
      }
      it->files.push_back(&f);
    }
  }

  void fail(const Error& e) {
    if (!failed_) failed_ = e;
  }

  void drop_tmp(Stream& s) {
    if (s.send || s.tmp.empty()) return;
    std::error_code ec;
    fs::remove(s.tmp, ec);  // ignore-error: best effort after a failure
    s.tmp.clear();
  }

  // Opens the stream's current file and posts its first piece (an empty
  // file is one empty piece, so both sides step through the same files).
  void start_file(Stream& s) {
    if (s.file == s.files.size()) return;
    const PeerFile& f = *s.files[s.file];
    const fs::path target = dir_ / f.path;
    s.offset = 0;
    s.hash = Hasher();
    try {
      if (s.send) {
        s.fd = open_file(target, O_RDONLY);
      } else {
        std::error_code ec;
        fs::create_directories(target.parent_path(), ec);
        s.tmp = target;
        s.tmp += fmt::format(".cairn-peer-tmp-{}", s.peer);  // two peers may send one name
        s.fd = open_file(s.tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
      }
    } catch (const Error& e) {
      fail(with_context(e, fmt::format("moving it to or from MPI rank {}", s.peer)));
      drop_tmp(s);
    }
    post(s);
  }

  void post(Stream& s) {
    const PeerFile& f = *s.files[s.file];
    s.piece = std::min(kPiece, f.size - s.offset);
    if (s.buffer.size() < s.piece) s.buffer.resize(static_cast<size_t>(s.piece));
    const int count = static_cast<int>(s.piece);
    if (s.send) {
      try {
        if (s.fd)
          pread_all(s.fd.get(), {s.buffer.data(), s.piece}, s.offset, (dir_ / f.path).string());
      } catch (const Error& e) {
        fail(with_context(e, fmt::format("sending it to MPI rank {}", s.peer)));
        s.fd = UniqueFd();
      }
      if (!s.fd) std::fill_n(s.buffer.begin(), s.piece, std::byte{0});
      check(MPI_Isend(s.buffer.data(), count, MPI_BYTE, s.peer, kFileTag, comm(), &s.request),
            "MPI_Isend");
    } else {
      check(MPI_Irecv(s.buffer.data(), count, MPI_BYTE, s.peer, kFileTag, comm(), &s.request),
            "MPI_Irecv");
    }
  }

  void piece_done(Stream& s) {
    const PeerFile& f = *s.files[s.file];
    if (!s.send && s.fd) {
      const std::span<const std::byte> got{s.buffer.data(), s.piece};
      try {
        pwrite_all(s.fd.get(), got, s.offset, s.tmp.string());
        s.hash.update(got);
      } catch (const Error& e) {
        fail(with_context(e, fmt::format("receiving it from MPI rank {}", s.peer)));
        s.fd = UniqueFd();
        drop_tmp(s);
      }
    }
    s.offset += s.piece;
    if (s.offset < f.size) {
      post(s);
      return;
    }
    if (!s.send && s.fd) finish_received(s, f);
    s.fd = UniqueFd();
    ++s.file;
    start_file(s);
  }

  // A received file is checked, then renamed into place.
  void finish_received(Stream& s, const PeerFile& f) {
    const uint64_t got = s.hash.digest();
    const fs::path target = dir_ / f.path;
    if (got != f.xxh3) {
      fail(Error(
          ErrorCode::kCorruption,
          fmt::format("{}: the copy received from MPI rank {} has XXH3 {}, not {} (its "
                      "size is {} bytes)",
                      target.string(), s.peer, hash_to_hex(got), hash_to_hex(f.xxh3), f.size)));
      drop_tmp(s);
      return;
    }
    std::error_code ec;
    fs::rename(s.tmp, target, ec);
    if (ec) {
      fail(Error(ErrorCode::kIO, fmt::format("{}: could not put the received copy in place: {}",
                                             target.string(), ec.message())));
      drop_tmp(s);
      return;
    }
    s.tmp.clear();
  }

  fs::path dir_;
  std::vector<Stream> streams_;
  std::optional<Error> failed_;
};

}  // namespace

void init_peer_transport() {
  if (g_comm != MPI_COMM_NULL) return;
  check(MPI_Comm_dup(MPI_COMM_WORLD, &g_comm), "MPI_Comm_dup");
}

bool peer_transport_ready() { return g_comm != MPI_COMM_NULL; }

void exchange_files(const fs::path& dir, const std::vector<PeerFile>& sends,
                    const std::vector<PeerFile>& recvs, std::chrono::milliseconds limit) {
  (void)comm();
  Exchange x(dir, sends, recvs);
  x.run(limit);
}

nlohmann::json swap_json(int to, const nlohmann::json& message, int from,
                         std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  const std::string out = message.dump();
  MPI_Request sent = MPI_REQUEST_NULL;
  if (to >= 0) {
    check(
        MPI_Isend(out.data(), static_cast<int>(out.size()), MPI_CHAR, to, kJsonTag, comm(), &sent),
        "MPI_Isend");
  }
  nlohmann::json in;
  bool received = from < 0;
  Backoff backoff;
  while (true) {
    int flag = 0;
    if (!received) {
      MPI_Status status;
      check(MPI_Iprobe(from, kJsonTag, comm(), &flag, &status), "MPI_Iprobe");
      if (flag) {
        int count = 0;
        check(MPI_Get_count(&status, MPI_CHAR, &count), "MPI_Get_count");
        std::string text(static_cast<size_t>(count), '\0');
        check(MPI_Recv(text.data(), count, MPI_CHAR, from, kJsonTag, comm(), MPI_STATUS_IGNORE),
              "MPI_Recv");
        in = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
        if (in.is_discarded()) {
          throw Error(ErrorCode::kCorruption,
                      fmt::format("MPI rank {} sent a memory tier message that is not JSON", from));
        }
        received = true;
      }
    }
    int sent_done = 1;
    if (sent != MPI_REQUEST_NULL) check(MPI_Test(&sent, &sent_done, MPI_STATUS_IGNORE), "MPI_Test");
    if (received && sent_done) return in;
    if (Clock::now() > deadline) {
      throw Error(ErrorCode::kTimeout,
                  fmt::format("the memory tier's message between this process and MPI rank {} "
                              "did not go through within {} s",
                              received ? to : from, limit.count() / 1000));
    }
    backoff.wait();
  }
}

#else

namespace {
[[noreturn]] void unavailable() {
  throw Error(ErrorCode::kUnavailable,
              "the memory tier's peer transport needs MPI, and this Cairn was built without it");
}
}  // namespace

void init_peer_transport() {}
bool peer_transport_ready() { return false; }
void exchange_files(const fs::path&, const std::vector<PeerFile>&, const std::vector<PeerFile>&,
                    std::chrono::milliseconds) {
  unavailable();
}
nlohmann::json swap_json(int, const nlohmann::json&, int, std::chrono::milliseconds) {
  unavailable();
}

#endif

}  // namespace cairn::train_internal
