// Copying checkpoints and experiments between storages (cairn/transfer.h):
// between file and memory backends, in parallel chunks, resumed after a
// failure, refusing damaged sources and committed destinations, and writing
// the manifest and the history last.
#include "cairn/transfer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cairn/commit.h"
#include "cairn/error.h"
#include "cairn/manager.h"
#include "manager/history_store.h"
#include "storage/backends.h"
#include "support/errors.h"
#include "support/temp_dir.h"

namespace cairn::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng() & 0xff);
  return s;
}

// A committed checkpoint at `uri` with three files and metadata.
Checkpoint make_checkpoint(const std::string& uri, const std::string& model = "model-weights") {
  auto cp = Checkpoint::from_directory(uri);
  CheckpointWriter w(cp);
  w.write_file("model.bin", model);
  w.write_file("opt/state.bin", std::string(3000, 'o'));
  w.write_file("empty.bin", "");
  json metadata = {{"note", "best so far"}};
  w.commit({{"loss", 0.25}}, 1700000000.0, &metadata);
  return cp;
}

class TransferTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* b : kBuckets) clear_memory_bucket(b);
  }
  void TearDown() override {
    for (const char* b : kBuckets) {
      set_memory_faults(b, {});
      clear_memory_bucket(b);
    }
  }
  static constexpr const char* kBuckets[] = {"xfer-src", "xfer-dst"};
  TempDir tmp_;
};

void expect_same_checkpoint(const Checkpoint& src, const Checkpoint& dst) {
  ASSERT_TRUE(dst.is_committed()) << dst.uri();
  EXPECT_EQ(dst.storage().get(kManifestKey), src.storage().get(kManifestKey));
  EXPECT_TRUE(dst.verify().empty());
  for (const auto& f : src.manifest().files) {
    EXPECT_EQ(dst.storage().get(f.path), src.storage().get(f.path)) << f.path;
  }
  EXPECT_EQ(dst.get_metadata(), src.get_metadata());
}

TEST_F(TransferTest, CopiesACommittedCheckpointFileToFile) {
  auto src = make_checkpoint((tmp_ / "src").string());
  const std::string dst_path = (tmp_ / "dst").string();
  std::vector<TransferProgress> seen;
  TransferOptions options;
  options.progress = [&](const TransferProgress& p) { seen.push_back(p); };
  TransferReport r = copy_checkpoint(src.uri(), dst_path, options);
  auto dst = Checkpoint::from_directory(dst_path);
  expect_same_checkpoint(src, dst);
  EXPECT_EQ(r.kind, TransferKind::kCheckpoint);
  EXPECT_EQ(r.files_copied, 3u);
  EXPECT_EQ(r.bytes_copied, 13u + 3000u);
  EXPECT_EQ(r.files_skipped, 0u);
  EXPECT_EQ(r.destination, dst.uri());
  EXPECT_EQ(r.checkpoints_copied, std::vector<std::string>{dst.uri()});
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back().bytes_done, seen.back().bytes_total);
  EXPECT_EQ(seen.back().files_done, 3u);
  EXPECT_EQ(seen.back().files_total, 3u);
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_GE(seen[i].bytes_done, seen[i - 1].bytes_done);
}

TEST_F(TransferTest, CopiesACheckpointFromMemoryToFileAndBackToMemory) {
  auto src = make_checkpoint("memory://xfer-src/ckpt");
  const std::string local = (tmp_ / "local").string();
  EXPECT_EQ(transfer(src.uri(), local).files_copied, 3u);
  expect_same_checkpoint(src, Checkpoint::from_directory(local));
  TransferReport back = transfer(local, "memory://xfer-dst/ckpt");
  EXPECT_EQ(back.files_copied, 3u);
  expect_same_checkpoint(src, Checkpoint::from_directory("memory://xfer-dst/ckpt"));
}

