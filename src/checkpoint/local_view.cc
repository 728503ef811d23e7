#include "checkpoint/local_view.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <set>

#include <fmt/format.h>

#include "cairn/error.h"
#include "util/fs.h"
#include "util/hash.h"
#include "util/log.h"
#include "util/settings.h"

namespace cairn {

namespace fs = std::filesystem;

namespace {

// The files of one view; see the protocol in local_view.h.
struct ViewPaths {
  ViewPaths(const fs::path& root, const std::string& base)
      : dir(root / base),
        lock(root / (base + ".lock")),
        users(root / (base + ".users")),
        done(root / (base + ".done")) {}
  fs::path dir, lock, users, done;
};

bool is_view_name(std::string_view s) {
  if (s.size() != 16) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

int flock_retrying(int fd, int op) {
  int rc;
  do {
    rc = ::flock(fd, op);
  } while (rc != 0 && errno == EINTR);
  return rc;
}

// Locks B.lock exclusively and returns its descriptor, or an empty one when
// `wait` is false and another process holds it. If the file was unlinked (by
// a release or sweep) while we waited, the lock is taken again on the new one.
UniqueFd lock_view(const fs::path& lock_path, bool wait) {
  for (;;) {
    UniqueFd fd = open_file(lock_path, O_RDWR | O_CREAT | O_CLOEXEC);
    if (flock_retrying(fd.get(), LOCK_EX | (wait ? 0 : LOCK_NB)) != 0) {
      if (!wait && errno == EWOULDBLOCK) return UniqueFd();
      throw errno_error(errno, "lock", lock_path.string());
    }
    struct stat held, now;
    if (::fstat(fd.get(), &held) != 0) throw errno_error(errno, "stat", lock_path.string());
    if (::stat(lock_path.c_str(), &now) == 0 && now.st_ino == held.st_ino &&
        now.st_dev == held.st_dev) {
      return fd;
    }
  }
}

// Whether some live process holds a shared lock on B.users.
bool in_use(const ViewPaths& p) {
  int fd = ::open(p.users.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;  // no users file: no user
  UniqueFd users(fd);
  return flock_retrying(fd, LOCK_EX | LOCK_NB) != 0;  // closing drops the probe
}

// With B.lock held: removes the view and its files, B.lock last.
void remove_view(const ViewPaths& p) {
  for (const fs::path& path : {p.done, p.dir, p.users, p.lock}) {
    std::error_code ec;
    fs::remove_all(path, ec);
    if (ec) {
      // ignore-error: the cache is temporary space; the next sweep or
      // `cairn gc` tries again.
      log::warn(fmt::format("removing checkpoint view {}: {}", path.string(), ec.message()));
    }
  }
}

struct ViewHandle {
  fs::path root;
  std::string base;
  UniqueFd users;

  ~ViewHandle() {
    const ViewPaths p(root, base);
    try {
      UniqueFd lock = lock_view(p.lock, /*wait=*/true);
      users = UniqueFd();  // drops our shared hold
      if (!in_use(p)) remove_view(p);
    } catch (const std::exception& e) {
      // ignore-error: a destructor cannot throw; the next sweep removes an
      // unused view.
      log::warn(fmt::format("releasing checkpoint view {}: {}", p.dir.string(), e.what()));
    }
  }
};

}  // namespace

fs::path view_cache_root() {
  const Settings settings = Settings::from(Environment::process());
  if (!settings.cache_dir.empty()) return settings.cache_dir;
  return fs::path(settings.temp_dir) / fmt::format("cairn-views-{}", ::getuid());
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
  auto handle = std::make_shared<ViewHandle>();
  handle->root = view_cache_root();
  handle->base = hash_to_hex(xxh3_64(identity));
  make_dirs_durable(handle->root);
  const ViewPaths p(handle->root, handle->base);
  {
    UniqueFd lock = lock_view(p.lock, /*wait=*/true);
    std::error_code ec;
    if (!fs::exists(p.done, ec)) {
      fs::remove_all(p.dir, ec);  // ignore-error: a partial download; to_directory needs it empty
      try {
        checkpoint.to_directory(p.dir);
      } catch (...) {
        remove_view(p);  // no view without B.done has users; leave nothing behind
        throw;
      }
      UniqueFd marker = open_file(p.done, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC);
      marker.close(p.done.string());
    }
    handle->users = open_file(p.users, O_RDWR | O_CREAT | O_CLOEXEC);
    if (flock_retrying(handle->users.get(), LOCK_SH) != 0) {
      throw errno_error(errno, "lock", p.users.string());
    }
  }
  try {
    sweep_unused_views();
  } catch (const Error& e) {
    // ignore-error: the view asked for is ready; what others left is swept
    // by the next acquire or `cairn gc`.
    log::warn(fmt::format("sweeping {}: {}", handle->root.string(), e.what()));
  }
  path = p.dir;
  return handle;
}

std::vector<std::string> sweep_unused_views(bool dry_run) {
  const fs::path root = view_cache_root();
  std::set<std::string> bases;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    std::string base = name.substr(0, name.find('.'));
    if (is_view_name(base)) bases.insert(base);
  }
  if (ec && ec != std::errc::no_such_file_or_directory) {
    throw Error(ErrorCode::kIO, fmt::format("listing {}: {}", root.string(), ec.message()));
  }
  std::vector<std::string> removed;
  for (const auto& base : bases) {
    const ViewPaths p(root, base);
    if (dry_run) {
      // Probes only: nothing is created or removed.
      int fd = ::open(p.lock.c_str(), O_RDONLY | O_CLOEXEC);
      UniqueFd probe(fd);
      if (fd >= 0 && flock_retrying(fd, LOCK_SH | LOCK_NB) != 0) continue;  // downloading
      if (!in_use(p)) removed.push_back("file://" + p.dir.string());
      continue;
    }
    UniqueFd lock = lock_view(p.lock, /*wait=*/false);
    if (!lock) continue;  // a download in progress
    if (in_use(p)) continue;
    remove_view(p);
    removed.push_back("file://" + p.dir.string());
  }
  return removed;
}

}  // namespace cairn
