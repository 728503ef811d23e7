// The file backend: objects are plain files below a root directory.
//
// Write protocol (Writer::commit, Storage::put):
//   1. Create the parent directories, fsyncing each one's parent as it is made.
//   2. Write into "<dir>/.<name>.cairn-tmp-<unique>", created with O_EXCL, so
//      concurrent writers never share a temp file and a crash leaves only a
//      recognizable temp file, never a partial object under its real name.
//      When the size is known (WriteOptions::size) the file is given that
//      length at once, so parallel positional writes fill it instead of
//      extending it; direct writes go through a second O_DIRECT descriptor
//      of the same temp file, into blocks preallocate() allocated.
//   3. fsync the temp file: its data is durable.
//   4. rename() it over "<dir>/<name>": readers see the old object or the new
//      one, whole.
//   5. fsync "<dir>": the rename itself is durable.
// Steps 3 and 5 are skipped only for a writer opened with
// WriteOptions::durable = false (a file its caller may lose to a power cut;
// it still appears whole or not at all).
// Committed files are never modified in place; a new version is a new file.
//
// Remove protocol: unlink, then fsync the directory, so that a removal that
// returned is durable (the checkpoint deletion protocol depends on the
// manifest's removal being durable before data files go). Directories left
// empty are then removed up to the root, like an object store that has no
// directories.
//
// Confinement: every key is validated (no "..", no absolute path), and the
// real path of what is read must lie below the real path of the root, so a
// symbolic link inside a checkpoint cannot lead a reader outside of it.
//
// Incomplete writes are the temp files of step 2 and empty directories: a
// crash between mkdir and creating the temp file, or between the last unlink
// of a removal and its rmdir, leaves one. Discarding either removes it and
// prunes the directories it leaves empty.
//
// Locks are flock(2) on the lock file: the kernel releases them when the
// holder dies, even by SIGKILL.
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <utility>

#include <fmt/format.h>

#include "cairn/error.h"
#include "storage/backends.h"
#include "util/fs.h"

namespace cairn {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kTempMarker = ".cairn-tmp-";

bool is_temp_name(std::string_view name) {
  return name.size() > 1 && name.front() == '.' && name.find(kTempMarker) != std::string_view::npos;
}

std::string unique_suffix() {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t seed = std::random_device{}();
  return fmt::format("{}-{:x}-{}", ::getpid(), seed & 0xffffff, counter.fetch_add(1));
}

double mtime_of(const struct stat& st) {
  return static_cast<double>(st.st_mtim.tv_sec) + static_cast<double>(st.st_mtim.tv_nsec) * 1e-9;
}

// The real path of `p`, or of its nearest existing ancestor joined with the
// rest, so that confinement can be checked before the file exists.
fs::path real_path_prefix(const fs::path& p) {
  std::error_code ec;
  fs::path existing = p;
  fs::path rest;
  while (!existing.empty() && !fs::exists(fs::symlink_status(existing, ec))) {
    rest = rest.empty() ? existing.filename() : existing.filename() / rest;
    if (existing == existing.parent_path()) break;
    existing = existing.parent_path();
  }
  fs::path canonical = fs::weakly_canonical(existing, ec);
  if (ec) canonical = existing;
  return rest.empty() ? canonical : canonical / rest;
}

bool is_below(const fs::path& p, const fs::path& root) {
  auto [r, q] = std::mismatch(root.begin(), root.end(), p.begin(), p.end());
  return r == root.end();
}

// Removes `dir` and its parents while they are empty, stopping at `limit`.
void prune_empty_dirs(fs::path dir, const fs::path& limit) {
  while (dir != limit && is_below(dir, limit)) {
    if (::rmdir(dir.c_str()) != 0) return;  // ignore-error: not empty, or already gone
    fsync_dir(dir.parent_path());
    dir = dir.parent_path();
  }
}

class FileReader final : public Reader {
 public:
  FileReader(UniqueFd fd, uint64_t size, std::string name)
      : fd_(std::move(fd)), size_(size), name_(std::move(name)) {}
  uint64_t size() const override { return size_; }
  void read_at(uint64_t offset, std::span<std::byte> out) override {
    if (offset + out.size() > size_) {
      throw Error(ErrorCode::kCorruption,
                  fmt::format("{}: read of {} bytes at byte offset {} is past the end ({} bytes)",
                              name_, out.size(), offset, size_));
    }
    pread_all(fd_.get(), out, offset, name_);
  }

