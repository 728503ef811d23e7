// File-backend behaviour beyond the conformance suite: confinement, crash
// leftovers, full and read-only devices, locks released by process death.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "cairn/error.h"
#include "cairn/storage.h"
#include "support/temp_dir.h"
#include "support/tmpfs.h"

namespace cairn::testing {
namespace {

namespace fs = std::filesystem;

TEST(FileStorage, PlainPathsAndFileUrisOpenTheSameRoot) {
  TempDir dir;
  open_storage(dir.str())->put("x/y", "1");
  EXPECT_EQ(open_storage("file://" + dir.str())->get("x/y"), "1");
  EXPECT_EQ(open_storage(dir.str() + "/")->uri(), "file://" + dir.str());
}

TEST(FileStorage, BadUrisNameTheProblem) {
  try {
    open_storage("ftp://host/x");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("\"ftp\""), std::string::npos) << e.what();
  }
  EXPECT_THROW(open_storage("file://relative/path"), Error);
}

TEST(FileStorage, ASymlinkLeavingTheRootIsRefusedOnRead) {
  TempDir outside, root;
  write_text(outside / "secret", "top secret");
  fs::create_directories(root.path() / "ck");
  fs::create_symlink(outside / "secret", root.path() / "ck" / "leak");
  auto s = open_storage((root.path() / "ck").string());
  try {
    s->get("leak");
    FAIL() << "read through an escaping link";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruption);
    EXPECT_NE(std::string(e.what()).find("leak"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("symbolic link"), std::string::npos) << e.what();
  }
}

// The root may be reached through a symbolic link (a data disk linked into
// place): listings see what lies behind it, as reads do.
TEST(FileStorage, ARootThatIsASymbolicLinkIsListed) {
  TempDir real, links;
  open_storage(real.str())->put("ck/obj", "1");
  fs::create_symlink(real.path(), links / "root");
  auto s = open_storage((links / "root").string());
  ASSERT_EQ(s->list("").size(), 1u);
  EXPECT_EQ(s->list("")[0].key, "ck/obj");
  EXPECT_EQ(s->list_names(""), (std::vector<std::string>{"ck/"}));
  std::vector<std::string> incomplete;
  EXPECT_EQ(s->list_with_incomplete("", incomplete).size(), 1u);
}

// One level of a directory: empty folders are folders; temp files of
// unfinished writes and links to folders are not names.
TEST(FileStorage, ListNamesShowsEmptyFoldersAndHidesTempFilesAndLinkedFolders) {
  TempDir root;
  auto s = open_storage(root.str());
  s->put("ck/obj", "1");
  fs::create_directories(root / "empty");
  write_text(root / ".obj.cairn-tmp-1-a-0", "partial");
  fs::create_directories(root / "elsewhere" / "x");
  fs::create_directory_symlink(root / "elsewhere", root / "linked");
  write_text(root / "file", "f");
  fs::create_symlink(root / "file", root / "file-link");
  EXPECT_EQ(s->list_names(""),
            (std::vector<std::string>{"ck/", "elsewhere/", "empty/", "file", "file-link"}));
}

TEST(FileStorage, ASymlinkInsideTheRootIsFollowed) {
  TempDir root;
  write_text(root / "real", "ok");
  fs::create_symlink(root / "real", root / "alias");
  EXPECT_EQ(open_storage(root.str())->get("alias"), "ok");
}

// list_incomplete_at: the temporaries directly in one folder, not deeper,
// from one directory read; the same as the default (filtered list_incomplete).
TEST(FileStorage, ListIncompleteAtGivesTheTemporariesOfOneFolderOnly) {
  TempDir root;
  write_text(root / ".history.json.cairn-tmp-1-a-0", "half");
  write_text(root / "log" / ".7.rec.cairn-tmp-1-a-1", "half");
  write_text(root / "log" / "deeper" / ".x.cairn-tmp-1-a-2", "half");
  write_text(root / "log" / "8.rec", "whole");
  auto s = open_storage(root.str());
  EXPECT_EQ(s->list_incomplete_at(""), (std::vector<std::string>{".history.json.cairn-tmp-1-a-0"}));
  EXPECT_EQ(s->list_incomplete_at("log"), (std::vector<std::string>{"log/.7.rec.cairn-tmp-1-a-1"}));
  EXPECT_TRUE(s->list_incomplete_at("missing").empty());
  EXPECT_EQ(s->list_incomplete("log").size(), 2u);
  for (const auto& id : s->list_incomplete_at("log")) s->discard_incomplete(id);
  EXPECT_FALSE(fs::exists(root / "log" / ".7.rec.cairn-tmp-1-a-1"));
  EXPECT_TRUE(fs::exists(root / "log" / "8.rec"));
}

TEST(FileStorage, ACrashedWriteLeavesOnlyAnIncompleteWriteThatCanBeDiscarded) {
  TempDir root;
  // What a writer killed before commit leaves behind.
  write_text(root / "ck" / ".model.bin.cairn-tmp-123-abc-0", "half");
  auto s = open_storage(root.str());
  EXPECT_TRUE(s->list("").empty());
  auto incomplete = s->list_incomplete("");
  ASSERT_EQ(incomplete.size(), 1u);
  EXPECT_EQ(incomplete[0], "ck/.model.bin.cairn-tmp-123-abc-0");
  s->discard_incomplete(incomplete[0]);
  EXPECT_TRUE(s->list_incomplete("").empty());
  EXPECT_FALSE(fs::exists(root / "ck")) << "empty directories are pruned";
  s->put("keep", "k");
  EXPECT_THROW(s->discard_incomplete("keep"), Error) << "only incomplete writes may be discarded";
}

TEST(FileStorage, RemovingTheLastObjectPrunesEmptyDirectoriesButNotTheRoot) {
  TempDir root;
  auto s = open_storage(root.str());
  s->put("a/b/c", "x");
  s->remove("a/b/c");
  EXPECT_FALSE(fs::exists(root / "a"));
  EXPECT_TRUE(fs::exists(root.path()));
}

TEST(FileStorage, AFullDeviceIsNoSpaceNamingTheObjectAndLeavesNothingBehind) {
  SmallTmpfs tmpfs(256);
  if (!tmpfs.mounted()) GTEST_SKIP() << tmpfs.why_not();
  auto s = open_storage(tmpfs.path().string());
  s->put("committed", "safe");
  try {
    auto w = s->open_writer("big.bin");
    std::string mib(1 << 20, 'x');
    w->append(as_bytes(mib));
    w->commit();
    FAIL() << "a 1 MiB write fit in a 256 KiB tmpfs";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNoSpace);
    EXPECT_NE(std::string(e.what()).find("big.bin"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s->get("committed"), "safe");
  EXPECT_FALSE(s->exists("big.bin"));
  EXPECT_TRUE(s->list_incomplete("").empty()) << "the abandoned temp file is removed";
}

TEST(FileStorage, PreallocatedSpaceBeyondWhatIsWrittenIsCutOffAtCommit) {
  TempDir root;
  auto s = open_storage(root.path().string());
  auto w = s->open_writer("obj");
  w->preallocate(1 << 20);
  w->write_at(4, as_bytes(std::string("tail")));
  w->write_at(0, as_bytes(std::string("head")));
  w->commit();
  EXPECT_EQ(s->get("obj"), "headtail");
  EXPECT_EQ(fs::file_size(root.path() / "obj"), 8u);
}

TEST(FileStorage, ASizeGivenUpFrontIsCutToWhatWasWrittenAtCommit) {
  TempDir root;
  auto s = open_storage(root.path().string());
  auto w = s->open_writer("obj", {.size = 1 << 20});
  w->write_at(4, as_bytes(std::string("tail")));
  w->write_at(0, as_bytes(std::string("head")));
  EXPECT_EQ(s->list_incomplete("").size(), 1u) << "nothing is visible before commit";
  EXPECT_FALSE(s->exists("obj"));
  w->commit();
  EXPECT_EQ(s->get("obj"), "headtail");
  EXPECT_EQ(fs::file_size(root.path() / "obj"), 8u);
}

TEST(FileStorage, ANonDurableWriterStillCommitsWholeAndAbandonsCleanly) {
  TempDir root;
  auto s = open_storage(root.path().string());
  auto w = s->open_writer("obj", {.durable = false, .size = 6});
  w->append(as_bytes(std::string("abcdef")));
  w->commit();
  EXPECT_EQ(s->get("obj"), "abcdef");
  {
    auto abandoned = s->open_writer("other", {.durable = false, .size = 64});
    abandoned->append(as_bytes(std::string("x")));
  }
  EXPECT_FALSE(s->exists("other"));
  EXPECT_TRUE(s->list_incomplete("").empty()) << "the abandoned temp file is removed";
}

TEST(FileStorage, APreallocationThatDoesNotFitIsNoSpaceNamingTheObjectAndLeavesNothingBehind) {
  SmallTmpfs tmpfs(256);
  if (!tmpfs.mounted()) GTEST_SKIP() << tmpfs.why_not();
  auto s = open_storage(tmpfs.path().string());
  s->put("committed", "safe");
  try {
    auto w = s->open_writer("big.bin");
    w->preallocate(1 << 20);
    FAIL() << "1 MiB was preallocated in a 256 KiB tmpfs";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNoSpace);
    EXPECT_NE(std::string(e.what()).find("big.bin"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s->get("committed"), "safe");
  EXPECT_TRUE(s->list_incomplete("").empty()) << "the abandoned temp file is removed";
}

TEST(FileStorage, AReadOnlyDeviceIsPermissionDeniedNamingTheObject) {
  SmallTmpfs tmpfs(256);
  if (!tmpfs.mounted()) GTEST_SKIP() << tmpfs.why_not();
  auto s = open_storage(tmpfs.path().string());
  s->put("committed", "safe");
  tmpfs.remount_read_only();
  try {
    s->put("new/obj", "x");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kPermissionDenied);
    EXPECT_NE(std::string(e.what()).find("new"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s->get("committed"), "safe");
}

TEST(FileStorage, ALockHeldByAKilledProcessIsReleased) {
  TempDir root;
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto lock = open_storage(root.str())->try_lock(".lock");
    char c = 1;
    (void)!write(ready[1], &c, 1);
    pause();
    _exit(0);
  }
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  auto s = open_storage(root.str());
  try {
    s->try_lock(".lock");
    FAIL() << "lock held by a live child was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kLocked);
    EXPECT_NE(std::string(e.what()).find("pid " + std::to_string(pid)), std::string::npos)
        << e.what();
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  EXPECT_NO_THROW(s->try_lock(".lock"));
  close(ready[0]);
  close(ready[1]);
}

}  // namespace
}  // namespace cairn::testing
