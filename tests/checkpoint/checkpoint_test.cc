// Checkpoint handles, metadata, verification, and the bad inputs a stored
// checkpoint can present: hostile manifests, altered, truncated or missing
// files, escaping links, malformed metadata.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <functional>
#include <set>
#include <span>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "cairn/commit.h"
#include "cairn/error.h"
#include "cairn/manager.h"
#include "storage/backends.h"
#include "support/errors.h"
#include "support/temp_dir.h"
#include "util/hash.h"

namespace cairn::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A committed checkpoint in `dir` with two files.
Checkpoint committed(const fs::path& dir) {
  auto cp = Checkpoint::from_directory(dir.string());
  CheckpointWriter w(cp);
  w.write_file("model.bin", std::string(4096, 'm'));
  w.write_file("opt/state.bin", "optimizer");
  w.commit({{"loss", 0.1}}, 1.0);
  return cp;
}

// A committed checkpoint at `uri` (a memory:// one: "remote") holding one file.
Checkpoint committed_remote(const std::string& uri, const std::string& file,
                            const std::string& contents) {
  auto cp = Checkpoint::from_directory(uri);
  CheckpointWriter w(cp);
  w.write_file(file, contents);
  w.commit({}, 1.0);
  return cp;
}

TEST(Checkpoint, FromDictKeepsTheDictInMemoryAndCopiesShareIt) {
  const json dict = {{"epoch", 3}, {"lr", 0.5}, {"names", {"a", "b"}}};
  Checkpoint c = Checkpoint::from_dict(dict);
  EXPECT_EQ(c.uri().rfind("memory://private-", 0), 0u) << c.uri();
  EXPECT_EQ(c.to_dict(), dict);
  Checkpoint copy = c;
  EXPECT_EQ(copy.to_dict(), dict);
  // Each from_dict is its own memory.
  EXPECT_EQ(Checkpoint::from_dict({{"epoch", 4}}).to_dict().at("epoch"), 4);
  EXPECT_EQ(c.to_dict().at("epoch"), 3);
  EXPECT_TRUE(Checkpoint::in_memory().files().empty());

  // A local copy holds the same dict.
  TempDir dir;
  const auto local = c.to_directory(dir.path() / "copy");
  EXPECT_EQ(Checkpoint::from_directory(local.string()).to_dict(), dict);
}

TEST(Checkpoint, FromDictRefusesANonObjectAndToDictNamesTheFile) {
  EXPECT_NE(error_message_of(
                [] {
                  Checkpoint::from_dict(json::array({1, 2}));
                },
                ErrorCode::kInvalidArgument)
                .find("JSON object"),
            std::string::npos);
  Checkpoint empty = Checkpoint::in_memory();
  auto to_dict = [&] { empty.to_dict(); };
  EXPECT_NE(error_message_of(to_dict, ErrorCode::kNotFound).find("dict.json"), std::string::npos);
  empty.storage().put(kDictFileName, "[1, 2]");
  EXPECT_NE(error_message_of(to_dict, ErrorCode::kCorruption).find("dict.json"), std::string::npos);
  empty.storage().put(kDictFileName, "{\"a\": ");
  EXPECT_NE(error_message_of(to_dict, ErrorCode::kCorruption).find("dict.json"), std::string::npos);
}

TEST(Checkpoint, AsDirectoryOfALocalCheckpointIsItsOwnPath) {
  TempDir dir;
  auto cp = committed(dir.path());
  auto view = cp.as_directory();
  EXPECT_EQ(view.path(), dir.path());
  EXPECT_EQ(read_text(view.path() / "opt/state.bin"), "optimizer");
}

TEST(Checkpoint, AsDirectoryOfARemoteCheckpointIsACopyRemovedWithTheLastView) {
  TempDir cache;
  setenv("CAIRN_CACHE_DIR", cache.str().c_str(), 1);
  clear_memory_bucket("remote");
  auto cp = committed_remote("memory://remote/ck", "a.txt", "A");
  fs::path p;
  {
    auto view = cp.as_directory();
    p = view.path();
    auto second = view;
    EXPECT_EQ(read_text(p / "a.txt"), "A");
    view = LocalDirectory();
    EXPECT_TRUE(fs::exists(p)) << "still held by the second view";
  }
  EXPECT_FALSE(fs::exists(p));
  EXPECT_TRUE(fs::is_empty(cache.path())) << "no lock, users or done file outlives the view";
  unsetenv("CAIRN_CACHE_DIR");
  clear_memory_bucket("remote");
}

int data_reads = 0;  // per process: reads of the shared view's data file