 private:
  UniqueFd fd_;
  uint64_t size_;
  std::string name_;
};

class FileWriter final : public Writer {
 public:
  FileWriter(fs::path final_path, std::string name, fs::path prune_limit,
             const WriteOptions& options)
      : final_(std::move(final_path)),
        name_(std::move(name)),
        prune_limit_(std::move(prune_limit)),
        durable_(options.durable) {
    const fs::path dir = final_.parent_path();
    // A concurrent remove() may prune the directory between mkdir and open;
    // recreate it a bounded number of times.
    for (int attempt = 0;; ++attempt) {
      make_dirs_durable(dir);
      temp_ =
          dir / fmt::format(".{}{}{}", final_.filename().string(), kTempMarker, unique_suffix());
      int fd = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd >= 0) {
        fd_ = UniqueFd(fd);
        break;
      }
      if (errno != ENOENT || attempt >= 3) throw errno_error(errno, "create", name_);
    }
    if (options.size > 0 && ::ftruncate(fd_.get(), static_cast<off_t>(options.size)) != 0) {
      const int err = errno;
      discard();
      throw errno_error(err, "truncate", name_);
    }
  }

  ~FileWriter() override {
    if (!committed_) discard();
  }

  void append(std::span<const std::byte> data) override {
    write_all(fd_.get(), data, name_);
    written_ += data.size();
    start_writeback(data.size());
  }

  void write_at(uint64_t offset, std::span<const std::byte> data) override {
    pwrite_all(fd_.get(), data, offset, name_);
    uint64_t end = offset + data.size();
    uint64_t seen = written_.load();
    while (end > seen && !written_.compare_exchange_weak(seen, end)) {
    }
    start_writeback(data.size());
  }

  size_t direct_alignment() override {
    std::call_once(direct_once_, [&] {
      // ignore-error: a file system without O_DIRECT (tmpfs) refuses the
      // open; the buffered path is then the only one, as documented.
      int fd = ::open(temp_.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
      if (fd < 0) return;
      direct_fd_ = UniqueFd(fd);
      // 4 KiB covers the logical block size of every common device and the
      // memory alignment Linux asks of O_DIRECT buffers.
      direct_align_ = 4096;
    });
    return direct_align_;
  }

  void write_direct(uint64_t offset, std::span<const std::byte> data, size_t valid) override {
    const size_t a = direct_alignment();
    if (a == 0 || offset % a != 0 || data.size() % a != 0 ||
        reinterpret_cast<uintptr_t>(data.data()) % a != 0 || valid > data.size()) {
      throw Error(ErrorCode::kFailedPrecondition,
                  fmt::format("{}: direct write of {} bytes at byte offset {} is not aligned to "
                              "{} bytes (or the file system has no direct I/O)",
                              name_, data.size(), offset, a));
    }
    pwrite_all(direct_fd_.get(), data, offset, name_);
    const uint64_t end = offset + valid;
    uint64_t seen = written_.load();
    while (end > seen && !written_.compare_exchange_weak(seen, end)) {
    }
  }

  void preallocate(uint64_t size) override { cairn::preallocate(fd_.get(), size, name_); }

  void commit() override {
    if (committed_)
      throw Error(ErrorCode::kFailedPrecondition, fmt::format("{}: committed twice", name_));
    // write_at ranges that were never written must still count toward the
    // size, and the padding of the last direct write must not.
    struct stat st;
    if (::fstat(fd_.get(), &st) != 0) throw errno_error(errno, "stat", name_);
    if (static_cast<uint64_t>(st.st_size) != written_ &&
        ::ftruncate(fd_.get(), static_cast<off_t>(written_.load())) != 0) {
      throw errno_error(errno, "truncate", name_);
    }
    direct_fd_ = UniqueFd();
    if (durable_) fsync_fd(fd_.get(), name_);
    fd_.close(name_);
    if (::rename(temp_.c_str(), final_.c_str()) != 0) throw errno_error(errno, "rename", name_);
    committed_ = true;
    if (durable_) fsync_dir(final_.parent_path());
  }

  uint64_t bytes_written() const override { return written_; }

 private:
  // Early writeback only pays off when commit() will fsync.
  void start_writeback(uint64_t n) {
    if (durable_) writeback_.wrote(fd_.get(), n);
  }

  // Removes the temp file of a write that will never be committed.
  void discard() noexcept {
    fd_ = UniqueFd();
    ::unlink(temp_.c_str());  // ignore-error: abandoned write; gc removes what remains
    try {
      prune_empty_dirs(final_.parent_path(), prune_limit_);
    } catch (const Error&) {
      // ignore-error: an empty directory is harmless and gc removes it
    }
  }

  fs::path final_;
  fs::path temp_;
  std::string name_;
  fs::path prune_limit_;
  bool durable_;
  UniqueFd fd_;
  std::atomic<uint64_t> written_{0};
  WritebackHint writeback_;
  bool committed_ = false;
  std::once_flag direct_once_;
  UniqueFd direct_fd_;  // the temp file again, opened with O_DIRECT
  size_t direct_align_ = 0;
};

class FileLock final : public Lock {
 public:
  explicit FileLock(UniqueFd fd) : fd_(std::move(fd)) {}
  ~FileLock() override { ::flock(fd_.get(), LOCK_UN); }  // ignore-error: close releases it too

