// Test support: a small tmpfs mounted on a temporary directory, to produce a
// real "No space left on device" or "Read-only file system". Needs root (CI
// and the test command run as root); tests skip, saying why, elsewhere.
#pragma once

#include <sys/mount.h>
#include <unistd.h>

#include <string>

#include <fmt/format.h>

#include "support/temp_dir.h"

namespace cairn::testing {

class SmallTmpfs {
 public:
  explicit SmallTmpfs(size_t kib) {
    if (::geteuid() != 0) {
      why_not_ = "mounting a tmpfs needs root";
      return;
    }
    std::string opts = fmt::format("size={}k,mode=0755", kib);
    if (::mount("tmpfs", dir_.path().c_str(), "tmpfs", 0, opts.c_str()) != 0) {
      why_not_ = fmt::format("mount tmpfs failed: errno {}", errno);
      return;
    }
    mounted_ = true;
  }
  ~SmallTmpfs() {
    if (mounted_) ::umount2(dir_.path().c_str(), MNT_DETACH);
  }
  void remount_read_only() {
    ::mount("tmpfs", dir_.path().c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY, nullptr);
  }
  bool mounted() const { return mounted_; }
  const std::string& why_not() const { return why_not_; }
  const std::filesystem::path& path() const { return dir_.path(); }

 private:
  TempDir dir_;
  bool mounted_ = false;
  std::string why_not_;
};

}  // namespace cairn::testing