TEST_F(TransferTest, ALargeFileIsCopiedInParallelRangedChunksByteIdentical) {
  const std::string big = random_bytes(20u << 20, 7);
  auto src = make_checkpoint((tmp_ / "src").string(), big);
  std::mutex mu;
  std::vector<std::string> writes;
  MemoryFaults faults;
  faults.before = [&](std::string_view op, std::string_view key) {
    std::lock_guard<std::mutex> g(mu);
    if (op == "write") writes.emplace_back(key);
  };
  set_memory_faults("xfer-dst", faults);
  TransferOptions options;
  options.jobs = 4;
  options.chunk_size = 1u << 20;
  TransferReport r = copy_checkpoint(src.uri(), "memory://xfer-dst/ckpt", options);
  set_memory_faults("xfer-dst", {});
  auto dst = Checkpoint::from_directory("memory://xfer-dst/ckpt");
  EXPECT_EQ(dst.storage().get("model.bin"), big);
  expect_same_checkpoint(src, dst);
  EXPECT_EQ(std::count(writes.begin(), writes.end(), "ckpt/model.bin"), 20);
  EXPECT_EQ(r.bytes_copied, big.size() + 3000u);
}

TEST_F(TransferTest, ACopyToALocalDiskIsByteIdenticalWithAlignedAndUnalignedChunks) {
  // Chunks that are a multiple of 4 KiB go to a local file with direct
  // writes (the last one padded, the padding cut off) and are read back
  // with O_DIRECT; others take the buffered path. A size that is no
  // multiple of 4 KiB, every check on.
  const std::string big = random_bytes((5u << 20) + 1234, 11);
  auto src = make_checkpoint((tmp_ / "src").string(), big);
  int n = 0;
  for (uint64_t chunk : {uint64_t{1} << 20, (uint64_t{1} << 20) + 1}) {
    SCOPED_TRACE(chunk);
    TransferOptions options;
    options.jobs = 3;
    options.chunk_size = chunk;
    options.verify = TransferVerify::kChecksum;
    const fs::path dst = tmp_ / fmt::format("dst-{}", n++);
    copy_checkpoint(src.uri(), dst.string(), options);
    EXPECT_EQ(fs::file_size(dst / "model.bin"), big.size());
    auto copied = Checkpoint::from_directory(dst.string());
    EXPECT_EQ(copied.storage().get("model.bin"), big);
    expect_same_checkpoint(src, copied);
    EXPECT_TRUE(copied.verify().empty());
  }
}

TEST_F(TransferTest, AResumedCopySkipsTheFilesAnInterruptedOneCompleted) {
  auto src = Checkpoint::from_directory("memory://xfer-src/ckpt");
  {
    CheckpointWriter w(src);
    for (const char* name : {"a.bin", "b.bin", "c.bin", "d.bin"}) {
      w.write_file(name, std::string(1000, name[0]));
    }
    w.commit({}, 1.0);
  }
  MemoryFaults faults;
  faults.before = [](std::string_view op, std::string_view key) {
    if (op == "commit" && key == "ckpt/c.bin") throw Error(ErrorCode::kIO, "injected: link lost");
  };
  set_memory_faults("xfer-dst", faults);
  TransferOptions one_at_a_time;
  one_at_a_time.jobs = 1;  // a, b, c, d in order: a and b land before c fails
  std::string message = error_message_of(
      [&] { copy_checkpoint(src.uri(), "memory://xfer-dst/ckpt", one_at_a_time); }, ErrorCode::kIO);
  EXPECT_NE(message.find("injected"), std::string::npos) << message;
  auto dst = Checkpoint::from_directory("memory://xfer-dst/ckpt");
  EXPECT_FALSE(dst.is_committed());
  EXPECT_TRUE(dst.storage().exists("a.bin"));
  EXPECT_TRUE(dst.storage().exists("b.bin"));
  EXPECT_FALSE(dst.storage().exists("c.bin"));

  set_memory_faults("xfer-dst", {});
  TransferProgress last;
  TransferOptions options;
  options.progress = [&](const TransferProgress& p) { last = p; };
  TransferReport r = copy_checkpoint(src.uri(), dst.uri(), options);
  EXPECT_EQ(last.bytes_skipped, 2000u);
  EXPECT_EQ(last.bytes_done, 4000u);
  EXPECT_EQ(last.files_done, 4u);
  EXPECT_EQ(r.files_skipped, 2u);
  EXPECT_EQ(r.bytes_skipped, 2000u);
  EXPECT_EQ(r.files_copied, 2u);
  EXPECT_EQ(r.bytes_copied, 2000u);
  expect_same_checkpoint(src, dst);
}

