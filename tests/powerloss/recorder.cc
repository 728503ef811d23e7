// The power-loss harness's recorder: an LD_PRELOAD library that logs the
// file-system calls a workload makes below one folder, with the bytes it
// writes, so that crash_model.h can rebuild what a power cut may leave.
//
//   CAIRN_POWERLOSS_ROOT   the folder to watch (a real path, no symbolic link)
//   CAIRN_POWERLOSS_TRACE  the trace file to append to
//
// The trace format (one record per line, paths relative to the root and
// %-escaped, written bytes following their record) is parsed by
// parse_trace() in crash_model.cc, which documents it.
//
// Every watched call runs under one process-wide mutex, the real call and its
// record together, so the trace's order is the order the calls took effect in
// even when threads (parallel block writers, the background deleter) race.
// Only calls that succeed are recorded. Calls made inside libc (fopen's own
// open) are not seen; Cairn writes experiment files only with the calls
// below.
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

namespace {

pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

struct Guard {
  Guard() { pthread_mutex_lock(&g_mu); }
  ~Guard() { pthread_mutex_unlock(&g_mu); }
};

template <class F>
F real(F& slot, const char* name) {
  if (!slot) slot = reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
  return slot;
}

#define REAL(name) real(real_##name, #name)

using open_t = int (*)(const char*, int, ...);
using open2_t = int (*)(const char*, int);
using openat_t = int (*)(int, const char*, int, ...);
using openat2_t = int (*)(int, const char*, int);
using write_t = ssize_t (*)(int, const void*, size_t);
using pwrite_t = ssize_t (*)(int, const void*, size_t, off_t);
using writev_t = ssize_t (*)(int, const struct iovec*, int);
using pwritev_t = ssize_t (*)(int, const struct iovec*, int, off_t);
using pwritev2_t = ssize_t (*)(int, const struct iovec*, int, off_t, int);
using fallocate_t = int (*)(int, int, off_t, off_t);
using ftruncate_t = int (*)(int, off_t);
using fd_t = int (*)(int);
using sync_t = void (*)();
using path_t = int (*)(const char*);
using path2_t = int (*)(const char*, const char*);
using renameat_t = int (*)(int, const char*, int, const char*);
using renameat2_t = int (*)(int, const char*, int, const char*, unsigned);
using unlinkat_t = int (*)(int, const char*, int);
using mkdir_t = int (*)(const char*, mode_t);
using mkdirat_t = int (*)(int, const char*, mode_t);
using linkat_t = int (*)(int, const char*, int, const char*, int);

open_t real_open, real_open64;
open2_t real___open_2, real___open64_2;
openat_t real_openat, real_openat64;
openat2_t real___openat_2, real___openat64_2;
write_t real_write;
pwrite_t real_pwrite, real_pwrite64;
writev_t real_writev;
pwritev_t real_pwritev, real_pwritev64;
pwritev2_t real_pwritev2;
fallocate_t real_fallocate, real_fallocate64;
ftruncate_t real_ftruncate, real_ftruncate64;
fd_t real_fsync, real_fdatasync, real_syncfs, real_close;
sync_t real_sync;
path_t real_unlink, real_rmdir, real_remove;
path2_t real_rename, real_link;
renameat_t real_renameat;
renameat2_t real_renameat2;
unlinkat_t real_unlinkat;
mkdir_t real_mkdir;
mkdirat_t real_mkdirat;
linkat_t real_linkat;

// Per descriptor: whether it is a file below the root, and its inode.
constexpr int kMaxFd = 1 << 16;
struct Tracked {
  uint64_t ino;
  bool on;
};
Tracked g_fds[kMaxFd];

char g_root[PATH_MAX];
size_t g_root_len = 0;
int g_trace = -1;
bool g_init = false;

void init() {
  if (g_init) return;
  g_init = true;
  const char* root = getenv("CAIRN_POWERLOSS_ROOT");
  const char* trace = getenv("CAIRN_POWERLOSS_TRACE");
  if (!root || !trace || strlen(root) >= sizeof g_root) return;
  strcpy(g_root, root);
  g_root_len = strlen(g_root);
  while (g_root_len > 1 && g_root[g_root_len - 1] == '/') g_root[--g_root_len] = '\0';
  g_trace = REAL(open)(trace, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

void emit(const char* data, size_t n) {
  while (n > 0) {
    ssize_t w = REAL(write)(g_trace, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      abort();  // a trace with a hole would make every crash state wrong
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
}

void emit_str(const char* s) { emit(s, strlen(s)); }

// Appends `rel` %-escaped (space, newline, '%').
void emit_path(const char* rel) {
  char buf[4];
  for (const char* p = rel; *p; ++p) {
    if (*p == ' ' || *p == '\n' || *p == '%' || *p == '\r') {
      snprintf(buf, sizeof buf, "%%%02X", static_cast<unsigned char>(*p));
      emit(buf, 3);
    } else {
      emit(p, 1);
    }
  }
}

// Lexically normalizes the absolute path in `buf` in place ("//", "/./",
// "/../"); symbolic links are not resolved (the root is a real path).
void normalize(char* buf) {
  char out[PATH_MAX];
  size_t n = 0;
  const char* p = buf;
  while (*p) {
    while (*p == '/') ++p;
    if (!*p) break;
    const char* end = strchr(p, '/');
    size_t len = end ? static_cast<size_t>(end - p) : strlen(p);
    if (len == 1 && p[0] == '.') {
    } else if (len == 2 && p[0] == '.' && p[1] == '.') {
      while (n > 0 && out[n - 1] != '/') --n;
      if (n > 0) --n;
    } else if (n + 1 + len < sizeof out) {
      out[n++] = '/';
      memcpy(out + n, p, len);
      n += len;
    }
    p += len;
  }
  if (n == 0) out[n++] = '/';
  out[n] = '\0';
  strcpy(buf, out);
}

// The path of `path` (relative to `dirfd`) relative to the root, in `rel`;
// false when it is not below the root (or the root itself, which counts).
bool relative(int dirfd, const char* path, char* rel) {
  if (g_trace < 0 || !path) return false;
  char abs[PATH_MAX];
  if (path[0] == '/') {
    if (strlen(path) >= sizeof abs) return false;
    strcpy(abs, path);
  } else {
    char base[PATH_MAX];
    if (dirfd == AT_FDCWD) {
      if (!getcwd(base, sizeof base)) return false;
    } else {
      char link[64];
      snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
      ssize_t n = readlink(link, base, sizeof base - 1);
      if (n < 0) return false;
      base[n] = '\0';
    }
    if (snprintf(abs, sizeof abs, "%s/%s", base, path) >= static_cast<int>(sizeof abs)) {
      return false;
    }
  }
  normalize(abs);
  if (strncmp(abs, g_root, g_root_len) != 0) return false;
  if (abs[g_root_len] == '\0') {
    rel[0] = '\0';
    return true;
  }
  if (abs[g_root_len] != '/') return false;
  strcpy(rel, abs + g_root_len + 1);
  return true;
}

bool tracked(int fd) { return fd >= 0 && fd < kMaxFd && g_fds[fd].on; }

void record_open(int dirfd, const char* path, int flags, bool existed, int fd) {
  char rel[PATH_MAX];
  if (fd < 0 || fd >= kMaxFd) return;
  g_fds[fd].on = false;
  if (!relative(dirfd, path, rel)) return;
  struct stat st;
  if (fstat(fd, &st) != 0) return;
  char line[128];
  if (S_ISREG(st.st_mode)) {
    g_fds[fd] = {static_cast<uint64_t>(st.st_ino), true};
    if (!existed) {
      snprintf(line, sizeof line, "create %llu ", static_cast<unsigned long long>(st.st_ino));
      emit_str(line);
      emit_path(rel);
      emit_str("\n");
    }
    snprintf(line, sizeof line, "open %llu %x ", static_cast<unsigned long long>(st.st_ino),
             static_cast<unsigned>(flags));
    emit_str(line);
    emit_path(rel);
    emit_str("\n");
    if (existed && (flags & O_TRUNC) && (flags & O_ACCMODE) != O_RDONLY) {
      snprintf(line, sizeof line, "trunc %llu 0\n", static_cast<unsigned long long>(st.st_ino));
      emit_str(line);
    }
  } else if (S_ISDIR(st.st_mode)) {
    g_fds[fd] = {static_cast<uint64_t>(st.st_ino), true};
  }
}

bool exists_at(int dirfd, const char* path) {
  struct stat st;
  return fstatat(dirfd, path, &st, AT_SYMLINK_NOFOLLOW) == 0;
}

template <class Call>
int do_open(int dirfd, const char* path, int flags, Call call) {
  init();
  Guard g;
  char rel[PATH_MAX];
  const bool watched = relative(dirfd, path, rel);
  const bool existed = watched && exists_at(dirfd, path);
  int fd = call();
  if (fd >= 0) {
    if (watched) {
      const int saved = errno;
      record_open(dirfd, path, flags, existed, fd);
      errno = saved;
    } else if (fd < kMaxFd) {
      g_fds[fd].on = false;
    }
  }
  return fd;
}

void record_write(int fd, uint64_t offset, const struct iovec* iov, int iovcnt, size_t n) {
  char line[128];
  snprintf(line, sizeof line, "write %llu %llu %zu\n",
           static_cast<unsigned long long>(g_fds[fd].ino), static_cast<unsigned long long>(offset),
           n);
  emit_str(line);
  size_t left = n;
  for (int i = 0; i < iovcnt && left > 0; ++i) {
    size_t take = iov[i].iov_len < left ? iov[i].iov_len : left;
    emit(static_cast<const char*>(iov[i].iov_base), take);
    left -= take;
  }
  emit_str("\n");
}

// Where a write() without an offset lands.
uint64_t current_offset(int fd) {
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0 && (fl & O_APPEND)) {
    struct stat st;
    return fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  }
  off_t o = lseek(fd, 0, SEEK_CUR);
  return o < 0 ? 0 : static_cast<uint64_t>(o);
}

template <class Call>
ssize_t do_write(int fd, const struct iovec* iov, int iovcnt, int64_t offset, Call call) {
  init();
  Guard g;
  if (!tracked(fd)) return call();
  const uint64_t at = offset >= 0 ? static_cast<uint64_t>(offset) : current_offset(fd);
  ssize_t n = call();
  if (n > 0) {
    const int saved = errno;
    record_write(fd, at, iov, iovcnt, static_cast<size_t>(n));
    errno = saved;
  }
  return n;
}

template <class Call>
int do_fd_op(int fd, const char* what, Call call) {
  init();
  Guard g;
  int r = call();
  if (r == 0 && tracked(fd)) {
    const int saved = errno;
    struct stat st;
    char line[128];
    if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
      char link[64], path[PATH_MAX], rel[PATH_MAX];
      snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
      ssize_t n = readlink(link, path, sizeof path - 1);
      if (n > 0) {
        path[n] = '\0';
        if (relative(AT_FDCWD, path, rel)) {
          emit_str("fsyncdir ");
          emit_path(rel);
          emit_str("\n");
        }
      }
    } else {
      snprintf(line, sizeof line, "%s %llu\n", what,
               static_cast<unsigned long long>(g_fds[fd].ino));
      emit_str(line);
    }
    errno = saved;
  }
  return r;
}

// Records "<op> <path>" (or "<op> <from> <to>") when every path is watched.
template <class Call>
int do_path_op(const char* op, int dfd1, const char* p1, int dfd2, const char* p2, Call call) {
  init();
  Guard g;
  char r1[PATH_MAX], r2[PATH_MAX];
  const bool w1 = relative(dfd1, p1, r1);
  const bool w2 = p2 ? relative(dfd2, p2, r2) : true;
  // A removal of a name that does not exist is the workload's marker
  // ("<root>/.powerloss-mark-<text>"), recorded as "mark <text>".
  constexpr const char kMark[] = ".powerloss-mark-";
  if (w1 && !p2 && strncmp(r1, kMark, sizeof kMark - 1) == 0) {
    emit_str("mark ");
    emit_path(r1 + sizeof kMark - 1);
    emit_str("\n");
    errno = ENOENT;
    return -1;
  }
  int r = call();
  if (r == 0 && w1 && w2) {
    const int saved = errno;
    emit_str(op);
    emit_str(" ");
    emit_path(r1);
    if (p2) {
      emit_str(" ");
      emit_path(r2);
    }
    emit_str("\n");
    errno = saved;
  }
  return r;
}

mode_t va_mode(int flags, va_list ap) {
  return (flags & (O_CREAT | O_TMPFILE)) ? static_cast<mode_t>(va_arg(ap, int)) : 0;
}

}  // namespace

extern "C" {

__attribute__((constructor)) static void powerloss_recorder_init() {
  Guard g;
  init();
}

int open(const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t mode = va_mode(flags, ap);
  va_end(ap);
  return do_open(AT_FDCWD, path, flags, [&] { return REAL(open)(path, flags, mode); });
}
int open64(const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t mode = va_mode(flags, ap);
  va_end(ap);
  return do_open(AT_FDCWD, path, flags, [&] { return REAL(open64)(path, flags, mode); });
}
int __open_2(const char* path, int flags) {
  return do_open(AT_FDCWD, path, flags, [&] { return REAL(__open_2)(path, flags); });
}
int __open64_2(const char* path, int flags) {
  return do_open(AT_FDCWD, path, flags, [&] { return REAL(__open64_2)(path, flags); });
}
int openat(int dirfd, const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t mode = va_mode(flags, ap);
  va_end(ap);
  return do_open(dirfd, path, flags, [&] { return REAL(openat)(dirfd, path, flags, mode); });
}
int openat64(int dirfd, const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t mode = va_mode(flags, ap);
  va_end(ap);
  return do_open(dirfd, path, flags, [&] { return REAL(openat64)(dirfd, path, flags, mode); });
}
int __openat_2(int dirfd, const char* path, int flags) {
  return do_open(dirfd, path, flags, [&] { return REAL(__openat_2)(dirfd, path, flags); });
}
int __openat64_2(int dirfd, const char* path, int flags) {
  return do_open(dirfd, path, flags, [&] { return REAL(__openat64_2)(dirfd, path, flags); });
}

int close(int fd) {
  init();
  Guard g;
  if (fd >= 0 && fd < kMaxFd) g_fds[fd].on = false;
  return REAL(close)(fd);
}

ssize_t write(int fd, const void* buf, size_t n) {
  struct iovec v = {const_cast<void*>(buf), n};
  return do_write(fd, &v, 1, -1, [&] { return REAL(write)(fd, buf, n); });
}
ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) {
  struct iovec v = {const_cast<void*>(buf), n};
  return do_write(fd, &v, 1, off, [&] { return REAL(pwrite)(fd, buf, n, off); });
}
ssize_t pwrite64(int fd, const void* buf, size_t n, off_t off) {
  struct iovec v = {const_cast<void*>(buf), n};
  return do_write(fd, &v, 1, off, [&] { return REAL(pwrite64)(fd, buf, n, off); });
}
ssize_t writev(int fd, const struct iovec* iov, int cnt) {
  return do_write(fd, iov, cnt, -1, [&] { return REAL(writev)(fd, iov, cnt); });
}
ssize_t pwritev(int fd, const struct iovec* iov, int cnt, off_t off) {
  return do_write(fd, iov, cnt, off, [&] { return REAL(pwritev)(fd, iov, cnt, off); });
}
ssize_t pwritev64(int fd, const struct iovec* iov, int cnt, off_t off) {
  return do_write(fd, iov, cnt, off, [&] { return REAL(pwritev64)(fd, iov, cnt, off); });
}
ssize_t pwritev2(int fd, const struct iovec* iov, int cnt, off_t off, int flags) {
  return do_write(fd, iov, cnt, off, [&] { return REAL(pwritev2)(fd, iov, cnt, off, flags); });
}

static int do_fallocate(fallocate_t f, int fd, int mode, off_t off, off_t len) {
  init();
  Guard g;
  int r = f(fd, mode, off, len);
  if (r == 0 && tracked(fd)) {
    char line[160];
    snprintf(line, sizeof line, "falloc %llu %d %lld %lld\n",
             static_cast<unsigned long long>(g_fds[fd].ino), mode, static_cast<long long>(off),
             static_cast<long long>(len));
    emit_str(line);
  }
  return r;
}
int fallocate(int fd, int mode, off_t off, off_t len) {
  return do_fallocate(REAL(fallocate), fd, mode, off, len);
}
int fallocate64(int fd, int mode, off_t off, off_t len) {
  return do_fallocate(REAL(fallocate64), fd, mode, off, len);
}

static int do_ftruncate(ftruncate_t f, int fd, off_t len) {
  init();
  Guard g;
  int r = f(fd, len);
  if (r == 0 && tracked(fd)) {
    char line[128];
    snprintf(line, sizeof line, "trunc %llu %lld\n", static_cast<unsigned long long>(g_fds[fd].ino),
             static_cast<long long>(len));
    emit_str(line);
  }
  return r;
}
int ftruncate(int fd, off_t len) { return do_ftruncate(REAL(ftruncate), fd, len); }
int ftruncate64(int fd, off_t len) { return do_ftruncate(REAL(ftruncate64), fd, len); }

int fsync(int fd) {
  return do_fd_op(fd, "fsync", [&] { return REAL(fsync)(fd); });
}
int fdatasync(int fd) {
  return do_fd_op(fd, "fdatasync", [&] { return REAL(fdatasync)(fd); });
}

int syncfs(int fd) {
  init();
  Guard g;
  int r = REAL(syncfs)(fd);
  if (r == 0 && g_trace >= 0) emit_str("sync\n");
  return r;
}
void sync() {
  init();
  Guard g;
  REAL(sync)();
  if (g_trace >= 0) emit_str("sync\n");
}

int unlink(const char* p) {
  return do_path_op("unlink", AT_FDCWD, p, AT_FDCWD, nullptr, [&] { return REAL(unlink)(p); });
}
int rmdir(const char* p) {
  return do_path_op("rmdir", AT_FDCWD, p, AT_FDCWD, nullptr, [&] { return REAL(rmdir)(p); });
}
int remove(const char* p) {
  struct stat st;
  const bool dir = lstat(p, &st) == 0 && S_ISDIR(st.st_mode);
  return do_path_op(dir ? "rmdir" : "unlink", AT_FDCWD, p, AT_FDCWD, nullptr,
                    [&] { return REAL(remove)(p); });
}
int unlinkat(int dfd, const char* p, int flags) {
  return do_path_op((flags & AT_REMOVEDIR) ? "rmdir" : "unlink", dfd, p, AT_FDCWD, nullptr,
                    [&] { return REAL(unlinkat)(dfd, p, flags); });
}
int mkdir(const char* p, mode_t m) {
  return do_path_op("mkdir", AT_FDCWD, p, AT_FDCWD, nullptr, [&] { return REAL(mkdir)(p, m); });
}
int mkdirat(int dfd, const char* p, mode_t m) {
  return do_path_op("mkdir", dfd, p, AT_FDCWD, nullptr, [&] { return REAL(mkdirat)(dfd, p, m); });
}
int rename(const char* a, const char* b) {
  return do_path_op("rename", AT_FDCWD, a, AT_FDCWD, b, [&] { return REAL(rename)(a, b); });
}
int renameat(int da, const char* a, int db, const char* b) {
  return do_path_op("rename", da, a, db, b, [&] { return REAL(renameat)(da, a, db, b); });
}
int renameat2(int da, const char* a, int db, const char* b, unsigned flags) {
  return do_path_op("rename", da, a, db, b, [&] { return REAL(renameat2)(da, a, db, b, flags); });
}
int link(const char* a, const char* b) {
  return do_path_op("link", AT_FDCWD, a, AT_FDCWD, b, [&] { return REAL(link)(a, b); });
}
int linkat(int da, const char* a, int db, const char* b, int flags) {
  return do_path_op("link", da, a, db, b, [&] { return REAL(linkat)(da, a, db, b, flags); });
}

}  // extern "C"