TEST(Checkpoint, ProcessesAskingForTheSameRemoteViewShareOneDownload) {
  TempDir cache;
  setenv("CAIRN_CACHE_DIR", cache.str().c_str(), 1);
  clear_memory_bucket("viewshare");
  auto cp = committed_remote("memory://viewshare/ck", "data.bin", std::string(1 << 20, 'd'));
  set_memory_faults("viewshare",
                    MemoryFaults{std::nullopt, [](std::string_view op, std::string_view key) {
                                   if (op == "read" && key == "ck/data.bin") ++data_reads;
                                 }});
  constexpr int kProcs = 4;
  int report[2], barrier[2];
  ASSERT_EQ(pipe(report), 0);
  ASSERT_EQ(pipe(barrier), 0);
  std::vector<pid_t> pids;
  for (int i = 0; i < kProcs; ++i) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {  // the memory bucket was copied by fork: a "remote" store every child sees
      close(report[0]);
      close(barrier[1]);
      int rc = 0;
      {
        auto view = cp.as_directory();
        std::string line = fmt::format("{} {}\n", data_reads, view.path().string());
        (void)!write(report[1], line.data(), line.size());
        char c;
        while (read(barrier[0], &c, 1) > 0) {
        }
        if (read_text(view.path() / "data.bin") != std::string(1 << 20, 'd')) rc = 1;
      }
      _exit(rc);
    }
    pids.push_back(pid);
  }
  close(report[1]);
  close(barrier[0]);
  std::string all;
  char buf[4096];
  for (ssize_t n; std::count(all.begin(), all.end(), '\n') < kProcs &&
                  (n = read(report[0], buf, sizeof buf)) > 0;) {
    all.append(buf, static_cast<size_t>(n));
  }
  close(barrier[1]);  // everyone holds the view now: let them release it
  int downloads = 0;
  std::set<std::string> paths;
  std::istringstream lines(all);
  for (std::string line; std::getline(lines, line);) {
    downloads += std::stoi(line.substr(0, line.find(' ')));
    paths.insert(line.substr(line.find(' ') + 1));
  }
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  close(report[0]);
  EXPECT_EQ(downloads, 1) << all;
  ASSERT_EQ(paths.size(), 1u) << all;
  EXPECT_FALSE(fs::exists(*paths.begin())) << "removed after the last user released it";
  EXPECT_TRUE(fs::is_empty(cache.path())) << "nothing outlives the last user";
  unsetenv("CAIRN_CACHE_DIR");
  clear_memory_bucket("viewshare");
}

// Runs `fn` in a child process that then kills itself with SIGKILL, as a
// preempted or OOM-killed user of a view would die.
void in_process_killed_after(const std::function<void()>& fn) {
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    fn();
    raise(SIGKILL);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

TEST(Checkpoint, AViewWhoseOnlyUserWasKilledIsRemovedByTheNextViewOrByGc) {
  TempDir cache;
  setenv("CAIRN_CACHE_DIR", cache.str().c_str(), 1);
  clear_memory_bucket("killed");
  auto first = committed_remote("memory://killed/a", "data.bin", "A");
  auto second = committed_remote("memory://killed/b", "data.bin", "B");
  // Killed while holding a view: its copy stays until someone sweeps.
  in_process_killed_after([&] {
    static LocalDirectory held;  // never released: the process dies first
    held = first.as_directory();
  });
  EXPECT_FALSE(fs::is_empty(cache.path())) << "the killed user's view is still there";
  {
    auto view = second.as_directory();  // any later view on the node sweeps
    size_t entries = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(cache.path())) ++entries;
    EXPECT_EQ(entries, 4u) << "only the live view's folder and its lock, users and done files";
  }
  EXPECT_TRUE(fs::is_empty(cache.path()));

  // Killed in the middle of a download: a partial folder, and gc removes it.
  in_process_killed_after([&] {
    set_memory_faults("killed", MemoryFaults{std::nullopt, [](std::string_view op, auto key) {
                                               if (op == "read" && key == "a/data.bin") {
                                                 raise(SIGKILL);
                                               }
                                             }});
    (void)first.as_directory();
  });
  EXPECT_FALSE(fs::is_empty(cache.path())) << "the interrupted download left a partial view";
  TempDir empty_root;
  GcReport dry = collect_garbage(empty_root.str(), /*dry_run=*/true);
  EXPECT_EQ(dry.removed.size(), 1u);
  EXPECT_FALSE(fs::is_empty(cache.path())) << "a dry run removes nothing";
  GcReport report = collect_garbage(empty_root.str());
  ASSERT_EQ(report.removed.size(), 1u);
  EXPECT_NE(report.removed[0].find(cache.str()), std::string::npos) << report.removed[0];
  EXPECT_TRUE(fs::is_empty(cache.path()));
  unsetenv("CAIRN_CACHE_DIR");
  clear_memory_bucket("killed");
}