 private:
  UniqueFd fd_;
};

class FileStorage final : public Storage {
 public:
  // `prune_limit` is the root of the storage first opened: removals prune
  // empty directories up to it, so deleting a checkpoint through a child
  // storage removes the checkpoint's own directory too.
  FileStorage(fs::path root, fs::path prune_limit)
      : root_(std::move(root)), prune_limit_(std::move(prune_limit)) {}

  std::string uri() const override { return "file://" + root_.string(); }

  std::shared_ptr<Storage> child(std::string_view prefix) const override {
    if (prefix.empty()) return std::make_shared<FileStorage>(root_, prune_limit_);
    validate_key(prefix);
    return std::make_shared<FileStorage>(root_ / std::string(prefix), prune_limit_);
  }

  std::unique_ptr<Writer> open_writer(std::string_view key, const WriteOptions& options) override {
    fs::path p = path_of(key);
    check_confined(p.parent_path(), key);
    return std::make_unique<FileWriter>(p, uri_of(key), prune_limit_, options);
  }

  std::unique_ptr<Reader> open_reader(std::string_view key) override {
    fs::path p = path_of(key);
    check_confined(p, key);
    UniqueFd fd = open_file(p, O_RDONLY);
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) throw errno_error(errno, "stat", uri_of(key));
    if (!S_ISREG(st.st_mode)) {
      throw Error(ErrorCode::kNotFound, fmt::format("{}: not a regular file", uri_of(key)));
    }
    return std::make_unique<FileReader>(std::move(fd), static_cast<uint64_t>(st.st_size),
                                        uri_of(key));
  }

  std::optional<ObjectInfo> stat(std::string_view key) override {
    fs::path p = path_of(key);
    struct stat st;
    if (::stat(p.c_str(), &st) != 0) {
      if (errno == ENOENT || errno == ENOTDIR) return std::nullopt;
      throw errno_error(errno, "stat", uri_of(key));
    }
    if (!S_ISREG(st.st_mode)) return std::nullopt;
    check_confined(p, key);
    return ObjectInfo{std::string(key), static_cast<uint64_t>(st.st_size), mtime_of(st)};
  }