TEST_F(TransferTest, AResumedCopyReplacesAPartialFileThatDoesNotMatch) {
  auto src = make_checkpoint("memory://xfer-src/ckpt");
  auto dst = Checkpoint::from_directory("memory://xfer-dst/ckpt");
  dst.storage().put("model.bin", "model-weightX");  // right size, wrong bytes
  dst.storage().put("opt/state.bin", "short");
  TransferReport r = copy_checkpoint(src.uri(), dst.uri());
  EXPECT_EQ(r.files_skipped, 0u);
  EXPECT_EQ(r.files_copied, 3u);
  expect_same_checkpoint(src, dst);
}

TEST_F(TransferTest, ASourceFileThatDoesNotMatchItsManifestFailsNamingItAndCommitsNothing) {
  const fs::path src_dir = tmp_ / "src";
  auto src = make_checkpoint(src_dir.string());
  write_text(src_dir / "opt/state.bin", std::string(2999, 'o') + "X");  // same size, other bytes
  const std::string dst = (tmp_ / "dst").string();
  std::string message =
      error_message_of([&] { copy_checkpoint(src.uri(), dst); }, ErrorCode::kCorruption);
  EXPECT_NE(message.find("opt/state.bin"), std::string::npos) << message;
  EXPECT_FALSE(Checkpoint::from_directory(dst).is_committed());
  EXPECT_FALSE(fs::exists(fs::path(dst) / "opt/state.bin"));

  write_text(src_dir / "opt/state.bin", std::string(3000, 'o'));  // repaired
  write_text(src_dir / "model.bin", "truncated");
  // A fresh destination: the first one may already hold a good model.bin,
  // which a re-run rightly keeps without reading the source's.
  const std::string dst2 = (tmp_ / "dst2").string();
  message = error_message_of([&] { copy_checkpoint(src.uri(), dst2); }, ErrorCode::kCorruption);
  EXPECT_NE(message.find("model.bin"), std::string::npos) << message;
  EXPECT_FALSE(Checkpoint::from_directory(dst2).is_committed());
}

TEST_F(TransferTest, AnUncommittedSourceIsRefusedNamingIt) {
  const fs::path src_dir = tmp_ / "half";
  write_text(src_dir / "model.bin", "half-written");
  const std::string dst = (tmp_ / "dst").string();
  std::string message = error_message_of([&] { copy_checkpoint(src_dir.string(), dst); },
                                         ErrorCode::kFailedPrecondition);
  EXPECT_NE(message.find(src_dir.string()), std::string::npos) << message;
  message =
      error_message_of([&] { transfer(src_dir.string(), dst); }, ErrorCode::kFailedPrecondition);
  EXPECT_NE(message.find("not a committed checkpoint"), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(dst));
  error_message_of([&] { transfer((tmp_ / "missing").string(), dst); }, ErrorCode::kNotFound);
}

TEST_F(TransferTest, ACommittedDestinationWithAnotherManifestIsRefusedAndLeftUntouched) {
  auto src = make_checkpoint("memory://xfer-src/ckpt");
  auto dst = make_checkpoint("memory://xfer-dst/ckpt", "other-weights");
  const std::string manifest_before = dst.storage().get(kManifestKey);
  std::string message =
      error_message_of([&] { copy_checkpoint(src.uri(), dst.uri()); }, ErrorCode::kAlreadyExists);
  EXPECT_NE(message.find(dst.uri()), std::string::npos) << message;
  EXPECT_EQ(dst.storage().get(kManifestKey), manifest_before);
  EXPECT_EQ(dst.storage().get("model.bin"), "other-weights");
  EXPECT_TRUE(dst.verify().empty());
}