TEST(Checkpoint, AViewInUseIsNeverSweptByGc) {
  TempDir cache;
  setenv("CAIRN_CACHE_DIR", cache.str().c_str(), 1);
  clear_memory_bucket("inuse");
  auto cp = committed_remote("memory://inuse/a", "data.bin", "A");
  auto view = cp.as_directory();
  TempDir empty_root;
  EXPECT_TRUE(collect_garbage(empty_root.str()).removed.empty());
  EXPECT_EQ(read_text(view.path() / "data.bin"), "A");
  unsetenv("CAIRN_CACHE_DIR");
  clear_memory_bucket("inuse");
}

TEST(Checkpoint, ViewsAndCopiesOfASourceThatDoesNotExistAreNotFound) {
  TempDir dir, cache;
  setenv("CAIRN_CACHE_DIR", cache.str().c_str(), 1);
  clear_memory_bucket("nothing");
  error_message_of([&] { (void)Checkpoint::from_directory("memory://nothing/x").as_directory(); },
                   ErrorCode::kNotFound);
  EXPECT_TRUE(fs::is_empty(cache.path())) << "a failed view leaves nothing in the cache";
  unsetenv("CAIRN_CACHE_DIR");
  error_message_of([&] { (void)Checkpoint::from_directory("memory://nothing/x").to_directory(); },
                   ErrorCode::kNotFound);
  std::string msg = error_message_of(
      [&] { (void)Checkpoint::from_directory((dir / "typo").string()).to_directory(); },
      ErrorCode::kNotFound);
  EXPECT_NE(msg.find("typo"), std::string::npos) << msg;
  write_text(dir / "file", "x");
  error_message_of(
      [&] { (void)Checkpoint::from_directory((dir / "file").string()).to_directory(); },
      ErrorCode::kInvalidArgument);
}

TEST(Checkpoint, ToDirectoryIsAFullPlainCopyWithMetadata) {
  TempDir src, dst;
  auto cp = committed(src.path());
  cp.set_metadata({{"epoch", 7}});
  fs::path out = cp.to_directory(dst.path() / "copy");
  EXPECT_EQ(read_text(out / "model.bin"), std::string(4096, 'm'));
  EXPECT_EQ(read_text(out / "opt/state.bin"), "optimizer");
  EXPECT_FALSE(fs::exists(out / ".cairn/manifest.json")) << "a copy is not a committed checkpoint";
  EXPECT_EQ(Checkpoint::from_directory(out.string()).get_metadata()["epoch"], 7);
  error_message_of([&] { cp.to_directory(dst.path() / "copy"); }, ErrorCode::kAlreadyExists);
  fs::path temp = cp.to_directory();
  EXPECT_TRUE(fs::exists(temp / "model.bin"));
  fs::remove_all(temp);
}

TEST(Checkpoint, MetadataUpdatesMergeTopLevelKeys) {
  TempDir dir;
  auto cp = Checkpoint::from_directory(dir.str());
  EXPECT_EQ(cp.get_metadata(), json::object());
  cp.set_metadata({{"a", 1}, {"b", {{"x", 1}}}});
  cp.update_metadata({{"b", {{"y", 2}}}, {"c", 3}});
  EXPECT_EQ(cp.get_metadata(), (json{{"a", 1}, {"b", {{"y", 2}}}, {"c", 3}}));
  error_message_of([&] { cp.set_metadata(json::array()); }, ErrorCode::kInvalidArgument);
}

TEST(Checkpoint, MetadataThatIsNotJsonIsCorruptionNamingTheFile) {
  TempDir dir;
  write_text(dir / ".cairn/metadata.json", "{\"epoch\": 3,");
  auto cp = Checkpoint::from_directory(dir.str());
  std::string msg = error_message_of([&] { cp.get_metadata(); }, ErrorCode::kCorruption);
  EXPECT_NE(msg.find(".cairn/metadata.json"), std::string::npos) << msg;
  error_message_of([&] { cp.update_metadata({{"x", 1}}); }, ErrorCode::kCorruption);
  EXPECT_EQ(read_text(dir / ".cairn/metadata.json"), "{\"epoch\": 3,")
      << "a failed update changes nothing";
}

TEST(Checkpoint, VerifyPassesAWholeCheckpoint) {
  TempDir dir;
  EXPECT_TRUE(committed(dir.path()).verify().empty());
}

TEST(Checkpoint, VerifyNamesAnAlteredATruncatedAndAMissingFile) {
  TempDir dir;
  auto cp = committed(dir.path());
  std::string altered(4096, 'm');
  altered[100] = 'X';
  write_text(dir / "model.bin", altered);
  write_text(dir / "opt/state.bin", "optim");
  auto problems = cp.verify();
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_EQ(problems[0].path, "model.bin");
  EXPECT_NE(problems[0].reason.find("checksum"), std::string::npos);
  EXPECT_EQ(problems[1].path, "opt/state.bin");
  EXPECT_NE(problems[1].reason.find("size 5, manifest says 9"), std::string::npos)
      << problems[1].reason;
  fs::remove(dir / "model.bin");
  problems = cp.verify();
  EXPECT_EQ(problems[0].path, "model.bin");
  EXPECT_EQ(problems[0].reason, "missing");
}