  std::vector<ObjectInfo> list(std::string_view prefix) override {
    std::vector<ObjectInfo> out;
    walk(prefix, [&](const std::string& key, const struct stat& st, Entry kind) {
      if (kind == Entry::kObject) {
        out.push_back({key, static_cast<uint64_t>(st.st_size), mtime_of(st)});
      }
    });
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.key < b.key; });
    return out;
  }

  std::vector<ObjectInfo> list_with_incomplete(std::string_view prefix,
                                               std::vector<std::string>& incomplete) override {
    std::vector<ObjectInfo> out;
    incomplete.clear();
    walk(prefix, [&](const std::string& key, const struct stat& st, Entry kind) {
      if (kind == Entry::kObject) {
        out.push_back({key, static_cast<uint64_t>(st.st_size), mtime_of(st)});
      } else {
        incomplete.push_back(key);
      }
    });
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.key < b.key; });
    std::sort(incomplete.begin(), incomplete.end());
    return out;
  }

  std::vector<std::string> list_names(std::string_view prefix) override {
    std::vector<std::string> out;
    for_each_in_folder(prefix, [&](int dfd, const char* name, const struct stat& st) {
      if (S_ISDIR(st.st_mode)) {
        out.push_back(std::string(name) + '/');
        return;
      }
      struct stat target = st;
      if (S_ISLNK(st.st_mode) && ::fstatat(dfd, name, &target, 0) != 0) return;  // dangling
      if (S_ISREG(target.st_mode) && !is_temp_name(name)) out.emplace_back(name);
    });
    std::sort(out.begin(), out.end());
    return out;
  }

  // One directory read: the temporary files directly in it.
  std::vector<std::string> list_incomplete_at(std::string_view prefix) override {
    std::vector<std::string> out;
    for_each_in_folder(prefix, [&](int, const char* name, const struct stat& st) {
      if (S_ISREG(st.st_mode) && is_temp_name(name)) out.push_back(join_key(prefix, name));
    });
    std::sort(out.begin(), out.end());
    return out;
  }

  // Calls `fn` for each entry directly in the folder `prefix` (none when it
  // does not exist). Only the type of each entry is read: readdir's d_type
  // tells it without reading the entry's inode, so an experiment of
  // thousands of checkpoint folders costs one directory read.
  template <typename Fn>
  void for_each_in_folder(std::string_view prefix, Fn&& fn) {
    const fs::path dir = prefix.empty() ? root_ : path_of(prefix);
    int fd = open_folder(dir, prefix);
    if (fd < 0) {
      if (errno == ENOENT || errno == ENOTDIR || errno == ELOOP) return;
      throw errno_error(errno, "list", uri_of(prefix));
    }
    for_each_entry(UniqueFd(fd), prefix, EntryStat::kTypeOnly, std::forward<Fn>(fn));
  }

  void remove(std::string_view key) override {
    fs::path p = path_of(key);
    if (::unlink(p.c_str()) != 0) {
      if (errno == ENOENT || errno == ENOTDIR) return;
      throw errno_error(errno, "remove", uri_of(key));
    }
    fsync_dir(p.parent_path());
    prune_empty_dirs(p.parent_path(), prune_limit_);
  }

  void rename(std::string_view from, std::string_view to) override {
    const fs::path src = path_of(from);
    const fs::path dst = path_of(to);
    struct stat st;
    if (::lstat(src.c_str(), &st) != 0) throw errno_error(errno, "rename", uri_of(from));
    if (!(S_ISREG(st.st_mode) || S_ISLNK(st.st_mode)) || is_temp_name(src.filename().string())) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}: not an object, cannot rename it", uri_of(from)));
    }
    // A concurrent remove() may prune the target's folder between mkdir and
    // rename (the manager's deleter empties the trash while retention fills
    // it); make it again a bounded number of times.
    for (int attempt = 0;; ++attempt) {
      try {
        make_dirs_durable(dst.parent_path());
      } catch (const Error& e) {
        if (e.code() == ErrorCode::kNotFound && attempt < 8) continue;
        throw;
      }
      if (::rename(src.c_str(), dst.c_str()) == 0) return;
      const int err = errno;
      if (err == ENOENT && attempt < 8 && ::lstat(src.c_str(), &st) == 0) continue;
      throw errno_error(err, fmt::format("rename to {}", uri_of(to)), uri_of(from));
    }
  }

  std::unique_ptr<Lock> try_lock(std::string_view key) override {
    fs::path p = path_of(key);
    make_dirs_durable(p.parent_path());
    UniqueFd fd = open_file(p, O_RDWR | O_CREAT);
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno == EWOULDBLOCK) {
        std::string holder = read_file(p);
        while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' '))
          holder.pop_back();
        throw Error(ErrorCode::kLocked,
                    fmt::format("{}: locked by another writer{}", uri_of(key),
                                holder.empty() ? "" : fmt::format(" ({})", holder)),
                    /*retryable=*/true);
      }
      throw errno_error(errno, "lock", uri_of(key));
    }
    // Who holds it, for the error message of the next one who tries.
    std::string who = fmt::format("pid {} on {}\n", ::getpid(), hostname());
    if (::ftruncate(fd.get(), 0) == 0) {
      // ignore-error: informational only. (A cast to void does not quiet
      // g++'s warn_unused_result, which glibc's fortified pwrite carries.)
      [[maybe_unused]] const ssize_t n = ::pwrite(fd.get(), who.data(), who.size(), 0);
    }
    return std::make_unique<FileLock>(std::move(fd));
  }

  bool is_locked(std::string_view key) override {
    fs::path p = path_of(key);
    int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT || errno == ENOTDIR) return false;
      throw errno_error(errno, "open", uri_of(key));
    }
    UniqueFd owned(fd);
    // A shared probe: it fails exactly when an exclusive holder exists, and
    // is dropped at once.
    if (::flock(fd, LOCK_SH | LOCK_NB) == 0) return false;
    if (errno == EWOULDBLOCK) return true;
    throw errno_error(errno, "lock", uri_of(key));
  }

  std::vector<std::string> list_incomplete(std::string_view prefix) override {
    std::vector<std::string> out;
    walk(prefix, [&](const std::string& key, const struct stat&, Entry kind) {
      if (kind != Entry::kObject) out.push_back(key);
    });
    std::sort(out.begin(), out.end());
    return out;
  }

  void discard_incomplete(std::string_view id) override {
    fs::path p = path_of(id);
    struct stat st;
    if (::lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      if (::rmdir(p.c_str()) != 0) {
        // Gone, or no longer empty (a writer began using it): not a leftover.
        if (errno == ENOENT || errno == ENOTEMPTY || errno == EEXIST) return;
        throw errno_error(errno, "remove directory", uri_of(id));
      }
      fsync_dir(p.parent_path());
      prune_empty_dirs(p.parent_path(), prune_limit_);
      return;
    }
    std::string_view name =
        id.substr(id.rfind('/') == std::string_view::npos ? 0 : id.rfind('/') + 1);
    if (!is_temp_name(name)) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}: not an incomplete write", uri_of(id)));
    }
    remove(id);
  }

  void remove_empty_folder(std::string_view prefix) override {
    prune_empty_dirs(prefix.empty() ? root_ : path_of(prefix), prune_limit_);
  }

  StorageCapabilities capabilities() const override {
    StorageCapabilities caps;
    caps.local_root = root_;
    caps.renames = true;
    return caps;
  }

 private:
  fs::path path_of(std::string_view key) const {
    validate_key(key);
    return root_ / std::string(key);
  }

  // Throws kCorruption if the real path of `p` (the path of `key`, or its
  // parent) leaves the real path of the root.
  void check_confined(const fs::path& p, std::string_view key) const {
    // Keys have no ".." (validate_key), so only a symbolic link below the
    // root can lead out of it. Looking for one costs a stat per component,
    // where resolving both real paths cost a dozen lookups of whole paths.
    if (!link_below_root(key)) return;
    fs::path real_root = real_path_prefix(root_);
    fs::path real = real_path_prefix(p);
    if (!is_below(real, real_root)) {
      throw Error(ErrorCode::kCorruption,
                  fmt::format("{}: a symbolic link leads outside {} (to {})", uri_of(key), uri(),
                              real.string()));
    }
  }

  // Whether a component of `key` below the root may be a symbolic link:
  // false when each exists and is none, or the rest does not exist yet.
  bool link_below_root(std::string_view key) const {
    std::string path = root_.native();
    size_t start = 0;
    while (start < key.size()) {
      size_t end = key.find('/', start);
      if (end == std::string_view::npos) end = key.size();
      path += '/';
      path += key.substr(start, end - start);
      struct stat st;
      if (::lstat(path.c_str(), &st) != 0) return errno != ENOENT;  // unsure: check the slow way
      if (S_ISLNK(st.st_mode)) return true;
      start = end + 1;
    }
    return false;
  }

  enum class Entry { kObject, kTemp, kEmptyDir };

  // Calls fn(key, stat, kind) for every regular file (or link to one) below
  // `prefix`, and for every empty directory strictly below it (symbolic links
  // to directories are not followed).
  template <typename Fn>
  void walk(std::string_view prefix, Fn&& fn) {
    fs::path start = prefix.empty() ? root_ : path_of(prefix);
    int fd = open_folder(start, prefix);
    if (fd < 0) {
      if (errno == ENOENT || errno == ENOTDIR || errno == ELOOP) return;
      throw errno_error(errno, "list", uri_of(prefix));
    }
    // Keys are the paths below root_.
    const std::string& root = root_.native();
    const std::string& path = start.native();
    std::string key;
    if (path.size() > root.size() && path.compare(0, root.size(), root) == 0) {
      key = path.substr(root.size() + (root.back() == '/' ? 0 : 1));
    } else if (path != root) {
      key = start.lexically_relative(root_).generic_string();
    }
    walk_dir(UniqueFd(fd), key, prefix, fn);
  }

  // Opens the folder `dir` of `prefix` for listing. The root may be a
  // symbolic link (the user chose it); folders below it are not followed,
  // as no walk follows them.
  static int open_folder(const fs::path& dir, std::string_view prefix) {
    return ::open(dir.c_str(),
                  O_RDONLY | O_DIRECTORY | O_CLOEXEC | (prefix.empty() ? 0 : O_NOFOLLOW));
  }

  // What for_each_entry() passes for each entry: its whole lstat, or (where
  // readdir's d_type says it is a directory or a regular file) only st_mode's
  // file type, the rest zero.
  enum class EntryStat { kFull, kTypeOnly };

  // Calls fn(dir_fd, name, lstat) for every entry of the open directory
  // `dir` but "." and "..", looked up relative to it (fstatat), so a listing
  // of many thousand files never resolves a full path. An entry removed while
  // the listing runs is skipped. Returns whether the directory had any entry.
  template <typename Fn>
  bool for_each_entry(UniqueFd dir, std::string_view prefix, Fn&& fn) {
    return for_each_entry(std::move(dir), prefix, EntryStat::kFull, std::forward<Fn>(fn));
  }
  template <typename Fn>
  bool for_each_entry(UniqueFd dir, std::string_view prefix, EntryStat what, Fn&& fn) {
    DIR* d = ::fdopendir(dir.get());
    if (!d) throw errno_error(errno, "list", uri_of(prefix));
    const int dfd = dir.release();  // closedir() closes it
    struct Closer {
      DIR* d;
      ~Closer() { ::closedir(d); }
    } closer{d};
    bool any = false;
    for (;;) {
      errno = 0;
      const struct dirent* e = ::readdir(d);
      if (!e) {
        if (errno != 0) throw errno_error(errno, "list", uri_of(prefix));
        return any;
      }
      if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
      any = true;
      struct stat st {};
      if (what == EntryStat::kTypeOnly && (e->d_type == DT_DIR || e->d_type == DT_REG)) {
        st.st_mode = e->d_type == DT_DIR ? S_IFDIR : S_IFREG;
        fn(dfd, e->d_name, st);
        continue;
      }
      if (::fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT) continue;
        throw errno_error(errno, "list", uri_of(join_key(prefix, e->d_name)));
      }
      fn(dfd, e->d_name, st);
    }
  }

  // walk() below the open directory `dir`, whose key is `key`. Returns
  // whether the directory had any entry.
  template <typename Fn>
  bool walk_dir(UniqueFd dir, const std::string& key, std::string_view prefix, Fn& fn) {
    return for_each_entry(
        std::move(dir), prefix, [&](int dfd, const char* name, const struct stat& entry) {
          const std::string child =
              key.empty() ? std::string(name) : fmt::format("{}/{}", key, name);
          struct stat st = entry;
          if (S_ISDIR(st.st_mode)) {
            int sub = ::openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub < 0) {
              if (errno == ENOENT || errno == ENOTDIR || errno == ELOOP)
                return;  // replaced meanwhile
              throw errno_error(errno, "list", uri_of(child));
            }
            if (!walk_dir(UniqueFd(sub), child, prefix, fn)) fn(child, st, Entry::kEmptyDir);
            return;
          }
          if (S_ISLNK(st.st_mode) && ::fstatat(dfd, name, &st, 0) != 0) return;  // dangling
          if (!S_ISREG(st.st_mode)) return;
          fn(child, st, is_temp_name(name) ? Entry::kTemp : Entry::kObject);
        });
  }

  static std::string hostname() {
    char buf[HOST_NAME_MAX + 1] = {};
    if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown host";
    return buf;
  }

  fs::path root_;
  fs::path prune_limit_;
};

}  // namespace

std::shared_ptr<Storage> open_file_storage(const std::filesystem::path& root) {
  return std::make_shared<FileStorage>(root, root);
}

}  // namespace cairn
