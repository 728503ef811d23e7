// Scratch folders of the training runtime: the owner record, and the sweep
// that removes folders whose owner process died (a SIGKILLed driver or agent)
// while never touching a live one, another container's, or one being made.
#include "train/control/scratch.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
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

TEST(BackgroundRemover, EveryHandedFolderIsGoneOnceTheRemoverIsDestroyed) {
  ScopedTmpdir tmp;
  std::vector<fs::path> paths;
  {
    BackgroundRemover remover;
    for (int attempt = 0; attempt < 3; ++attempt) {
      ScratchDir scratch(&remover);
      paths.push_back(scratch.path());
      write(scratch.path() / "rank-0" / "a" / "w.bin", std::string(1 << 20, 'x'));
      write(scratch.path() / "rank-1" / "w.bin", std::string(1 << 20, 'y'));
    }
    // The next attempt's folder is a new one while the old ones go.
    ScratchDir next(&remover);
    EXPECT_EQ(std::find(paths.begin(), paths.end(), next.path()), paths.end());
    paths.push_back(next.path());
  }
  for (const auto& p : paths) EXPECT_FALSE(fs::exists(p)) << p;
  EXPECT_TRUE(fs::is_empty(tmp.path()));
}

TEST(BackgroundRemover, AProcessForkedWhileARemovalRunsWorksAndExits) {
  ScopedTmpdir tmp;
  BackgroundRemover remover;
  {
    ScratchDir scratch(&remover);
    for (int i = 0; i < 200; ++i) {
      write(scratch.path() / "rank-0" / std::to_string(i), std::string(4096, 'x'));
    }
  }
  // As the driver forks the next attempt's workers: the child allocates,
  // uses the file system and leaves with _exit().
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::error_code ec;
    std::vector<std::string> names(1000, std::string(64, 'n'));
    fs::create_directories(tmp.path() / "child", ec);
    ::_exit(ec || names.size() != 1000 ? 1 : 0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_TRUE(fs::is_directory(tmp.path() / "child"));
}

}  // namespace
}  // namespace cairn::train_internal