TEST(Checkpoint, ACopyOfADamagedCheckpointFailsNamingTheFileAndLeavesNoTempDir) {
  TempDir dir, dst;
  auto cp = committed(dir.path());
  std::string altered(4096, 'm');
  altered[0] = 'X';
  write_text(dir / "model.bin", altered);
  std::string msg =
      error_message_of([&] { cp.to_directory(dst / "copy"); }, ErrorCode::kCorruption);
  EXPECT_NE(msg.find("model.bin"), std::string::npos) << msg;
  clear_memory_bucket("dest");
  CheckpointWriter w(Checkpoint::from_directory("memory://dest/ck"));
  msg = error_message_of([&] { w.copy_from(cp); }, ErrorCode::kCorruption);
  EXPECT_NE(msg.find("model.bin"), std::string::npos) << msg;
  clear_memory_bucket("dest");
}

// A manifest cut short or emptied on a store that never tears a write (local
// files: a commit renames the manifest into place) was damaged after its
// commit: the checkpoint is still committed, reading its manifest is
// corruption naming the manifest and why, and nothing removes it or commits
// over it. (On a store that tears writes the same text is the remains of an
// interrupted commit, a leftover: tests/s3/end_to_end_test.cc.)
TEST(Checkpoint, ATruncatedManifestOnLocalFilesIsDamageNamingTheManifest) {
  TempDir dir;
  auto cp = committed(dir.path());
  ASSERT_FALSE(cp.storage().capabilities().torn_writes);
  std::string text = read_text(dir / ".cairn/manifest.json");
  write_text(dir / ".cairn/manifest.json", text.substr(0, text.size() / 2));
  EXPECT_TRUE(cp.is_committed());
  std::string msg = error_message_of([&] { cp.verify(); }, ErrorCode::kCorruption);
  EXPECT_NE(msg.find(cp.storage().uri_of(".cairn/manifest.json") + ": damaged"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("not JSON"), std::string::npos) << msg;
  EXPECT_EQ(code_of([&] { remove_uncommitted(cp); }), ErrorCode::kFailedPrecondition);
  EXPECT_TRUE(fs::exists(dir / "model.bin"));
}

TEST(Checkpoint, AnEmptyManifestOnLocalFilesIsDamageThatNoCommitWritesOver) {
  TempDir dir;
  auto cp = committed(dir.path());
  write_text(dir / ".cairn/manifest.json", "");
  EXPECT_TRUE(cp.is_committed());
  std::string msg = error_message_of([&] { (void)cp.manifest(); }, ErrorCode::kCorruption);
  EXPECT_NE(msg.find("empty (0 bytes)"), std::string::npos) << msg;
  EXPECT_EQ(code_of([&] { CheckpointWriter w(cp); }), ErrorCode::kAlreadyExists);
  EXPECT_EQ(read_text(dir / ".cairn/manifest.json"), "");
}

// The manifest proves itself whole: no prefix of it is a whole manifest, nor
// are zeros; and with any one byte changed (but in its member's name) it is
// either torn (no longer JSON) or corruption that parse() refuses, never a
// manifest that reads back.
TEST(Manifest, EveryPrefixIsTornAndEveryAlteredByteIsTornOrCorruption) {
  TempDir dir;
  auto cp = committed(dir.path());
  const std::string text = read_text(dir / ".cairn/manifest.json");
  ASSERT_FALSE(Manifest::torn(text)) << text;
  EXPECT_NE(text.find("\"self_check\""), std::string::npos) << text;
  for (size_t n = 0; n < text.size(); ++n) {
    EXPECT_TRUE(Manifest::torn(text.substr(0, n))) << "prefix of " << n << " bytes";
    EXPECT_THROW(Manifest::parse(text.substr(0, n), "m"), Error);
  }
  // A change inside the member's name leaves an unknown member in what reads
  // as an earlier version's manifest: corruption no cut-short write makes.
  const size_t name_at = text.find("\"self_check\"");
  for (size_t at = 0; at < text.size(); ++at) {
    if (at >= name_at && at < name_at + 12) continue;
    std::string altered = text;
    altered[at] = static_cast<char>(altered[at] ^ 0x01);
    if (Manifest::torn(altered)) continue;
    // Still JSON: damaged after the commit, not cut short. A person looks
    // at it; gc and the manager's open do not take it for a leftover.
    const std::string msg =
        error_message_of([&] { Manifest::parse(altered, "m"); }, ErrorCode::kCorruption);
    EXPECT_EQ(msg.find("torn"), std::string::npos) << "byte " << at << ": " << msg;
  }
  EXPECT_TRUE(Manifest::torn(std::string(text.size(), '\0')));
  // Whole: it parses back to what was committed.
  Manifest m = Manifest::parse(text, "m");
  EXPECT_EQ(m.files.size(), 2u);
  EXPECT_EQ(m.to_json(), text);
}

// Manifests written before the self-check (no "self_check" member) are
// still committed checkpoints, read and verified as before.
TEST(Manifest, AManifestWithoutASelfCheckFromAnEarlierVersionIsStillACommit) {
  TempDir dir;
  auto cp = committed(dir.path());
  json m = json::parse(read_text(dir / ".cairn/manifest.json"));
  m.erase("self_check");
  write_text(dir / ".cairn/manifest.json", m.dump(1));
  EXPECT_FALSE(Manifest::torn(m.dump(1)));
  EXPECT_TRUE(cp.is_committed());
  EXPECT_EQ(cp.manifest().files.size(), 2u);
  EXPECT_TRUE(cp.verify().empty());
  // ...but an unparsable one is not whole: on local files, which never tear a
  // write, that is damage after the commit, a corruption naming it.
  write_text(dir / ".cairn/manifest.json", m.dump(1).substr(0, 40));
  EXPECT_TRUE(Manifest::torn(m.dump(1).substr(0, 40)));
  EXPECT_EQ(code_of([&] { (void)cp.manifest(); }), ErrorCode::kCorruption);
}

TEST(Checkpoint, AnAlteredManifestDoesNotPassVerification) {
  TempDir dir;
  auto cp = committed(dir.path());
  json m = json::parse(read_text(dir / ".cairn/manifest.json"));
  m["files"][0]["xxh3"] = "0123456789abcdef";
  // Without its self-check (as an earlier version wrote it) it is a commit
  // whose file does not match; with it, it would not even be a commit.
  m.erase("self_check");
  write_text(dir / ".cairn/manifest.json", m.dump());
  auto problems = cp.verify();
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].path, "model.bin");
}