TEST_F(TransferTest, CopyingOntoAnIdenticalCommittedCheckpointIsANoOpThatUpdatesMetadata) {
  auto src = make_checkpoint("memory://xfer-src/ckpt");
  copy_checkpoint(src.uri(), "memory://xfer-dst/ckpt");
  src.update_metadata({{"note", "promoted"}});
  std::vector<std::string> writes;
  MemoryFaults faults;
  faults.before = [&](std::string_view op, std::string_view key) {
    if (op == "commit") writes.emplace_back(key);
  };
  set_memory_faults("xfer-dst", faults);
  TransferReport r = copy_checkpoint(src.uri(), "memory://xfer-dst/ckpt");
  set_memory_faults("xfer-dst", {});
  EXPECT_EQ(r.files_copied, 0u);
  EXPECT_EQ(r.files_skipped, 3u);
  EXPECT_TRUE(r.checkpoints_copied.empty());
  EXPECT_EQ(r.checkpoints_unchanged.size(), 1u);
  EXPECT_EQ(writes, std::vector<std::string>{"ckpt/.cairn/metadata.json"});
  expect_same_checkpoint(src, Checkpoint::from_directory("memory://xfer-dst/ckpt"));
}

TEST_F(TransferTest, AnUncommittedDestinationWithForeignFilesIsRefused) {
  auto src = make_checkpoint("memory://xfer-src/ckpt");
  auto dst = Checkpoint::from_directory("memory://xfer-dst/ckpt");
  dst.storage().put("notes.txt", "mine");
  std::string message =
      error_message_of([&] { copy_checkpoint(src.uri(), dst.uri()); }, ErrorCode::kAlreadyExists);
  EXPECT_NE(message.find("notes.txt"), std::string::npos) << message;
  EXPECT_FALSE(dst.storage().exists("model.bin"));
}

TEST_F(TransferTest, BadOptionsAndOverlappingLocationsAreRefused) {
  auto src = make_checkpoint((tmp_ / "src").string());
  TransferOptions none;
  none.jobs = 0;
  error_message_of([&] { copy_checkpoint(src.uri(), (tmp_ / "dst").string(), none); },
                   ErrorCode::kInvalidArgument);
  error_message_of([&] { copy_checkpoint(src.uri(), (tmp_ / "src/inner").string()); },
                   ErrorCode::kInvalidArgument);
  error_message_of([&] { copy_checkpoint(src.uri(), src.uri()); }, ErrorCode::kInvalidArgument);
}

// An experiment with three committed checkpoints, an uncommitted leftover and
// a file of its own.
void make_experiment(const std::string& uri) {
  CheckpointManager manager(uri, {});
  for (int i = 0; i < 3; ++i) {
    auto scratch = Checkpoint::from_directory(fmt::format("memory://xfer-src/scratch{}", i));
    CheckpointWriter w(scratch);
    w.write_file("model.bin", fmt::format("weights-{}", i));
    w.write_file("nested/opt.bin", std::string(100 + i, 'x'));
    w.commit({}, 1.0);
    manager.register_checkpoint({{"epoch", i}}, scratch);
    delete_checkpoint(scratch);
  }
  auto storage = open_storage(uri);
  storage->put("trainer_state.json", R"({"attempt": 2})");
  storage->put("checkpoint_000007/model.bin", "half-written");
}

