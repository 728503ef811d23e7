// Everything that takes a path or URI, with s3:// storage: the manager and
// its retention, views of remote checkpoints shared between processes, the
// state engine, the Trainer (workers uploading straight to S3, a worker
// failure, a killed driver and restore) and the CLI.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>

#include "cairn/checkpoint.h"
#include "cairn/commit.h"
#include "cairn/error.h"
#include "cairn/manager.h"
#include "cairn/state_manager.h"
#include "cairn/train.h"
#include "cairn/transfer.h"
#include "cairn/tuner.h"
#include "checkpoint/copy.h"
#include "cli/commands.h"
#include "storage/s3/client.h"
#include "storage/s3/http.h"
#include "support/env.h"
#include "support/errors.h"
#include "support/s3_server.h"
#include "support/temp_dir.h"

namespace cairn {
namespace {

namespace fs = std::filesystem;
using testing::S3Server;
using testing::TempDir;

void write_file(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Views go to a cache folder of the test's own.
class S3EndToEnd : public ::testing::Test {
 protected:
  void SetUp() override {
    root = S3Server::instance().fresh_uri("e2e");
    ::setenv("CAIRN_CACHE_DIR", (cache.path() / "views").c_str(), 1);
  }
  void TearDown() override { ::unsetenv("CAIRN_CACHE_DIR"); }

  TempDir cache;
  std::string root;
};

TEST_F(S3EndToEnd, ManagerKeepsTheBestKAndAReopenedManagerSeesTheSameHistory) {
  TempDir src;
  const std::string exp = root + "/exp";
  CheckpointConfig config;
  config.num_to_keep = 2;
  config.checkpoint_score_attribute = "acc";
  {
    CheckpointManager m(exp, config);
    for (int i = 0; i < 5; ++i) {
      fs::path d = src.path() / std::to_string(i);
      write_file(d / "model.bin", std::string(300'000 + i, static_cast<char>('a' + i)));
      write_file(d / "sub/opt.bin", std::to_string(i));
      m.register_checkpoint({{"acc", i % 3}}, Checkpoint::from_directory(d.string()));
    }
    std::vector<std::string> best;
    for (const auto& r : m.best()) best.push_back(r.name);
    EXPECT_EQ(best, (std::vector<std::string>{"checkpoint_000002", "checkpoint_000004"}));
  }
  CheckpointManager again(exp, config);
  ASSERT_EQ(again.best().size(), 2u);
  ASSERT_TRUE(again.latest());
  EXPECT_EQ(again.latest()->name, "checkpoint_000004");
  EXPECT_TRUE(again.latest()->checkpoint.verify().empty());
  // Retention removed the others' objects, not just their manifests.
  auto storage = open_storage(exp);
  EXPECT_TRUE(storage->list("checkpoint_000000").empty());
  EXPECT_TRUE(storage->list("checkpoint_000003").empty());
  fs::path view = again.latest()->checkpoint.to_directory(src.path() / "copy");
  EXPECT_EQ(slurp(view / "model.bin"), std::string(300'004, 'e'));
}

TEST_F(S3EndToEnd, ManyProcessesAskingForOneViewGetOneDownloadWhichGoesWithTheLastUser) {
  TempDir src;
  write_file(src.path() / "w.bin", std::string(1'000'000, 'w'));
  CheckpointManager m(root + "/exp", {});
  auto rec = m.register_checkpoint({}, Checkpoint::from_directory(src.str()));
  const std::string uri = rec.checkpoint.uri();
  constexpr int kProcs = 4;
  std::vector<pid_t> kids;
  for (int i = 0; i < kProcs; ++i) {
    pid_t pid = ::fork();
    if (pid == 0) {
      bool ok = false;
      {
        auto dir = Checkpoint::from_directory(uri).as_directory();
        ok = slurp(dir.path() / "w.bin") == std::string(1'000'000, 'w');
        write_file(src.path() / fmt::format("seen-{}", i), dir.path().string());
      }
      ::_exit(ok ? 0 : 1);
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  // Every process was handed a local copy under the cache; all are gone now.
  for (int i = 0; i < kProcs; ++i) {
    std::string seen = slurp(src.path() / fmt::format("seen-{}", i));
    EXPECT_EQ(seen.rfind((cache.path() / "views").string(), 0), 0u) << seen;
  }
  size_t left = 0;
  for (const auto& e : fs::directory_iterator(cache.path() / "views")) {
    (void)e;
    ++left;
  }
  EXPECT_EQ(left, 0u) << "views outlived their users";
}

TEST_F(S3EndToEnd, StateManagerSavesAndRestoresTensorsOnS3) {
  std::vector<float> w(200'000);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) * 0.5f;
  std::vector<int64_t> step(1, 9);
  auto state = [&] {
    StateDict s;
    s.add_mutable<float>("layer/w", {400, 500}, w);
    s.add_mutable<int64_t>("step", {}, step);
    return s;
  };
  StateCheckpointOptions o;
  o.max_to_keep = 2;
  {
    StateCheckpointManager m(root + "/state", o);
    for (uint64_t s = 1; s <= 3; ++s) m.save(state(), s * 10, {{"loss", 1.0 / s}});
    m.wait();
    EXPECT_EQ(m.checkpoints().size(), 2u);
  }
  std::vector<float> saved = w;
  std::fill(w.begin(), w.end(), 0.0f);
  step[0] = 0;
  StateDict target = state();
  StateCheckpointManager reopened(root + "/state", o);
  RestoreResult r = reopened.restore(target);
  EXPECT_EQ(r.step, 30u);
  EXPECT_EQ(w, saved);
  EXPECT_EQ(step[0], 9);
}

void epoch_loop(const nlohmann::json& config) {
  int start = 0;
  if (auto ckpt = train::get_checkpoint()) {
    start = std::stoi(slurp(ckpt->as_directory().path() / "epoch.txt")) + 1;
  }
  const auto& ctx = train::get_context();
  for (int epoch = start; epoch < config.at("epochs").get<int>(); ++epoch) {
    if (config.value("fail_at_epoch", -1) == epoch && ctx.attempt == 0 && ctx.world_rank == 1) {
      throw std::runtime_error("intentional error");
    }
    train::TemporaryDirectory tmp;
    write_file(fs::path(tmp.path()) / fmt::format("shard-{}.bin", ctx.world_rank),
               std::string(200'000, static_cast<char>('0' + ctx.world_rank)));
    if (ctx.world_rank == 0) write_file(fs::path(tmp.path()) / "epoch.txt", std::to_string(epoch));
    if (config.value("sleep_ms", 0) > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(config["sleep_ms"].get<int>()));
    }
    train::report({{"epoch", epoch}}, Checkpoint::from_directory(tmp.path()));
  }
}

TEST_F(S3EndToEnd, TrainerRanksUploadToS3AndAFailedWorkerRestartsFromTheLatestCheckpoint) {
  RunConfig run;
  run.name = "fit";
  run.storage_path = root;
  run.failure_config.max_failures = 1;
  run.checkpoint_config.num_to_keep = 2;
  Result r = Trainer(epoch_loop, {{"epochs", 4}, {"fail_at_epoch", 2}},
                     ScalingConfig{.num_workers = 2}, run)
                 .fit();
  ASSERT_FALSE(r.error) << *r.error;
  EXPECT_EQ(r.metrics["epoch"], 3);
  ASSERT_TRUE(r.checkpoint);
  EXPECT_EQ(r.checkpoint->uri(), root + "/fit/checkpoint_000003");
  std::vector<std::string> names;
  for (const auto& f : r.checkpoint->manifest().files) names.push_back(f.path);
  EXPECT_EQ(names, (std::vector<std::string>{"epoch.txt", "shard-0.bin", "shard-1.bin"}));
  EXPECT_TRUE(r.checkpoint->verify().empty());
  ExperimentListing listing = read_experiment(root + "/fit");
  EXPECT_EQ(listing.checkpoints.size(), 2u);
}

// A Trainer's commit of N ranks' files must not cost N requests: the files
// are checked against one listing (one request per 1,000 keys, and per
// prefix when keys are spread over prefixes: CAIRN_S3_PREFIXES), not with a
// HEAD each (docs/scale.md).
TEST_F(S3EndToEnd, ACommitOfManyRanksFilesChecksThemWithAListingNotARequestEach) {
  CheckpointManager m(root + "/many", CheckpointConfig{});
  Checkpoint reserved = m.reserve_next();
  std::vector<ManifestEntry> files;
  for (int rank = 0; rank < 300; ++rank) {
    const std::string name = fmt::format("rank-{}.bin", rank);
    const std::string bytes = std::to_string(rank);
    reserved.storage().put(name, bytes);
    files.push_back({name, bytes.size(), 0});
  }
  const uint64_t before = s3::requests_sent();
  CheckpointRecord rec = m.commit_reserved(reserved, {{"step", 1}}, files);
  const uint64_t sent = s3::requests_sent() - before;
  const uint64_t prefixes = s3::S3Options::from_environment(s3::AwsEnvironment::process()).prefixes;
  EXPECT_LT(sent, 20u + 2 * (prefixes - 1))
      << sent << " requests for a commit of 300 files over " << prefixes << " prefix(es)";
  EXPECT_EQ(rec.checkpoint.manifest().files.size(), 300u);
}

TEST_F(S3EndToEnd, ARanksUploadIntoItsReservedLocationSendsOneRequestPerSmallFile) {
  TempDir local;
  for (int i = 0; i < 3; ++i) {
    std::ofstream(local.path() / fmt::format("part-{}.bin", i)) << std::string(100 + i, 'x');
  }
  const Checkpoint source = Checkpoint::from_directory(local.str());
  // No manager here: its lock's heartbeat would send requests of its own
  // while these are counted.
  Checkpoint reserved = Checkpoint::from_directory(root + "/uploads/checkpoint_000000");
  uint64_t before = s3::requests_sent();
  std::vector<ManifestEntry> files = copy_files(source, reserved.storage());
  EXPECT_EQ(s3::requests_sent() - before, 3u) << "the Trainer's ranks upload this way";
  ASSERT_EQ(files.size(), 3u);
  CheckpointWriter committer(reserved);
  committer.add_written(files);
  committer.commit({{"step", 1}}, 0.0);
  EXPECT_TRUE(reserved.verify().empty());

  // CheckpointWriter, for a destination it does not know, looks first.
  Checkpoint other = Checkpoint::from_directory(root + "/uploads/checkpoint_000001");
  before = s3::requests_sent();
  CheckpointWriter(other).copy_from(source);
  EXPECT_EQ(s3::requests_sent() - before, 4u);
}

TEST_F(S3EndToEnd, AKilledDriverIsRestoredFromS3AndContinues) {
  RunConfig run;
  run.name = "killed";
  run.storage_path = root;
  const std::string exp = root + "/killed";
  pid_t driver = ::fork();
  if (driver == 0) {
    Trainer(epoch_loop, {{"epochs", 200}, {"sleep_ms", 100}}, ScalingConfig{.num_workers = 2}, run)
        .fit();
    ::_exit(0);
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  size_t committed = 0;
  while (std::chrono::steady_clock::now() < deadline && committed < 2) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    try {
      committed = read_experiment(exp).checkpoints.size();
    } catch (const Error&) {  // not created yet
    }
  }
  ASSERT_EQ(::kill(driver, SIGKILL), 0);
  ::waitpid(driver, nullptr, 0);
  ASSERT_GE(committed, 2u) << "the driver made no progress";
  ASSERT_TRUE(Trainer::can_restore(exp));
  ExperimentListing before = read_experiment(exp);
  const int last = std::stoi(Checkpoint::from_directory(before.checkpoints.back().checkpoint.uri())
                                 .storage()
                                 .get("epoch.txt"));
  Result r =
      Trainer::restore(exp, epoch_loop, nlohmann::json::object({{"epochs", last + 3}})).fit();
  ASSERT_FALSE(r.error) << *r.error;
  EXPECT_EQ(r.metrics["epoch"], last + 2);
  for (const auto& c : read_experiment(exp).checkpoints) EXPECT_TRUE(c.checkpoint.verify().empty());
}

// A Tuner whose experiment lives on S3: a killed driver, restore, PBT
// clones copied on S3, retention with num_to_keep = 1.
void tune_counter(const nlohmann::json& config) {
  int step = 0;
  if (auto c = train::get_checkpoint()) step = std::stoi(c->storage().get("step.txt"));
  while (step < 8) {
    std::this_thread::sleep_for(std::chrono::milliseconds(config.value("sleep_ms", 30)));
    ++step;
    train::TemporaryDirectory tmp;
    write_file(fs::path(tmp.path()) / "step.txt", std::to_string(step));
    train::report({{"step", step}, {"score", config.at("lr").get<double>() * step}},
                  Checkpoint::from_directory(tmp.path()));
  }
}

TEST_F(S3EndToEnd, ATunerOnS3IsRestoredAfterItsDriverIsKilledAndPbtClonesThere) {
  RunConfig run;
  run.name = "tuned";
  run.storage_path = root;
  run.checkpoint_config.num_to_keep = 1;
  const std::string exp = root + "/tuned";
  auto tune_config = [] {
    tune::TuneConfig tc;
    tc.metric = "score";
    tc.mode = "max";
    tc.max_concurrent_trials = 2;
    tune::PBTOptions o;
    o.perturbation_interval = 2;
    o.quantile_fraction = 0.5;
    o.hyperparam_mutations = {{"lr", tune::uniform(0.5, 4.0)}};
    tc.scheduler = std::make_shared<tune::PopulationBasedTraining>(o);
    return tc;
  };
  std::fflush(nullptr);
  pid_t driver = ::fork();
  if (driver == 0) {
    // The child never returns into the test: it is killed, or ends here.
    try {
      tune::Tuner(tune_counter, {{"lr", tune::grid_search({0.5, 1.0, 2.0, 3.0})}}, tune_config(),
                  run)
          .fit();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "the Tuner's driver failed: %s\n", e.what());
      ::_exit(1);
    }
    ::_exit(0);
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  size_t committed = 0;
  while (std::chrono::steady_clock::now() < deadline && committed < 3) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    try {
      // One reading: with num_to_keep = 1 the next may list no checkpoint
      // (the old one deleted, the new one committed after the listing).
      const auto trial = read_experiment(exp + "/trial_00000");
      if (!trial.checkpoints.empty()) {
        committed = std::stoul(trial.checkpoints.back().checkpoint.storage().get("step.txt"));
      }
    } catch (const Error&) {  // not created yet, or a checkpoint deleted as it was read
    }
  }
  ASSERT_EQ(::kill(driver, SIGKILL), 0);
  ::waitpid(driver, nullptr, 0);
  ASSERT_GE(committed, 3u) << "the driver made no progress";
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // its runners die with it
  ASSERT_TRUE(tune::Tuner::can_restore(exp));
  tune::ResultGrid grid = tune::Tuner::restore(exp, tune_counter, {}, tune_config()).fit();
  ASSERT_EQ(grid.size(), 4u);
  EXPECT_EQ(grid.num_terminated(), 4u);
  for (const auto& r : grid) {
    EXPECT_FALSE(r.error) << r.trial_id << ": " << r.error.value_or("");
    ASSERT_TRUE(r.checkpoint) << r.trial_id;
    EXPECT_TRUE(r.checkpoint->verify().empty());
    EXPECT_EQ(r.path, exp + "/" + r.trial_id);
  }
  EXPECT_TRUE(open_storage(exp)->list(".cairn_clones").empty());
}

TEST_F(S3EndToEnd, CliListsVerifiesAndCleansAnExperimentOnS3) {
  TempDir src;
  write_file(src.path() / "a.bin", "aaaa");
  const std::string exp = root + "/cli";
  {
    CheckpointManager m(exp, {});
    m.register_checkpoint({{"loss", 1}}, Checkpoint::from_directory(src.str()));
    m.register_checkpoint({{"loss", 2}}, Checkpoint::from_directory(src.str()));
  }
  // A leftover: files of a save that never committed.
  open_storage(exp)->put("checkpoint_000007/a.bin", "partial");
  auto ls = cli::collect_ls(exp);
  ASSERT_EQ(ls.experiments.size(), 1u);
  EXPECT_EQ(ls.experiments[0].checkpoints.size(), 3u);
  auto verify = cli::collect_verify(exp);
  EXPECT_TRUE(verify.problems.empty());
  open_storage(exp)->put("checkpoint_000001/a.bin", "tampered");
  EXPECT_FALSE(cli::collect_verify(exp).problems.empty());
  auto dry = cli::collect_gc(exp, /*dry_run=*/true);
  EXPECT_FALSE(dry.removed.empty());
  EXPECT_TRUE(open_storage(exp)->exists("checkpoint_000007/a.bin"));
  cli::collect_gc(exp, /*dry_run=*/false);
  EXPECT_FALSE(open_storage(exp)->exists("checkpoint_000007/a.bin"));
  EXPECT_TRUE(open_storage(exp)->exists("checkpoint_000000/a.bin"));
}

// An S3 PUT is atomic, so a manifest that cannot be read was damaged after
// its commit: verify fails naming it, gc keeps it, the manager's open
// falls back to the newest intact checkpoint, and show lists what is left.
TEST_F(S3EndToEnd, CliReportsADamagedManifestOnS3AndNothingRemovesItsCheckpoint) {
  TempDir src;
  write_file(src.path() / "a.bin", "aaaa");
  const std::string exp = root + "/damaged";
  {
    CheckpointManager m(exp, {});
    for (int i = 0; i < 3; ++i) {
      m.register_checkpoint({{"i", i}}, Checkpoint::from_directory(src.str()));
    }
  }
  auto storage = open_storage(exp);
  ASSERT_FALSE(storage->capabilities().torn_writes);
  const std::string key = "checkpoint_000002/.cairn/manifest.json";
  const std::string whole = storage->get(key);
  storage->put(key, whole.substr(0, whole.size() / 3));

  auto verify = cli::collect_verify(exp);
  ASSERT_EQ(verify.problems.size(), 1u);
  EXPECT_EQ(verify.problems[0].path, ".cairn/manifest.json");
  EXPECT_EQ(verify.problems[0].checkpoint, storage->uri_of("checkpoint_000002"));
  EXPECT_TRUE(verify.skipped.empty());
  cli::collect_gc(exp, /*dry_run=*/false);
  EXPECT_TRUE(storage->exists("checkpoint_000002/a.bin"));
  std::vector<std::string> warnings;
  ManagerOptions options;
  options.warn = [&](const std::string& w) { warnings.push_back(w); };
  {
    CheckpointManager m(exp, {}, options);
    ASSERT_TRUE(m.latest());
    EXPECT_EQ(m.latest()->name, "checkpoint_000001");
    ASSERT_FALSE(warnings.empty());
    EXPECT_NE(warnings[0].find("checkpoint_000002"), std::string::npos) << warnings[0];
  }
  cli::collect_gc(exp, /*dry_run=*/false);
  EXPECT_TRUE(storage->exists("checkpoint_000002/a.bin"));
  auto show = cli::collect_show(storage->uri_of("checkpoint_000002"));
  ASSERT_TRUE(show.damage);
  ASSERT_EQ(show.files.size(), 1u);
  EXPECT_EQ(show.files[0].path, "a.bin");
  EXPECT_EQ(show.files[0].size, 4u);
}

// A server declared to keep interrupted PUTs in part (CAIRN_S3_TORN_WRITES)
// can leave a torn manifest behind a killed commit: there a torn manifest
// the history does not list is a leftover that verify skips and gc removes,
// while one the history lists is still damage, kept.
TEST_F(S3EndToEnd, CliOnAServerThatTearsWritesRemovesOnlyTornManifestsNoHistoryLists) {
  testing::ScopedEnv torn("CAIRN_S3_TORN_WRITES", "on");
  TempDir src;
  write_file(src.path() / "a.bin", "aaaa");
  const std::string exp = root + "/torn";
  {
    CheckpointManager m(exp, {});
    m.register_checkpoint({{"i", 0}}, Checkpoint::from_directory(src.str()));
    m.register_checkpoint({{"i", 1}}, Checkpoint::from_directory(src.str()));
  }
  auto storage = open_storage(exp);
  ASSERT_TRUE(storage->capabilities().torn_writes);
  const std::string whole = storage->get("checkpoint_000001/.cairn/manifest.json");
  // Listed by the history, then damaged: damage even here.
  storage->put("checkpoint_000001/.cairn/manifest.json", "");
  // Not listed: the remains of an interrupted commit.
  storage->put("checkpoint_000002/a.bin", "aaaa");
  storage->put("checkpoint_000002/.cairn/manifest.json", whole.substr(0, whole.size() - 9));

  auto verify = cli::collect_verify(exp);
  ASSERT_EQ(verify.problems.size(), 1u);
  EXPECT_EQ(verify.problems[0].checkpoint, storage->uri_of("checkpoint_000001"));
  ASSERT_EQ(verify.skipped.size(), 1u);
  EXPECT_EQ(verify.skipped[0], storage->uri_of("checkpoint_000002"));
  cli::collect_gc(exp, /*dry_run=*/false);
  EXPECT_FALSE(storage->exists("checkpoint_000002/a.bin"));
  EXPECT_TRUE(storage->exists("checkpoint_000001/a.bin"));
  EXPECT_TRUE(storage->exists("checkpoint_000000/a.bin"));
}

// A metadata replace killed mid-PUT: on a server that keeps interrupted PUTs
// in part, the metadata it was replacing is read instead of the torn object,
// and the next update builds on it; on one that writes whole objects (the
// default) unreadable metadata is damage, named.
TEST_F(S3EndToEnd, ATornMetadataReplaceLeavesThePreviousMetadataReadable) {
  TempDir src;
  write_file(src.path() / "a.bin", "aaaa");
  const std::string exp = root + "/metadata";
  const Checkpoint cp = CheckpointManager(exp, {})
                            .register_checkpoint({}, Checkpoint::from_directory(src.str()))
                            .checkpoint;
  auto storage = open_storage(exp);
  const std::string key = "checkpoint_000000/.cairn/metadata.json";
  {
    testing::ScopedEnv torn("CAIRN_S3_TORN_WRITES", "on");
    const Checkpoint tearing(open_storage(cp.uri()));
    tearing.set_metadata({{"v", 1}});
    tearing.update_metadata({{"v", 2}});
    // What a kill in the middle of the next update's PUT leaves.
    tearing.update_metadata({{"v", 3}});
    const std::string whole = storage->get(key);
    storage->put(key, whole.substr(0, whole.size() / 2));
    EXPECT_EQ(tearing.get_metadata(), (nlohmann::json{{"v", 2}}));
    // `cairn cp` copies what get_metadata() reads, not the torn bytes.
    TempDir out;
    transfer(tearing.uri(), (out.path() / "copy").string());
    EXPECT_EQ(Checkpoint::from_directory((out.path() / "copy").string()).get_metadata(),
              (nlohmann::json{{"v", 2}}));
    tearing.update_metadata({{"w", 1}});
    EXPECT_EQ(tearing.get_metadata(), (nlohmann::json{{"v", 2}, {"w", 1}}));
    // Torn again, from the empty object a killed first write leaves.
    storage->put(key, "");
    EXPECT_EQ(tearing.get_metadata(), (nlohmann::json{{"v", 2}}));
  }
  try {
    cp.get_metadata();
    ADD_FAILURE() << "unreadable metadata on a server that writes whole objects was read";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruption);
    EXPECT_NE(std::string(e.what()).find(storage->uri_of(key)), std::string::npos) << e.what();
  }
}

// A multipart upload killed while its marker was being written can leave
// the marker empty (on a server that tears writes) or unreadable: it is an
// incomplete write like any other. `cairn gc` and the next manager open each
// remove such markers, and say so at info level, never as an error.
TEST_F(S3EndToEnd, EmptyUploadMarkersOfKilledUploadsAreRemovedByGcAndByTheOpenAtInfoLevel) {
  TempDir src;
  write_file(src.path() / "a.bin", "aaaa");
  for (const bool by_gc : {true, false}) {
    SCOPED_TRACE(by_gc ? "cairn gc" : "the manager's open");
    const std::string exp = root + (by_gc ? "/markers-gc" : "/markers-open");
    CheckpointManager(exp, {}).register_checkpoint({}, Checkpoint::from_directory(src.str()));
    auto storage = open_storage(exp);
    // A save of checkpoint 1 killed in its upload of model.bin: one file
    // done, the marker of the next empty, another's not JSON.
    storage->put("checkpoint_000001/a.bin", "aaaa");
    const std::vector<std::string> markers = {
        "checkpoint_000001/.model.bin.cairn-upload-00000000000000aa",
        "checkpoint_000001/.opt.bin.cairn-upload-00000000000000bb"};
    storage->put(markers[0], "");
    storage->put(markers[1], "{\"key\": ");
    ASSERT_EQ(storage->list_incomplete("").size(), 2u);

    ::testing::internal::CaptureStderr();
    GcReport report;
    if (by_gc) {
      report = collect_garbage(exp);
    } else {
      CheckpointManager reopened(exp, {});
      EXPECT_EQ(reopened.history().size(), 1u);
    }
    const std::string log = ::testing::internal::GetCapturedStderr();
    EXPECT_TRUE(storage->list_incomplete("").empty());
    EXPECT_FALSE(storage->exists("checkpoint_000001/a.bin"));
    EXPECT_TRUE(storage->exists("checkpoint_000000/a.bin"));
    for (const auto& marker : markers) {
      if (by_gc) {
        EXPECT_NE(std::find(report.removed.begin(), report.removed.end(), storage->uri_of(marker)),
                  report.removed.end())
            << marker;
      }
      EXPECT_NE(log.find(storage->uri_of(marker)), std::string::npos) << log;
    }
    EXPECT_EQ(log.find("[warning]"), std::string::npos) << log;
    EXPECT_EQ(log.find("[error]"), std::string::npos) << log;
    EXPECT_EQ(log.find("JSON"), std::string::npos) << log;
  }
}

TEST_F(S3EndToEnd, CpCopiesAnExperimentToS3AndBackAndAReRunCopiesNothing) {
  TempDir src;
  const std::string local = (src.path() / "exp").string();
  {
    CheckpointManager m(local, {});
    for (int i = 0; i < 3; ++i) {
      fs::path d = src.path() / fmt::format("in-{}", i);
      write_file(d / "model.bin", std::string(600'000 + i, static_cast<char>('m' + i)));
      m.register_checkpoint({{"i", i}}, Checkpoint::from_directory(d.string()));
    }
  }
  TransferOptions o;
  o.chunk_size = 256 * 1024;
  TransferReport up = transfer(local, root + "/copied", o);
  EXPECT_EQ(up.kind, TransferKind::kExperiment);
  EXPECT_EQ(up.checkpoints_copied.size(), 3u);
  {
    CheckpointManager remote(root + "/copied", {});
    ASSERT_EQ(remote.history().size(), 3u);
    for (const auto& r : remote.history()) EXPECT_TRUE(r.checkpoint.verify().empty());
  }
  TransferReport again = transfer(local, root + "/copied", o);
  EXPECT_EQ(again.files_copied, 0u);
  TransferReport down =
      transfer(root + "/copied/checkpoint_000002", (src.path() / "back").string(), o);
  EXPECT_EQ(down.kind, TransferKind::kCheckpoint);
  EXPECT_EQ(slurp(src.path() / "back" / "model.bin"), std::string(600'002, 'o'));
  EXPECT_TRUE(Checkpoint::from_directory((src.path() / "back").string()).verify().empty());
}

TEST_F(S3EndToEnd, CpSendsAFileUpToTheUploadCutoffInOnePutCheckedBeforeItIsSent) {
  // 256 KiB parts (the test server), 200 MiB cutoff: a 2 MB file goes in one
  // streamed PUT, the same bytes as a multipart upload would have sent.
  TempDir src;
  const fs::path dir = src.path() / "ckpt";
  const std::string big(2'000'000, 'b');
  write_file(dir / "model.bin", big);
  write_file(dir / "small.txt", "small");
  const fs::path exp = src.path() / "exp";
  const Checkpoint source = CheckpointManager(exp.string(), {})
                                .register_checkpoint({}, Checkpoint::from_directory(dir.string()))
                                .checkpoint;
  TransferOptions o;
  o.chunk_size = 256 * 1024;
  const uint64_t before = s3::requests_sent();
  TransferReport up = transfer(source.uri(), root + "/one", o);
  const uint64_t used = s3::requests_sent() - before;
  EXPECT_EQ(up.files_copied, 2u);
  EXPECT_EQ(open_storage(root + "/one")->get("model.bin"), big);
  EXPECT_TRUE(Checkpoint::from_directory(root + "/one").verify().empty());
  {
    testing::ScopedEnv cutoff("CAIRN_S3_UPLOAD_CUTOFF", "0");
    const uint64_t start = s3::requests_sent();
    transfer(source.uri(), root + "/parts", o);
    // 8 parts of 256 KiB where one PUT did: 7 more, plus the upload's start,
    // marker, completion and the marker's removal.
    EXPECT_EQ(s3::requests_sent() - start, used + 7 + 4);
  }

  // A source file whose bytes no longer match its manifest (same size) is
  // refused before anything of it is sent: no object, nothing committed.
  std::string damaged = big;
  damaged[1'500'000] = 'X';
  write_file(exp / "checkpoint_000000" / "model.bin", damaged);
  const std::string message = testing::error_message_of(
      [&] { transfer(source.uri(), root + "/damaged", o); }, ErrorCode::kCorruption);
  EXPECT_NE(message.find("model.bin"), std::string::npos) << message;
  EXPECT_FALSE(open_storage(root + "/damaged")->exists("model.bin"));
  EXPECT_FALSE(Checkpoint::from_directory(root + "/damaged").is_committed());
}

}  // namespace
}  // namespace cairn