TEST(Manifest, HostilePathsAreCorruptionNamingTheEntry) {
  auto manifest_with = [](const std::string& path) {
    return json{{"format", "cairn-checkpoint"},
                {"version", 1},
                {"created_at", 1.0},
                {"files", {{{"path", path}, {"size", 1}, {"xxh3", "0000000000000000"}}}}}
        .dump();
  };
  for (std::string bad : {"../escape", "a/../../b", "/etc/passwd", ".cairn/manifest.json", ""}) {
    std::string msg =
        error_message_of([&] { Manifest::parse(manifest_with(bad), "M"); }, ErrorCode::kCorruption);
    EXPECT_NE(msg.find("manifest entry 0"), std::string::npos) << msg;
    EXPECT_EQ(msg.rfind("M: ", 0), 0u) << msg;
  }
}

TEST(Manifest, MalformedFieldsAreCorruption) {
  for (
      const char* bad :
      {"[]", "{}", R"({"format":"cairn-checkpoint","version":2,"created_at":1,"files":[]})",
       R"({"format":"cairn-checkpoint","version":1,"created_at":"x","files":[]})",
       R"({"format":"cairn-checkpoint","version":1,"created_at":1,"files":[{"path":"a","size":-1,"xxh3":"0000000000000000"}]})",
       R"({"format":"cairn-checkpoint","version":1,"created_at":1,"files":[{"path":"a","size":1,"xxh3":"zz"}]})",
       R"({"format":"cairn-checkpoint","version":1,"created_at":1,"files":[{"path":"a","size":1,"xxh3":"0000000000000000"},{"path":"a","size":1,"xxh3":"0000000000000000"}]})"}) {
    error_message_of([&] { Manifest::parse(bad, "M"); }, ErrorCode::kCorruption);
  }
}

TEST(Manifest, RoundTripsThroughJson) {
  Manifest m;
  m.created_at = 12.5;
  m.metrics = {{"loss", 0.5}};
  m.layout = {{"world_size", 4}};
  m.files = {{"a", 3, 0xdeadbeefcafef00dull}, {"b/c", 0, 1}};
  Manifest back = Manifest::parse(m.to_json(), "M");
  EXPECT_EQ(back.created_at, 12.5);
  EXPECT_EQ(back.metrics, m.metrics);
  EXPECT_EQ(back.layout, m.layout);
  ASSERT_EQ(back.files.size(), 2u);
  EXPECT_EQ(back.files[0].xxh3, 0xdeadbeefcafef00dull);
  EXPECT_EQ(back.total_bytes(), 3u);
}