TEST_F(TransferTest, CopiesAnExperimentCheckpointsFirstAndTheHistoryLast) {
  const std::string src = (tmp_ / "exp").string();
  make_experiment(src);
  std::vector<std::string> commits;
  MemoryFaults faults;
  faults.before = [&](std::string_view op, std::string_view key) {
    if (op == "commit") commits.emplace_back(key);
  };
  set_memory_faults("xfer-dst", faults);
  TransferReport r = transfer(src, "memory://xfer-dst/exp");
  set_memory_faults("xfer-dst", {});
  EXPECT_EQ(r.kind, TransferKind::kExperiment);
  EXPECT_EQ(r.checkpoints_copied.size(), 3u);
  EXPECT_EQ(r.files_copied, 7u);  // 3 x 2 files + trainer_state.json
  ASSERT_EQ(r.uncommitted_skipped.size(), 1u);
  EXPECT_NE(r.uncommitted_skipped[0].find("checkpoint_000007"), std::string::npos);
  EXPECT_TRUE(r.warnings.empty()) << r.warnings.front();

  ASSERT_FALSE(commits.empty());
  EXPECT_EQ(commits.back(), "exp/checkpoint_manager.json");
  for (int i = 0; i < 3; ++i) {
    const std::string name = checkpoint_name(i);
    auto manifest =
        std::find(commits.begin(), commits.end(), "exp/" + name + "/.cairn/manifest.json");
    auto model = std::find(commits.begin(), commits.end(), "exp/" + name + "/model.bin");
    ASSERT_NE(manifest, commits.end());
    EXPECT_LT(model, manifest) << name;
  }
  auto dst = open_storage("memory://xfer-dst/exp");
  EXPECT_FALSE(dst->exists("checkpoint_000007/model.bin"));
  EXPECT_EQ(dst->get("trainer_state.json"), R"({"attempt": 2})");
  // The source's snapshot with its log folded in; no log object is copied.
  auto src_storage = open_storage(src);
  EXPECT_EQ(dst->get("checkpoint_manager.json"),
            history::read_folded(*src_storage, [](const std::string&) {}).value());
  for (const auto& o : dst->list("")) EXPECT_FALSE(history::parse_log_key(o.key)) << o.key;
  ExperimentListing copy = read_experiment("memory://xfer-dst/exp");
  ASSERT_EQ(copy.checkpoints.size(), 3u);
  for (const auto& c : copy.checkpoints) {
    EXPECT_TRUE(c.checkpoint.verify().empty());
    EXPECT_EQ(c.metrics["epoch"], c.index);
  }

  // Back to a local folder, then again: the second run copies nothing.
  const std::string back = (tmp_ / "back").string();
  EXPECT_EQ(copy_experiment("memory://xfer-dst/exp", back).checkpoints_copied.size(), 3u);
  EXPECT_FALSE(fs::exists(fs::path(back) / "checkpoint_000007"));
  TransferReport again = copy_experiment("memory://xfer-dst/exp", back);
  EXPECT_EQ(again.files_copied, 0u);
  EXPECT_EQ(again.checkpoints_unchanged.size(), 3u);
  EXPECT_EQ(again.files_skipped, 7u);
  CheckpointManager reopened(back, {});
  EXPECT_EQ(reopened.history().size(), 3u);
}

TEST_F(TransferTest, AnInterruptedExperimentCopyHasNoHistoryAndResumes) {
  make_experiment("memory://xfer-src/exp");
  MemoryFaults faults;
  faults.before = [](std::string_view op, std::string_view key) {
    if (op == "commit" && key == "exp/checkpoint_000001/nested/opt.bin") {
      throw Error(ErrorCode::kNoSpace, "injected: disk full");
    }
  };
  set_memory_faults("xfer-dst", faults);
  error_message_of([&] { copy_experiment("memory://xfer-src/exp", "memory://xfer-dst/exp"); },
                   ErrorCode::kNoSpace);
  auto dst = open_storage("memory://xfer-dst/exp");
  EXPECT_FALSE(dst->exists("checkpoint_manager.json"));
  EXPECT_TRUE(dst->exists("checkpoint_000000/.cairn/manifest.json"));
  EXPECT_FALSE(dst->exists("checkpoint_000001/.cairn/manifest.json"));
  set_memory_faults("xfer-dst", {});
  TransferReport r = copy_experiment("memory://xfer-src/exp", "memory://xfer-dst/exp");
  EXPECT_EQ(r.checkpoints_unchanged.size(), 1u);
  EXPECT_EQ(r.checkpoints_copied.size(), 2u);
  EXPECT_GE(r.files_skipped, 2u);
  EXPECT_TRUE(dst->exists("checkpoint_manager.json"));
  EXPECT_EQ(read_experiment(dst->uri()).checkpoints.size(), 3u);
}

