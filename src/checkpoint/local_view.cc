#include "checkpoint/local_view.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include <fmt/format.h>

#include "cairn/error.h"
#include "util/fs.h"
#include "util/hash.h"
#include "util/log.h"

namespace cairn {

namespace fs = std::filesystem;

namespace {

void flock_or_throw(int fd, int op, const fs::path& path) {
  while (::flock(fd, op) != 0) {
    if (errno == EINTR) continue;
    throw errno_error(errno, "lock", path.string());
  }
}

struct ViewHandle {
  fs::path dir;
  fs::path lock_path;
  fs::path users_path;
  UniqueFd users;

  ~ViewHandle() {
    try {
      UniqueFd lock = open_file(lock_path, O_RDWR | O_CREAT);
      flock_or_throw(lock.get(), LOCK_EX, lock_path);
      users = UniqueFd();  // drops our shared hold
      UniqueFd probe = open_file(users_path, O_RDWR | O_CREAT);
      if (::flock(probe.get(), LOCK_EX | LOCK_NB) == 0) {
        std::error_code ec;
        fs::remove(dir.string() + ".done", ec);
        fs::remove_all(dir, ec);
        fs::remove(users_path, ec);
      }
    } catch (const std::exception& e) {
      // ignore-error: a destructor cannot throw; the cache root is temporary
      // space and the next acquirer of this view repairs it.
      log::warn(fmt::format("releasing checkpoint view {}: {}", dir.string(), e.what()));
    }
  }
};

}  // namespace

fs::path view_cache_root() {
  if (const char* dir = std::getenv("CAIRN_CACHE_DIR"); dir && *dir) return dir;
  const char* tmp = std::getenv("TMPDIR");
  return fs::path((tmp && *tmp) ? tmp : "/tmp") / fmt::format("cairn-views-{}", ::getuid());
}

std::shared_ptr<void> acquire_shared_view(const Checkpoint& checkpoint, fs::path& path) {
  // A version of a checkpoint is its URI plus its manifest; an uncommitted
  // one is keyed by its listing, so a changed source is never served stale.
  std::string identity = checkpoint.uri();
  if (checkpoint.is_committed()) {
    identity += checkpoint.storage().get(kManifestKey);
  } else {
    for (const auto& f : checkpoint.files())
      identity += fmt::format("\n{} {} {}", f.key, f.size, f.modified);
  }
  const fs::path root = view_cache_root();
  make_dirs_durable(root);
  auto handle = std::make_shared<ViewHandle>();
  const std::string base = hash_to_hex(xxh3_64(identity));
  handle->dir = root / base;
  handle->lock_path = root / (base + ".lock");
  handle->users_path = root / (base + ".users");
  const fs::path done = root / (base + ".done");

  UniqueFd lock = open_file(handle->lock_path, O_RDWR | O_CREAT);
  flock_or_throw(lock.get(), LOCK_EX, handle->lock_path);
  std::error_code ec;
  if (!fs::exists(done, ec)) {
    fs::remove_all(handle->dir, ec);
    checkpoint.to_directory(handle->dir);
    UniqueFd marker = open_file(done, O_WRONLY | O_CREAT | O_TRUNC);
    marker.close(done.string());
  }
  handle->users = open_file(handle->users_path, O_RDWR | O_CREAT);
  flock_or_throw(handle->users.get(), LOCK_SH, handle->users_path);
  path = handle->dir;
  return handle;
}

}  // namespace cairn