TEST(Manifest, TheRanksOfADistributedCommitRoundTripAndAreAbsentOtherwise) {
  Manifest m;
  m.ranks = {{"world_size", 4}, {"contributed", {0, 2}}};
  EXPECT_EQ(Manifest::parse(m.to_json(), "M").ranks, m.ranks);
  EXPECT_TRUE(Manifest::parse(Manifest().to_json(), "M").ranks.is_null());
  for (const char* bad :
       {R"("all")", R"({"world_size":0,"contributed":[]})", R"({"world_size":2,"contributed":[2]})",
        R"({"world_size":4,"contributed":[1,1]})", R"({"world_size":4,"contributed":[2,1]})",
        R"({"world_size":4})"}) {
    // As an earlier version would write it: no self-check to update.
    nlohmann::json j = nlohmann::json::parse(Manifest().to_json());
    j.erase("self_check");
    j["ranks"] = nlohmann::json::parse(bad);
    const std::string text = j.dump();
    const std::string message =
        error_message_of([&] { Manifest::parse(text, "M"); }, ErrorCode::kCorruption);
    EXPECT_NE(message.find("ranks"), std::string::npos) << message;
  }
}

// "ranks"."files": which rank passed which file (the memory tier's
// ranks_read_own_files); each rank one that contributed, each path a file.
TEST(Manifest, TheFilesOfEachRankRoundTripAndMustNameContributedRanksAndListedFiles) {
  Manifest m;
  m.files = {{"a", 1, 7}, {"b", 1, 8}};
  m.ranks = {
      {"world_size", 4}, {"contributed", {0, 2}}, {"files", {{"0", {"a"}}, {"2", {"a", "b"}}}}};
  EXPECT_EQ(Manifest::parse(m.to_json(), "M").ranks, m.ranks);
  for (const char* bad :
       {R"([])", R"({"1":["a"]})", R"({"0":"a"})", R"({"0":["c"]})", R"({"0":[1]})"}) {
    nlohmann::json j = nlohmann::json::parse(m.to_json());
    j.erase("self_check");
    j["ranks"]["files"] = nlohmann::json::parse(bad);
    const std::string text = j.dump();
    const std::string message =
        error_message_of([&] { Manifest::parse(text, "M"); }, ErrorCode::kCorruption);
    EXPECT_NE(message.find("\"files\""), std::string::npos) << bad << ": " << message;
  }
}

TEST(Manifest, BlockChecksumsRoundTripAndOlderEntriesHaveNone) {
  Manifest m;
  m.files = {{"a", 3 * 4096 + 1, 7, 4096, {1, 2, 3, 0xfedcba9876543210ull}}, {"b", 5, 9}};
  Manifest back = Manifest::parse(m.to_json(), "M");
  ASSERT_EQ(back.files.size(), 2u);
  EXPECT_EQ(back.files[0].block_size, 4096u);
  EXPECT_EQ(back.files[0].block_xxh3, m.files[0].block_xxh3);
  EXPECT_EQ(back.files[1].block_size, 0u);
  EXPECT_TRUE(back.files[1].block_xxh3.empty());
}

TEST(Manifest, MalformedBlockChecksumsAreCorruptionNamingTheEntry) {
  const std::string head =
      R"({"format":"cairn-checkpoint","version":1,"created_at":1,"files":[{"path":"state","size":5000,"xxh3":"0000000000000000","blocks":)";
  const std::string two = std::string(32, '0');
  for (const std::string& blocks :
       {std::string(R"({"size":4096})"), R"({"size":1000,"xxh3":")" + two + R"("})",
        R"({"size":4096,"xxh3":")" + two.substr(16) + R"("})",
        R"({"size":4096,"xxh3":")" + two.substr(1) + R"(z"})", std::string("[]")}) {
    std::string msg = error_message_of([&] { Manifest::parse(head + blocks + "}]}", "M"); },
                                       ErrorCode::kCorruption);
    EXPECT_NE(msg.find("\"state\""), std::string::npos) << msg;
  }
}

TEST(Checkpoint, ALinkLeavingACommittedCheckpointIsReportedByVerify) {
  TempDir dir, outside;
  auto cp = committed(dir.path());
  write_text(outside / "model.bin", std::string(4096, 'm'));
  fs::remove(dir / "model.bin");
  fs::create_symlink(outside / "model.bin", dir / "model.bin");
  auto problems = cp.verify();
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].path, "model.bin");
  EXPECT_NE(problems[0].reason.find("symbolic link"), std::string::npos) << problems[0].reason;
}

TEST(Checkpoint, RegisteringASourceWithALinkLeavingItIsRefused) {
  TempDir src, outside;
  write_text(src / "ok.bin", "fine");
  write_text(outside / "secret", "secret");
  fs::create_symlink(outside / "secret", src / "leak");
  clear_memory_bucket("dest");
  CheckpointWriter w(Checkpoint::from_directory("memory://dest/ck"));
  std::string msg = error_message_of([&] { w.copy_from(Checkpoint::from_directory(src.str())); },
                                     ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("leak"), std::string::npos) << msg;
  EXPECT_TRUE(open_storage("memory://dest/ck")->list("").empty()) << "nothing was copied";
  clear_memory_bucket("dest");
}