// A copy killed while writing a manifest or the history can leave them torn
// (empty, or cut short) at the destination. That is no commit: the next
// copy goes on over them instead of refusing the destination forever.
TEST_F(TransferTest, TornManifestsAndHistoryAnInterruptedCopyLeftAreCopiedOver) {
  make_experiment("memory://xfer-src/exp");
  copy_experiment("memory://xfer-src/exp", "memory://xfer-dst/exp");
  auto dst = open_storage("memory://xfer-dst/exp");
  const std::string manifest = dst->get("checkpoint_000001/.cairn/manifest.json");
  dst->put("checkpoint_000001/.cairn/manifest.json", manifest.substr(0, manifest.size() / 3));
  dst->put("checkpoint_000002/.cairn/manifest.json", "");
  dst->put("checkpoint_manager.json", "");
  TransferReport r = copy_experiment("memory://xfer-src/exp", "memory://xfer-dst/exp");
  EXPECT_EQ(r.checkpoints_copied.size(), 2u);
  EXPECT_EQ(r.checkpoints_unchanged.size(), 1u);
  EXPECT_EQ(dst->get("checkpoint_000001/.cairn/manifest.json"), manifest);
  ExperimentListing listing = read_experiment(dst->uri());
  ASSERT_EQ(listing.checkpoints.size(), 3u);
  for (const auto& c : listing.checkpoints) EXPECT_TRUE(c.checkpoint.verify().empty()) << c.name;

  // One checkpoint alone, too.
  dst->put("checkpoint_000000/.cairn/manifest.json", "{\"format\": \"cairn-che");
  copy_checkpoint("memory://xfer-src/exp/checkpoint_000000", dst->uri() + "/checkpoint_000000");
  EXPECT_TRUE(Checkpoint(dst->child("checkpoint_000000")).verify().empty());
}

// A source checkpoint whose manifest is torn (a save killed while writing
// it) is a leftover: an experiment copy skips it like any uncommitted one,
// and copying it alone says it is not committed.
TEST_F(TransferTest, ASourceCheckpointWithATornManifestIsNotCopied) {
  make_experiment("memory://xfer-src/exp");
  auto src = open_storage("memory://xfer-src/exp");
  src->put("checkpoint_000005/model.bin", "x");
  src->put("checkpoint_000005/.cairn/manifest.json", "{\"files\": [");
  src->put("checkpoint_000006/.cairn/manifest.json", "");
  TransferReport r = copy_experiment("memory://xfer-src/exp", "memory://xfer-dst/exp");
  EXPECT_EQ(r.checkpoints_copied.size(), 3u);
  auto dst = open_storage("memory://xfer-dst/exp");
  EXPECT_FALSE(dst->exists("checkpoint_000005/.cairn/manifest.json"));
  EXPECT_FALSE(dst->exists("checkpoint_000006/.cairn/manifest.json"));
  std::string msg =
      error_message_of([&] { copy_checkpoint(src->uri() + "/checkpoint_000005", "memory://x/y"); },
                       ErrorCode::kFailedPrecondition);
  EXPECT_NE(msg.find("torn"), std::string::npos) << msg;
}

TEST_F(TransferTest, AnExperimentCopyWaitsForNoOneIntoALockedDestination) {
  make_experiment("memory://xfer-src/exp");
  CheckpointManager live("memory://xfer-dst/exp", {});
  error_message_of([&] { copy_experiment("memory://xfer-src/exp", "memory://xfer-dst/exp"); },
                   ErrorCode::kLocked);
}

TEST_F(TransferTest, AStorageRootHoldingExperimentsIsNotCopiedWhole) {
  make_experiment("memory://xfer-src/root/exp");
  std::string message =
      error_message_of([&] { transfer("memory://xfer-src/root", "memory://xfer-dst/root"); },
                       ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("exp"), std::string::npos) << message;
}

}  // namespace
}  // namespace cairn::testing
