#include "util/fs.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <vector>

#include <fmt/format.h>

#include "cairn/error.h"
#include "util/settings.h"

namespace cairn {

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);  // ignore-error: destructor; close() reports errors
}

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);  // ignore-error: replaced descriptor
    fd_ = o.release();
  }
  return *this;
}

void UniqueFd::close(std::string_view path) {
  if (fd_ < 0) return;
  int fd = release();
  if (::close(fd) != 0) throw errno_error(errno, "close", path);
}

UniqueFd open_file(const std::filesystem::path& path, int flags, unsigned mode) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) throw errno_error(errno, "open", path.string());
  return UniqueFd(fd);
}

void write_all(int fd, std::span<const std::byte> data, std::string_view path) {
  const std::byte* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw errno_error(errno, "write", path);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
}

void pwrite_all(int fd, std::span<const std::byte> data, uint64_t offset, std::string_view path) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n =
        ::pwrite(fd, data.data() + done, data.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw errno_error(errno, "write", path);
    }
    done += static_cast<size_t>(n);
  }
}

void pread_all(int fd, std::span<std::byte> out, uint64_t offset, std::string_view path) {
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n =
        ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw errno_error(errno, "read", path);
    }
    if (n == 0) {
      throw Error(ErrorCode::kCorruption,
                  fmt::format("{}: unexpected end of file at byte offset {} (wanted {} more bytes)",
                              path, offset + done, out.size() - done));
    }
    done += static_cast<size_t>(n);
  }
}

size_t pread_some(int fd, std::span<std::byte> out, uint64_t offset, std::string_view path) {
  for (;;) {
    ssize_t n = ::pread(fd, out.data(), out.size(), static_cast<off_t>(offset));
    if (n >= 0) return static_cast<size_t>(n);
    if (errno != EINTR) throw errno_error(errno, "read", path);
  }
}

double cached_fraction(int fd, uint64_t size) {
  if (size == 0) return 0.0;
  void* m = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) return 0.0;  // ignore-error: only a hint for choosing a read path
  const long page = ::sysconf(_SC_PAGESIZE);
  const size_t pages = (size + static_cast<uint64_t>(page) - 1) / static_cast<uint64_t>(page);
  std::vector<unsigned char> resident(pages);
  double out = 0.0;
  if (::mincore(m, size, resident.data()) == 0) {
    size_t in = 0;
    for (unsigned char r : resident) in += r & 1;
    out = static_cast<double>(in) / static_cast<double>(pages);
  }
  ::munmap(m, size);  // ignore-error: nothing to do if unmapping fails
  return out;
}

void fsync_fd(int fd, std::string_view path) {
  if (::fsync(fd) != 0) throw errno_error(errno, "fsync", path);
}

void preallocate(int fd, uint64_t size, std::string_view path) {
  if (size == 0) return;
  for (;;) {
    if (::fallocate(fd, 0, 0, static_cast<off_t>(size)) == 0) return;
    if (errno == EINTR) continue;
    // ignore-error: a file system without fallocate (or without it for this
    // file) just writes into a file that grows as before.
    if (errno == EOPNOTSUPP || errno == ENOSYS || errno == EINVAL) return;
    throw errno_error(errno, fmt::format("preallocate {} bytes of", size), path);
  }
}

void fsync_dir(const std::filesystem::path& dir) {
  UniqueFd fd = open_file(dir, O_RDONLY | O_DIRECTORY);
  fsync_fd(fd.get(), dir.string());
  fd.close(dir.string());
}

void make_dirs_durable(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> created;
  std::filesystem::path p = dir;
  while (!p.empty()) {
    struct stat st;
    if (::stat(p.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) {
        throw Error(ErrorCode::kFailedPrecondition, fmt::format("{}: not a directory", p.string()));
      }
      break;
    }
    if (errno != ENOENT) throw errno_error(errno, "stat", p.string());
    created.push_back(p);
    if (p == p.parent_path()) break;
    p = p.parent_path();
  }
  for (auto it = created.rbegin(); it != created.rend(); ++it) {
    if (::mkdir(it->c_str(), 0755) != 0 && errno != EEXIST)
      throw errno_error(errno, "mkdir", it->string());
    fsync_dir(it->parent_path().empty() ? std::filesystem::path(".") : it->parent_path());
  }
}

std::string read_file(const std::filesystem::path& path) {
  UniqueFd fd = open_file(path, O_RDONLY);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) throw errno_error(errno, "stat", path.string());
  std::string out(static_cast<size_t>(st.st_size), '\0');
  pread_all(fd.get(), std::as_writable_bytes(std::span(out.data(), out.size())), 0, path.string());
  return out;
}

void WritebackHint::wrote(int fd, uint64_t bytes) {
  constexpr uint64_t kStep = 32 << 20;
  if (unflushed_.fetch_add(bytes) + bytes < kStep) return;
  unflushed_ = 0;
  ::sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);  // ignore-error: a hint
}

std::string expand_home(std::string_view path) {
  if (path.empty() || path.front() != '~' || (path.size() > 1 && path[1] != '/')) {
    return std::string(path);
  }
  std::string home = Settings::from(Environment::process()).home;
  if (home.empty()) {
    const passwd* pw = ::getpwuid(::getuid());
    if (pw == nullptr || pw->pw_dir == nullptr || *pw->pw_dir == '\0') {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}: cannot expand \"~\": HOME is not set and the user has no "
                              "home directory",
                              path));
    }
    home = pw->pw_dir;
  }
  return home + std::string(path.substr(1));
}

std::filesystem::path make_temp_dir(std::string_view prefix) {
  std::string templ =
      fmt::format("{}/{}XXXXXX", Settings::from(Environment::process()).temp_dir, prefix);
  if (::mkdtemp(templ.data()) == nullptr) throw errno_error(errno, "mkdtemp", templ);
  return templ;
}

}  // namespace cairn