TEST(Checkpoint, AFileNameThatIsNotUtf8IsRefusedNamingItBeforeAnythingIsCopied) {
  TempDir src;
  write_text(src / "a.bin", "fine");
  write_text(src / "bad\xff.bin", "name is Latin-1");
  clear_memory_bucket("dest");
  CheckpointWriter w(Checkpoint::from_directory("memory://dest/ck"));
  std::string msg = error_message_of([&] { w.copy_from(Checkpoint::from_directory(src.str())); },
                                     ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("bad\\xff.bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("UTF-8"), std::string::npos) << msg;
  EXPECT_TRUE(open_storage("memory://dest/ck")->list("").empty()) << "nothing was copied";
  clear_memory_bucket("dest");
}

// `depth` levels of {"a": ...} around 1.
std::string deep_json(size_t depth) {
  std::string s;
  for (size_t i = 0; i < depth; ++i) s += "{\"a\":";
  s += "1";
  s += std::string(depth, '}');
  return s;
}

TEST(Checkpoint, DeeplyNestedStoredJsonIsCorruptionNotACrash) {
  TempDir dir;
  auto cp = committed(dir.path());
  std::string manifest = read_text(dir / ".cairn/manifest.json");
  const std::string metrics = "\"metrics\": {";
  size_t at = manifest.find(metrics);
  ASSERT_NE(at, std::string::npos) << manifest;
  manifest.insert(at + metrics.size(), "\"deep\": " + deep_json(100000) + ", ");
  write_text(dir / ".cairn/manifest.json", manifest);
  std::string msg = error_message_of([&] { (void)cp.manifest(); }, ErrorCode::kCorruption);
  EXPECT_NE(msg.find("manifest.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("nested deeper"), std::string::npos) << msg;
  error_message_of([&] { (void)cp.verify(); }, ErrorCode::kCorruption);

  write_text(dir / ".cairn/metadata.json", deep_json(100000));
  msg = error_message_of([&] { (void)cp.get_metadata(); }, ErrorCode::kCorruption);
  EXPECT_NE(msg.find("metadata.json"), std::string::npos) << msg;
}

TEST(Checkpoint, MetadataOrMetricsTooDeepOrNotUtf8AreRefusedBeforeWriting) {
  TempDir dir;
  auto cp = Checkpoint::from_directory(dir.str());
  json deep = 1;
  for (int i = 0; i < 1000; ++i) deep = json{{"a", std::move(deep)}};
  error_message_of([&] { cp.set_metadata(deep); }, ErrorCode::kInvalidArgument);
  error_message_of([&] { cp.set_metadata({{"name", "bad\xff"}}); }, ErrorCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(dir / ".cairn/metadata.json"));
  CheckpointWriter w(cp);
  w.write_file("a.bin", "a");
  error_message_of([&] { w.commit({{"deep", deep}}, 1.0); }, ErrorCode::kInvalidArgument);
  EXPECT_FALSE(cp.is_committed());
}

TEST(CheckpointWriter, RefusesToWriteIntoACommittedCheckpointOrUnderCairnsFolder) {
  TempDir dir;
  auto cp = committed(dir.path());
  error_message_of([&] { CheckpointWriter w(cp); }, ErrorCode::kAlreadyExists);
  TempDir fresh;
  CheckpointWriter w(Checkpoint::from_directory(fresh.str()));
  error_message_of([&] { w.write_file(".cairn/manifest.json", "{}"); },
                   ErrorCode::kInvalidArgument);
  error_message_of([&] { w.write_file("../x", "{}"); }, ErrorCode::kInvalidArgument);
}

// Files other processes wrote (a Trainer's ranks) are checked against one
// listing of the checkpoint; one missing or of another size is named.
TEST(CheckpointWriter, ManyWrittenFilesAreCheckedTogetherAndAFaultyOneIsNamed) {
  for (const std::string which : {"good", "missing", "short"}) {
    TempDir dir;
    auto cp = Checkpoint::from_directory(dir.str());
    std::vector<ManifestEntry> entries;
    for (int rank = 0; rank < 40; ++rank) {
      const std::string name = fmt::format("sub/rank-{}.bin", rank);
      const std::string bytes(100 + rank, 'x');
      if (!(which == "missing" && rank == 17)) {
        cp.storage().put(name, which == "short" && rank == 23 ? bytes.substr(1) : bytes);
      }
      entries.push_back({name, bytes.size(), xxh3_64(bytes)});
    }
    CheckpointWriter w(cp);
    if (which == "good") {
      w.add_written(entries);
      w.commit({}, 1.0);
      ASSERT_TRUE(cp.is_committed());
      EXPECT_EQ(cp.manifest().files.size(), 40u);
      EXPECT_TRUE(cp.verify().empty());
      continue;
    }
    const std::string msg =
        error_message_of([&] { w.add_written(entries); },
                         which == "missing" ? ErrorCode::kNotFound : ErrorCode::kCorruption);
    EXPECT_NE(msg.find(which == "missing" ? "rank-17.bin" : "rank-23.bin"), std::string::npos)
        << msg;
    EXPECT_FALSE(cp.is_committed());
  }
}

// A file streamed in pieces by one process is committed by another from its
// entry; one abandoned before its commit leaves nothing behind.
TEST(CheckpointFileWriter, PiecesMakeOneCheckedFileAndAnAbandonedOneIsInvisible) {
  clear_memory_bucket("pieces");
  TempDir dir;
  for (const std::string& uri : {dir.str(), std::string("memory://pieces/ck")}) {
    auto cp = Checkpoint::from_directory(uri);
    const std::string a(300000, 'a'), b = "tail";
    ManifestEntry e;
    {
      CheckpointFileWriter f(cp, "r/__0_0.distcp");
      f.append(std::as_bytes(std::span(a)));
      f.append(std::as_bytes(std::span(b)));
      EXPECT_EQ(f.size(), a.size() + b.size());
      e = f.commit();
      error_message_of([&] { f.commit(); }, ErrorCode::kFailedPrecondition);
    }
    EXPECT_EQ(e.path, "r/__0_0.distcp");
    EXPECT_EQ(e.size, a.size() + b.size());
    EXPECT_EQ(e.xxh3, xxh3_64(a + b));
    {
      CheckpointFileWriter abandoned(cp, "r/__1_0.distcp");
      abandoned.append(std::as_bytes(std::span(b)));
    }
    EXPECT_FALSE(cp.storage().stat("r/__1_0.distcp").has_value()) << uri;
    CheckpointWriter w(cp);
    w.add_written(e);
    w.commit({}, 1.0);
    EXPECT_TRUE(cp.verify().empty()) << uri;
    error_message_of([&] { CheckpointFileWriter late(cp, "x"); }, ErrorCode::kAlreadyExists);
    TempDir fresh;
    error_message_of(
        [&] { CheckpointFileWriter bad(Checkpoint::from_directory(fresh.str()), "../x"); },
        ErrorCode::kInvalidArgument);
  }
  clear_memory_bucket("pieces");
}

TEST(DeleteCheckpoint, TheManifestGoesFirstSoAnInterruptedDeleteIsNeverVisible) {
  clear_memory_bucket("del");
  auto cp = Checkpoint::from_directory("memory://del/ck");
  CheckpointWriter w(cp);
  w.write_file("a", "1");
  w.write_file("b", "2");
  w.commit({}, 1.0);
  set_memory_faults("del",
                    MemoryFaults{std::nullopt, [](std::string_view op, std::string_view key) {
                                   if (op == "remove" && key == "ck/b")
                                     throw Error(ErrorCode::kIO, "ck/b: I/O error");
                                 }});
  EXPECT_THROW(delete_checkpoint(cp), Error);
  EXPECT_FALSE(cp.is_committed());
  set_memory_faults("del", {});
  EXPECT_EQ(remove_uncommitted(cp).size(), 1u);
  clear_memory_bucket("del");
}

TEST(RemoveUncommitted, RemovesTheEmptyFolderOfAWriterKilledBeforeItsFirstFile) {
  TempDir dir;
  fs::create_directories(dir.path() / "exp" / "checkpoint_000003");
  fs::create_directories(dir.path() / "exp" / "checkpoint_000004" / "sub");
  auto experiment = open_storage(dir.str());
  EXPECT_TRUE(remove_uncommitted(Checkpoint(experiment->child("exp/checkpoint_000003"))).empty());
  EXPECT_FALSE(fs::exists(dir.path() / "exp" / "checkpoint_000003"));
  remove_uncommitted(Checkpoint(experiment->child("exp/checkpoint_000004")));
  EXPECT_FALSE(fs::exists(dir.path() / "exp" / "checkpoint_000004"));
  // Emptied parents go too, but never the folder the storage was opened at.
  EXPECT_FALSE(fs::exists(dir.path() / "exp"));
  EXPECT_TRUE(fs::exists(dir.path()));
  // A location opened at its own folder keeps it: that folder is the root.
  fs::create_directories(dir.path() / "own");
  remove_uncommitted(Checkpoint::from_directory((dir.path() / "own").string()));
  EXPECT_TRUE(fs::exists(dir.path() / "own"));
}

}  // namespace
}  // namespace cairn::testing
