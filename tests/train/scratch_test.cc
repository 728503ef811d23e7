// Scratch folders of the training runtime: the owner record, and the sweep
// that removes folders whose owner process died (a SIGKILLed driver or agent)
// while never touching a live one, another container's, or one being made.
#include "train/control/scratch.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/temp_dir.h"

namespace cairn::train_internal {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

// Points TMPDIR at a fresh directory for the test's lifetime.
class ScopedTmpdir {
 public:
  ScopedTmpdir() {
    if (const char* t = std::getenv("TMPDIR")) saved_ = t;
    ::setenv("TMPDIR", dir_.path().c_str(), 1);
  }
  ~ScopedTmpdir() {
    if (saved_) {
      ::setenv("TMPDIR", saved_->c_str(), 1);
    } else {
      ::unsetenv("TMPDIR");
    }
  }
  const fs::path& path() const { return dir_.path(); }

 private:
  TempDir dir_;
  std::optional<std::string> saved_;
};

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

std::string my_namespace() { return fs::read_symlink("/proc/self/ns/pid").string(); }

TEST(ScratchOwner, StartTimeIsFieldTwentyTwoEvenWithParenthesesInTheCommandName) {
  std::string stat =
      "1234 (a) b (c)) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 "
      "987654 12345 100";
  auto t = stat_start_time(stat);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(*t, 987654u);
  EXPECT_FALSE(stat_start_time("1234 (short) S 1 2").has_value());
  EXPECT_FALSE(stat_start_time("no parenthesis").has_value());
  EXPECT_FALSE(stat_start_time("1 (x) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 0 0 1 0 12x3 0").has_value());
}

TEST(ScratchOwner, RoundTripsAndRejectsMalformedText) {
  ScratchOwner o{"pid:[4026531836]", 42, 1234567};
  auto back = parse_owner(format_owner(o));
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->pid_namespace, o.pid_namespace);
  EXPECT_EQ(back->pid, 42);
  EXPECT_EQ(back->start_time, 1234567u);
  EXPECT_FALSE(parse_owner("").has_value());
  EXPECT_FALSE(parse_owner("pid:[1] notanumber 5").has_value());
  EXPECT_FALSE(parse_owner("pid:[1] 0 5").has_value());
}

TEST(ScratchSweep, RemovesTheFolderOfAProcessThatDiedWithoutCleaningUp) {
  ScopedTmpdir tmp;
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto* leaked = new ScratchDir();  // never destroyed: as if SIGKILLed
    write(leaked->path() / "rank-0" / "tmp1" / "model.pt", "weights");
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_EQ(std::distance(fs::directory_iterator(tmp.path()), fs::directory_iterator()), 1);
  auto removed = sweep_dead_scratch_dirs();
  EXPECT_EQ(removed.size(), 1u);
  EXPECT_TRUE(fs::is_empty(tmp.path()));
}

TEST(ScratchSweep, KeepsLiveForeignAndUnownedFoldersAndRemovesAReusedPid) {
  ScopedTmpdir tmp;
  ScratchDir live;  // this process: alive
  // Another pid namespace (a container sharing TMPDIR): not ours to judge.
  write(tmp.path() / "cairn-train-foreign" / "owner", format_owner({"pid:[1]", 999999, 1}));
  // No owner file yet: being created.
  fs::create_directories(tmp.path() / "cairn-train-unowned");
  // Not a scratch folder at all.
  write(tmp.path() / "someone-else" / "owner", format_owner({my_namespace(), 999999, 1}));
  // Our own pid with another start time: the pid was reused, the owner is gone.
  write(tmp.path() / "cairn-train-reused" / "owner", format_owner({my_namespace(), ::getpid(), 1}));
  auto removed = sweep_dead_scratch_dirs();
  ASSERT_EQ(removed.size(), 1u);
  EXPECT_EQ(removed[0].filename(), "cairn-train-reused");
  EXPECT_TRUE(fs::exists(live.path() / "owner"));
  EXPECT_TRUE(fs::exists(tmp.path() / "cairn-train-foreign"));
  EXPECT_TRUE(fs::exists(tmp.path() / "cairn-train-unowned"));
  EXPECT_TRUE(fs::exists(tmp.path() / "someone-else"));
}

TEST(ScratchDir, RemovesItsFolderWhenDestroyed) {
  ScopedTmpdir tmp;
  fs::path path;
  {
    ScratchDir scratch;
    path = scratch.path();
    write(path / "rank-0" / "w.bin", std::string(1 << 16, 'x'));
  }
  EXPECT_FALSE(fs::exists(path));
}

TEST(BackgroundRemover, StartRemovesTheQueuedFoldersInAChildAndTheDestructorTheRest) {
  ScopedTmpdir tmp;
  std::vector<fs::path> removed_by_child, removed_at_end;
  {
    BackgroundRemover remover;
    for (int attempt = 0; attempt < 2; ++attempt) {
      ScratchDir scratch(&remover);
      removed_by_child.push_back(scratch.path());
      write(scratch.path() / "rank-0" / "a" / "w.bin", std::string(1 << 20, 'x'));
      write(scratch.path() / "rank-1" / "w.bin", std::string(1 << 20, 'y'));
    }
    // Queued, not removed, until start(): nothing runs beside the owner
    // until it forks anyway.
    for (const auto& p : removed_by_child) EXPECT_TRUE(fs::exists(p / "owner")) << p;
    remover.start();
    ScratchDir next(&remover);
    EXPECT_EQ(std::find(removed_by_child.begin(), removed_by_child.end(), next.path()),
              removed_by_child.end());
    removed_at_end.push_back(next.path());
    remover.start();  // reaps the first child; queues nothing new yet
    for (const auto& p : removed_by_child) EXPECT_FALSE(fs::exists(p)) << p;
    EXPECT_TRUE(fs::exists(next.path()));
  }
  for (const auto& p : removed_at_end) EXPECT_FALSE(fs::exists(p)) << p;
  EXPECT_TRUE(fs::is_empty(tmp.path()));
}

TEST(BackgroundRemover, StartWithNothingQueuedForksNothing) {
  ScopedTmpdir tmp;
  BackgroundRemover remover;
  remover.start();
  // No child of this process is left to reap.
  errno = 0;
  EXPECT_EQ(::waitpid(-1, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

}  // namespace
}  // namespace cairn::train_internal
