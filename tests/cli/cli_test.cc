// The `cairn` binary, run as a subprocess against experiments written with
// the library in temporary directories.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cairn/checkpoint.h"
#include "cairn/manager.h"
#include "cli/subprocess.h"
#include "manager/history_store.h"
#include "support/temp_dir.h"
#include "util/hash.h"

namespace cairn {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::ProcessResult;
using testing::TempDir;

const std::string kModel = std::string(100, 'w');  // model.bin of every checkpoint
const std::string kOptimizer = "adam-state";       // nested/optimizer.bin

class CliTest : public ::testing::Test {
 protected:
  ProcessResult cairn(const std::vector<std::string>& args) {
    return testing::run_process(CAIRN_CLI_PATH, args);
  }

  // Writes `count` checkpoints into experiment `name` under the root, with
  // metrics {"epoch": i, "loss": 1 / (i + 1)}.
  void make_experiment(const std::string& name, int count, CheckpointConfig config = {}) {
    CheckpointManager manager((root_ / name).string(), config);
    for (int i = 0; i < count; ++i) {
      TempDir scratch;
      testing::write_text(scratch / "model.bin", kModel);
      testing::write_text(scratch / "nested/optimizer.bin", kOptimizer);
      manager.register_checkpoint({{"epoch", i}, {"loss", 1.0 / (i + 1)}},
                                  Checkpoint::from_directory(scratch.str()));
    }
  }

  fs::path checkpoint_dir(const std::string& experiment, int index) const {
    return root_.path() / experiment / checkpoint_name(index);
  }
  std::string uri_of(const fs::path& p) const { return "file://" + p.string(); }
  std::string root() const { return root_.str(); }

  // A leftover of an interrupted save: a checkpoint folder without manifest.
  fs::path make_leftover(const std::string& experiment, int index) {
    fs::path dir = checkpoint_dir(experiment, index);
    testing::write_text(dir / "model.bin", "half-written");
    return dir;
  }

  static void expect_one_line_error(const ProcessResult& r, const std::string& must_name) {
    EXPECT_TRUE(r.out.empty()) << r.out;
    ASSERT_FALSE(r.err.empty());
    EXPECT_EQ(r.err.rfind("cairn: error: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.err.back(), '\n');
    EXPECT_NE(r.err.find(must_name), std::string::npos) << r.err;
  }

  // gc also sweeps this node's unused views of remote checkpoints: give each
  // test its own view cache so that other tests' views are not counted.
  void SetUp() override { setenv("CAIRN_CACHE_DIR", cache_.str().c_str(), 1); }
  void TearDown() override { unsetenv("CAIRN_CACHE_DIR"); }

  TempDir root_;
  TempDir cache_;
};

bool is_iso_utc(const std::string& s) {
  return std::regex_match(s, std::regex(R"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z)"));
}

// ---- ls -----------------------------------------------------------------

TEST_F(CliTest, LsListsEveryExperimentOfAStorageRootWithStateAndMetrics) {
  make_experiment("alpha", 2);
  make_experiment("beta", 1);
  ProcessResult r = cairn({"ls", root()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("experiment alpha"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("experiment beta"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("checkpoint_000001"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("committed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("epoch=1 loss=0.5"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("110 B"), std::string::npos) << r.out;  // 100 + 10 bytes
}

TEST_F(CliTest, LsJsonGivesEveryDocumentedFieldOfEachCheckpoint) {
  make_experiment("alpha", 2);
  ProcessResult r = cairn({"ls", "--json", root()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json doc = json::parse(r.out);
  EXPECT_EQ(doc["schema_version"], 1);
  EXPECT_EQ(doc["command"], "ls");
  EXPECT_EQ(doc["uri"], uri_of(root_.path()));
  ASSERT_EQ(doc["experiments"].size(), 1u);
  const json& e = doc["experiments"][0];
  EXPECT_EQ(e["name"], "alpha");
  EXPECT_EQ(e["uri"], uri_of(root_.path() / "alpha"));
  EXPECT_EQ(e["latest"], "checkpoint_000001");
  EXPECT_EQ(e["best"], json({"checkpoint_000001", "checkpoint_000000"}));
  EXPECT_TRUE(e["config"]["num_to_keep"].is_null());
  EXPECT_EQ(e["config"]["checkpoint_score_order"], "max");
  ASSERT_EQ(e["checkpoints"].size(), 2u);
  const json& c = e["checkpoints"][1];
  EXPECT_EQ(c["name"], "checkpoint_000001");
  EXPECT_EQ(c["index"], 1);
  EXPECT_EQ(c["uri"], uri_of(checkpoint_dir("alpha", 1)));
  EXPECT_EQ(c["state"], "committed");
  EXPECT_TRUE(is_iso_utc(c["time"].get<std::string>())) << c["time"];
  EXPECT_TRUE(c["time_unix"].is_number());
  EXPECT_EQ(c["size_bytes"], kModel.size() + kOptimizer.size());
  EXPECT_EQ(c["file_count"], 2);
  EXPECT_EQ(c["metrics"], json({{"epoch", 1}, {"loss", 0.5}}));
  EXPECT_EQ(c["pinned"], false);
  EXPECT_TRUE(c["error"].is_null());
}

TEST_F(CliTest, LsOfAnExperimentFolderListsItUnderAnEmptyName) {
  make_experiment("alpha", 1);
  ProcessResult r = cairn({"ls", "--json", (root_ / "alpha").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json doc = json::parse(r.out);
  ASSERT_EQ(doc["experiments"].size(), 1u);
  EXPECT_EQ(doc["experiments"][0]["name"], "");
  EXPECT_EQ(doc["experiments"][0]["checkpoints"].size(), 1u);
}

TEST_F(CliTest, LsAcceptsAFileUri) {
  make_experiment("alpha", 1);
  ProcessResult r = cairn({"ls", "--json", uri_of(root_.path())});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["experiments"][0]["name"], "alpha");
}

TEST_F(CliTest, LsShowsTheLeftoverOfAnInterruptedSaveAsUncommitted) {
  make_experiment("alpha", 1);
  make_leftover("alpha", 7);
  ProcessResult r = cairn({"ls", "--json", root()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json doc = json::parse(r.out);
  const json& cps = doc["experiments"][0]["checkpoints"];
  ASSERT_EQ(cps.size(), 2u);
  EXPECT_EQ(cps[1]["name"], "checkpoint_000007");
  EXPECT_EQ(cps[1]["state"], "uncommitted");
  EXPECT_TRUE(cps[1]["metrics"].is_null());
  EXPECT_EQ(cps[1]["size_bytes"], 12);
  EXPECT_EQ(doc["experiments"][0]["latest"], "checkpoint_000000");

  ProcessResult text = cairn({"ls", root()});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("uncommitted"), std::string::npos) << text.out;
}

TEST_F(CliTest, LsMarksTheBestCheckpointWhenAScoreAttributeIsSet) {
  CheckpointConfig config;
  config.checkpoint_score_attribute = "loss";
  config.checkpoint_score_order = "min";
  make_experiment("alpha", 3, config);  // losses 1, 0.5, 0.333: the last is best
  ProcessResult r = cairn({"ls", root()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("checkpoint_000002 *"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("best by loss (min)"), std::string::npos) << r.out;
}

TEST_F(CliTest, LsOfAnEmptyDirectorySaysThereAreNoExperiments) {
  ProcessResult r = cairn({"ls", root()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("no experiments"), std::string::npos) << r.out;
}

TEST_F(CliTest, LsOfARootListsEveryExperimentAndNamesTheOneWhoseHistoryIsDamaged) {
  make_experiment("alpha", 1);
  make_experiment("beta", 2);
  testing::write_text(root_ / "alpha/checkpoint_manager.json", "[1]");
  ProcessResult r = cairn({"ls", "--json", root()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("alpha/checkpoint_manager.json"), std::string::npos) << r.err;
  json doc = json::parse(r.out);
  ASSERT_EQ(doc["experiments"].size(), 2u) << r.out;
  const json& alpha = doc["experiments"][0];
  EXPECT_EQ(alpha["name"], "alpha");
  ASSERT_TRUE(alpha["error"].is_string()) << r.out;
  EXPECT_NE(alpha["error"].get<std::string>().find("checkpoint_manager.json"), std::string::npos);
  ASSERT_EQ(alpha["checkpoints"].size(), 1u) << "listed from its manifest";
  EXPECT_EQ(alpha["checkpoints"][0]["metrics"]["epoch"], 0);
  EXPECT_EQ(alpha["latest"], "checkpoint_000000");
  const json& beta = doc["experiments"][1];
  EXPECT_TRUE(beta["error"].is_null());
  EXPECT_EQ(beta["checkpoints"].size(), 2u);
}

// A history torn by an interrupted write (empty, or not JSON) is no error:
// ls warns and lists the checkpoints from their manifests, verify passes,
// and the next manager open rebuilds it.
TEST_F(CliTest, ATornHistoryIsAWarningNotAnError) {
  make_experiment("alpha", 2);
  for (const char* torn : {"", "{\"format\": \"cairn-man"}) {
    testing::write_text(root_ / "alpha/checkpoint_manager.json", torn);
    ProcessResult r = cairn({"ls", "--json", root()});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("torn"), std::string::npos) << r.err;
    json doc = json::parse(r.out);
    EXPECT_TRUE(doc["experiments"][0]["error"].is_null()) << r.out;
    EXPECT_EQ(doc["experiments"][0]["checkpoints"].size(), 2u) << r.out;
    ProcessResult v = cairn({"verify", root()});
    EXPECT_EQ(v.exit_code, 0) << v.out << v.err;
  }
  CheckpointManager m((root_ / "alpha").string(), {});
  EXPECT_EQ(m.history().size(), 2u);
}

TEST_F(CliTest, LsOfADeeplyNestedManifestNamesItInsteadOfCrashing) {
  make_experiment("alpha", 1);
  fs::path manifest = checkpoint_dir("alpha", 0) / ".cairn/manifest.json";
  std::string deep;
  for (int i = 0; i < 100000; ++i) deep += "[";
  deep += std::string(100000, ']');
  testing::write_text(manifest, "{\"metrics\": {\"x\": " + deep + "}}");
  fs::remove(root_ / "alpha/checkpoint_manager.json");  // make ls read the manifest
  ProcessResult r = cairn({"ls", "--json", root()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json doc = json::parse(r.out);
  const json& row = doc["experiments"][0]["checkpoints"][0];
  ASSERT_TRUE(row["error"].is_string()) << r.out;
  EXPECT_NE(row["error"].get<std::string>().find("nested deeper"), std::string::npos) << r.out;
  ProcessResult v = cairn({"verify", root()});
  EXPECT_EQ(v.exit_code, 1) << "verify does not say OK: " << v.out << v.err;
}

TEST_F(CliTest, GcDryRunCreatesNoLockFileAndChangesNothing) {
  make_experiment("alpha", 1);
  fs::remove(root_ / "alpha/.cairn.lock");
  fs::create_directories(root_ / "alpha/checkpoint_000007/sub");  // a crash's empty folders
  ProcessResult r = cairn({"gc", "--dry-run", "--json", root()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(fs::exists(root_ / "alpha/.cairn.lock"));
  EXPECT_TRUE(fs::exists(root_ / "alpha/checkpoint_000007/sub"));
  json doc = json::parse(r.out);
  ASSERT_EQ(doc["removed"].size(), 1u) << r.out;
  EXPECT_NE(doc["removed"][0].get<std::string>().find("checkpoint_000007/sub"), std::string::npos);
  ProcessResult real = cairn({"gc", root()});
  ASSERT_EQ(real.exit_code, 0) << real.err;
  EXPECT_FALSE(fs::exists(root_ / "alpha/checkpoint_000007"));
}

TEST_F(CliTest, GcDryRunSkipsAnExperimentWithALiveWriter) {
  make_experiment("alpha", 1);
  CheckpointManager live((root_ / "alpha").string(), {});
  ProcessResult r = cairn({"gc", "--dry-run", "--json", root()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json doc = json::parse(r.out);
  ASSERT_EQ(doc["skipped"].size(), 1u) << r.out;
}

TEST_F(CliTest, GcMemoryTierFreesTheTiersOfDeadRunsAndSkipsLiveOnes) {
  TempDir tiers;
  CheckpointConfig config;
  config.memory_tier.enabled = true;
  config.memory_tier.root = tiers.str();
  const fs::path source = root_ / "source";
  testing::write_text(source / "x.bin", "x");
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // a run that dies with its checkpoint in memory
    auto* dead = new CheckpointManager((root_ / "dead").string(), config);
    dead->register_checkpoint({}, Checkpoint::from_directory(source.string()));
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_EQ(status, 0);
  CheckpointManager live((root_ / "live").string(), config);
  live.register_checkpoint({}, Checkpoint::from_directory(source.string()));

  ProcessResult dry = cairn({"gc", "--memory-tier", "--dry-run", "--json", tiers.str()});
  ASSERT_EQ(dry.exit_code, 0) << dry.err;
  json doc = json::parse(dry.out);
  ASSERT_EQ(doc["removed"].size(), 1u) << dry.out;
  EXPECT_NE(doc["removed"][0].get<std::string>().find("dead"), std::string::npos) << dry.out;
  ASSERT_EQ(doc["skipped"].size(), 1u) << dry.out;
  const fs::path base = tiers.path() / fmt::format("cairn-tier-{}", ::getuid());
  EXPECT_EQ(std::distance(fs::directory_iterator(base), {}), 2);

  ProcessResult real = cairn({"gc", "--memory-tier", tiers.str()});
  ASSERT_EQ(real.exit_code, 0) << real.err;
  EXPECT_EQ(std::distance(fs::directory_iterator(base), {}), 1);
  EXPECT_TRUE(live.latest()->checkpoint.verify().empty());

  ProcessResult missing = cairn({"gc", "--memory-tier", (tiers.path() / "nope").string()});
  EXPECT_EQ(missing.exit_code, 3);
  expect_one_line_error(missing, "nope");
  ProcessResult no_path = cairn({"gc"});
  EXPECT_EQ(no_path.exit_code, 2);
  expect_one_line_error(no_path, "PATH is required");
}

TEST_F(CliTest, LsListsWhatOnlyThisHostsMemoryTierHoldsBesideThePersistedCheckpoints) {
  TempDir tiers;
  CheckpointConfig config;
  config.num_to_keep = 5;
  config.checkpoint_score_attribute = "loss";
  config.checkpoint_score_order = "min";
  config.memory_tier.enabled = true;
  config.memory_tier.root = tiers.str();
  config.memory_tier.num_to_keep = 2;
  config.memory_tier.persist_every_n = 2;
  const fs::path source = root_ / "source";
  testing::write_text(source / "x.bin", "x");
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // a run that dies with its newest checkpoints in memory
    auto* dead = new CheckpointManager((root_ / "tiered").string(), config);
    for (double loss : {3.0, 2.0, 1.0}) {
      dead->register_checkpoint({{"loss", loss}}, Checkpoint::from_directory(source.string()));
    }
    dead->wait_for_persistence();
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_EQ(status, 0);
  // Another experiment's tier under the same root is not this one's.
  make_experiment("plain", 1);
  CheckpointManager other((root_ / "other").string(), config);
  other.register_checkpoint({{"loss", 0.5}}, Checkpoint::from_directory(source.string()));

  // Index 0 was neither persisted nor kept in memory (2 kept); 1 was the
  // 2nd save, persisted; 2 is only in memory, and the best.
  ProcessResult r = cairn({"ls", "--json", (root_ / "tiered").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json doc = json::parse(r.out);
  const json& e = doc["experiments"][0];
  ASSERT_EQ(e["checkpoints"].size(), 2u) << r.out;
  EXPECT_EQ(e["checkpoints"][0]["name"], "checkpoint_000001");
  EXPECT_EQ(e["checkpoints"][0]["tiers"], json({"memory", "persistent"})) << r.out;
  EXPECT_EQ(e["checkpoints"][1]["name"], "checkpoint_000002");
  EXPECT_EQ(e["checkpoints"][1]["tiers"], json({"memory"})) << r.out;
  EXPECT_NE(e["checkpoints"][1]["uri"].get<std::string>().find(tiers.str()), std::string::npos);
  EXPECT_EQ(e["checkpoints"][1]["metrics"]["loss"], 1.0);
  EXPECT_EQ(e["latest"], "checkpoint_000002");
  EXPECT_EQ(e["best"][0], "checkpoint_000002");

  ProcessResult text = cairn({"ls", (root_ / "tiered").string()});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("committed,in memory"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("committed,memory only"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("2 checkpoints"), std::string::npos) << text.out;

  // The whole root: every experiment with its own tier's checkpoints (the
  // live run "other" too), or none.
  ProcessResult all = cairn({"ls", "--json", root()});
  ASSERT_EQ(all.exit_code, 0) << all.err;
  const json listed = json::parse(all.out);
  for (const auto& x : listed["experiments"]) {
    for (const auto& c : x["checkpoints"]) {
      const bool memory_only = c["tiers"] == json({"memory"});
      const bool expected = (x["name"] == "tiered" && c["name"] == "checkpoint_000002") ||
                            (x["name"] == "other" && c["name"] == "checkpoint_000000");
      EXPECT_EQ(memory_only, expected) << all.out;
    }
  }
  ProcessResult verify = cairn({"ls", "--check", (root_ / "tiered").string()});
  EXPECT_EQ(verify.exit_code, 0) << verify.err;

  // Once the tier is gone (the host's memory lost), only what was persisted.
  ASSERT_EQ(cairn({"gc", "--memory-tier", tiers.str()}).exit_code, 0);
  ProcessResult after = cairn({"ls", "--json", (root_ / "tiered").string()});
  const json kept = json::parse(after.out)["experiments"][0];
  ASSERT_EQ(kept["checkpoints"].size(), 1u) << after.out;
  EXPECT_EQ(kept["checkpoints"][0]["tiers"], json({"persistent"}));
  EXPECT_EQ(kept["latest"], "checkpoint_000001");
}

TEST_F(CliTest, NamesThatAreNotUtf8ArePrintedEscapedInValidJson) {
  fs::path dir = root_ / "plain";
  testing::write_text(dir / "caf\xe9.bin", "latin-1 name");
  ProcessResult r = cairn({"show", "--json", dir.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json doc = json::parse(r.out);
  ASSERT_EQ(doc["files"].size(), 1u);
  EXPECT_EQ(doc["files"][0]["path"], "caf\\xe9.bin");
  fs::create_directories(root_ / "exp/checkpoint_000000");
  testing::write_text(root_ / "exp/checkpoint_000000/caf\xe9.bin", "leftover");
  ProcessResult gc = cairn({"gc", "--json", root()});
  ASSERT_EQ(gc.exit_code, 0) << gc.err;
  json removed = json::parse(gc.out)["removed"];
  ASSERT_EQ(removed.size(), 1u) << gc.out;
  EXPECT_NE(removed[0].get<std::string>().find("caf\\xe9.bin"), std::string::npos);
  EXPECT_FALSE(fs::exists(root_ / "exp/checkpoint_000000"));
}

// ---- show ---------------------------------------------------------------

TEST_F(CliTest, ShowGivesFilesWithSizesAndChecksumsTheManifestAndMetadata) {
  make_experiment("alpha", 1);
  Checkpoint cp = Checkpoint::from_directory(checkpoint_dir("alpha", 0).string());
  cp.set_metadata({{"note", "first"}});
  Manifest manifest = cp.manifest();

  ProcessResult r = cairn({"show", "--json", checkpoint_dir("alpha", 0).string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json doc = json::parse(r.out);
  EXPECT_EQ(doc["schema_version"], 1);
  EXPECT_EQ(doc["command"], "show");
  EXPECT_EQ(doc["state"], "committed");
  EXPECT_EQ(doc["uri"], uri_of(checkpoint_dir("alpha", 0)));
  ASSERT_EQ(doc["files"].size(), 2u);
  EXPECT_EQ(doc["files"][0]["path"], "model.bin");
  EXPECT_EQ(doc["files"][0]["size_bytes"], kModel.size());
  EXPECT_EQ(doc["files"][0]["xxh3"], hash_to_hex(xxh3_64(kModel)));
  EXPECT_EQ(doc["files"][1]["path"], "nested/optimizer.bin");
  EXPECT_EQ(doc["manifest"]["metrics"], json({{"epoch", 0}, {"loss", 1.0}}));
  EXPECT_EQ(doc["manifest"]["created_at_unix"], manifest.created_at);
  EXPECT_TRUE(is_iso_utc(doc["manifest"]["created_at"].get<std::string>()));
  EXPECT_EQ(doc["manifest"]["total_bytes"], kModel.size() + kOptimizer.size());
  EXPECT_TRUE(doc["manifest"]["layout"].is_null());
  EXPECT_EQ(doc["metadata"], json({{"note", "first"}}));

  ProcessResult text = cairn({"show", checkpoint_dir("alpha", 0).string()});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("nested/optimizer.bin"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find(hash_to_hex(xxh3_64(kOptimizer))), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("\"note\":\"first\""), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("committed"), std::string::npos) << text.out;
}

TEST_F(CliTest, ShowOfALeftoverSaysItIsUncommittedAndHasNoChecksums) {
  make_experiment("alpha", 1);
  fs::path leftover = make_leftover("alpha", 3);
  ProcessResult r = cairn({"show", "--json", leftover.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json doc = json::parse(r.out);
  EXPECT_EQ(doc["state"], "uncommitted");
  EXPECT_TRUE(doc["manifest"].is_null());
  ASSERT_EQ(doc["files"].size(), 1u);
  EXPECT_TRUE(doc["files"][0]["xxh3"].is_null());
}

// A malformed manifest is damage too: show names it and lists what is left.
TEST_F(CliTest, ShowOfAMalformedManifestNamesItAndListsTheFiles) {
  make_experiment("alpha", 1);
  testing::write_text(checkpoint_dir("alpha", 0) / ".cairn/manifest.json", "{\"version\": 1}");
  ProcessResult r = cairn({"show", "--json", checkpoint_dir("alpha", 0).string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json doc = json::parse(r.out);
  EXPECT_EQ(doc["state"], "damaged");
  EXPECT_NE(doc["damage"].get<std::string>().find("manifest.json"), std::string::npos) << r.out;
  EXPECT_EQ(doc["files"].size(), 2u) << r.out;
}

// A manifest cut short after its commit (disk damage: a local commit renames
// the manifest into place, so no interrupted commit leaves one torn) is
// damage: show says so and lists the files that are left, with their sizes,
// so that a person can salvage them.
TEST_F(CliTest, ShowOfADamagedManifestListsTheFilesThatAreLeft) {
  make_experiment("alpha", 1);
  testing::write_text(checkpoint_dir("alpha", 0) / ".cairn/manifest.json", "{\"version\":");
  ProcessResult r = cairn({"show", "--json", checkpoint_dir("alpha", 0).string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json doc = json::parse(r.out);
  EXPECT_EQ(doc["state"], "damaged") << r.out;
  EXPECT_NE(doc["damage"].get<std::string>().find(".cairn/manifest.json"), std::string::npos)
      << r.out;
  std::map<std::string, uint64_t> files;
  for (const json& f : doc["files"]) files[f["path"]] = f["size_bytes"];
  EXPECT_EQ(files["model.bin"], kModel.size()) << r.out;
  EXPECT_EQ(files["nested/optimizer.bin"], kOptimizer.size()) << r.out;
  ProcessResult text = cairn({"show", checkpoint_dir("alpha", 0).string()});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("damaged"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("model.bin"), std::string::npos) << text.out;
}

TEST_F(CliTest, ShowOfAnExperimentIsAUsageErrorPointingToLs) {
  make_experiment("alpha", 1);
  ProcessResult r = cairn({"show", (root_ / "alpha").string()});
  EXPECT_EQ(r.exit_code, 2);
  expect_one_line_error(r, "cairn ls");
}

// ---- verify ---------------------------------------------------------------

TEST_F(CliTest, VerifyPassesWhenEveryChecksumMatches) {
  make_experiment("alpha", 2);
  make_experiment("beta", 1);
  ProcessResult r = cairn({"verify", root()});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("3 checkpoints checked, 0 bad"), std::string::npos) << r.out;

  ProcessResult j = cairn({"verify", "--json", root()});
  EXPECT_EQ(j.exit_code, 0);
  json doc = json::parse(j.out);
  EXPECT_EQ(doc["schema_version"], 1);
  EXPECT_EQ(doc["command"], "verify");
  EXPECT_EQ(doc["ok"], true);
  EXPECT_EQ(doc["checkpoints"].size(), 3u);
  EXPECT_EQ(doc["checkpoints"][0]["file_count"], 2);
  EXPECT_TRUE(doc["problems"].empty());
}

TEST_F(CliTest, VerifyFailsOnAnAlteredFileAndNamesIt) {
  make_experiment("alpha", 2);
  std::string altered = kModel;
  altered[50] = 'X';  // same size, different bytes
  testing::write_text(checkpoint_dir("alpha", 1) / "model.bin", altered);
  ProcessResult r = cairn({"verify", root()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find(uri_of(checkpoint_dir("alpha", 1)) + " model.bin: checksum"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find(uri_of(checkpoint_dir("alpha", 0)) + " model.bin"), std::string::npos)
      << r.out;
}

TEST_F(CliTest, VerifyFailsOnATruncatedFileAndNamesIt) {
  make_experiment("alpha", 1);
  fs::resize_file(checkpoint_dir("alpha", 0) / "nested/optimizer.bin", 3);
  ProcessResult r = cairn({"verify", "--json", root()});
  EXPECT_EQ(r.exit_code, 1);
  json doc = json::parse(r.out);
  EXPECT_EQ(doc["ok"], false);
  ASSERT_EQ(doc["problems"].size(), 1u);
  EXPECT_EQ(doc["problems"][0]["checkpoint"], uri_of(checkpoint_dir("alpha", 0)));
  EXPECT_EQ(doc["problems"][0]["path"], "nested/optimizer.bin");
  EXPECT_NE(doc["problems"][0]["reason"].get<std::string>().find("size 3"), std::string::npos);
  EXPECT_EQ(doc["checkpoints"][0]["ok"], false);
}

TEST_F(CliTest, VerifyFailsOnAMissingFileAndNamesIt) {
  make_experiment("alpha", 1);
  fs::remove(checkpoint_dir("alpha", 0) / "model.bin");
  ProcessResult r = cairn({"verify", (root_ / "alpha").string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find(uri_of(checkpoint_dir("alpha", 0)) + " model.bin: missing"),
            std::string::npos)
      << r.out;
}

// The data-loss case: three committed checkpoints, the newest one's manifest
// damaged after its commit (truncated, emptied, or not JSON). Local files
// never hold a torn manifest from an interrupted commit, so each is damage:
// verify fails naming the manifest, gc removes nothing of it, ls still
// lists it, and the next open falls back to the newest intact checkpoint
// with a warning that names the damaged one.
TEST_F(CliTest, ADamagedManifestOfACommittedCheckpointIsReportedAndNeverRemoved) {
  for (const std::string damage : {"truncated", "empty", "not json"}) {
    SCOPED_TRACE(damage);
    fs::remove_all(root_ / "alpha");
    make_experiment("alpha", 3);
    const fs::path manifest = checkpoint_dir("alpha", 2) / ".cairn/manifest.json";
    const std::string whole = testing::read_text(manifest);
    testing::write_text(manifest, damage == "truncated" ? whole.substr(0, whole.size() / 2)
                                  : damage == "empty"   ? std::string()
                                                        : std::string("\x01\x02 not json"));

    ProcessResult v = cairn({"verify", "--json", root()});
    EXPECT_EQ(v.exit_code, 1) << v.out << v.err;
    json doc = json::parse(v.out);
    EXPECT_EQ(doc["ok"], false);
    ASSERT_EQ(doc["problems"].size(), 1u) << v.out;
    EXPECT_EQ(doc["problems"][0]["checkpoint"], uri_of(checkpoint_dir("alpha", 2)));
    EXPECT_EQ(doc["problems"][0]["path"], ".cairn/manifest.json");
    EXPECT_TRUE(doc["skipped_uncommitted"].empty()) << v.out;

    ProcessResult g = cairn({"gc", root()});
    EXPECT_EQ(g.exit_code, 0) << g.out << g.err;
    EXPECT_TRUE(fs::exists(checkpoint_dir("alpha", 2) / "model.bin")) << g.out;
    EXPECT_TRUE(fs::exists(manifest));

    ProcessResult l = cairn({"ls", "--json", root()});
    ASSERT_EQ(l.exit_code, 0) << l.err;
    EXPECT_NE(l.out.find("checkpoint_000002"), std::string::npos) << l.out;

    std::vector<std::string> warnings;
    ManagerOptions options;
    options.warn = [&](const std::string& w) { warnings.push_back(w); };
    {
      CheckpointManager m((root_ / "alpha").string(), {}, options);
      ASSERT_TRUE(m.latest());
      EXPECT_EQ(m.latest()->name, "checkpoint_000001");
      ASSERT_FALSE(warnings.empty());
      EXPECT_NE(warnings.front().find("checkpoint_000002"), std::string::npos) << warnings.front();
      EXPECT_EQ(
          m.register_checkpoint({}, Checkpoint::from_directory(checkpoint_dir("alpha", 0).string()))
              .index,
          3u)
          << "the damaged checkpoint's index is never reused";
    }
    // A second open (the history no longer lists it) keeps it too, and says so.
    warnings.clear();
    CheckpointManager again((root_ / "alpha").string(), {}, options);
    EXPECT_EQ(again.latest()->name, "checkpoint_000003");
    EXPECT_TRUE(fs::exists(checkpoint_dir("alpha", 2) / "model.bin"));
    ASSERT_FALSE(warnings.empty());
    EXPECT_NE(warnings.front().find("checkpoint_000002 is damaged"), std::string::npos)
        << warnings.front();
    ProcessResult v2 = cairn({"verify", root()});
    EXPECT_EQ(v2.exit_code, 1) << v2.out;
    EXPECT_NE(v2.out.find(uri_of(checkpoint_dir("alpha", 2))), std::string::npos) << v2.out;
  }
}

TEST_F(CliTest, VerifyFailsOnAMalformedManifestAndNamesIt) {
  make_experiment("alpha", 2);
  testing::write_text(checkpoint_dir("alpha", 0) / ".cairn/manifest.json", "[1, 2]");
  ProcessResult r = cairn({"verify", "--json", root()});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  json doc = json::parse(r.out);
  ASSERT_EQ(doc["problems"].size(), 1u);
  EXPECT_EQ(doc["problems"][0]["checkpoint"], uri_of(checkpoint_dir("alpha", 0)));
  EXPECT_EQ(doc["problems"][0]["path"], ".cairn/manifest.json");
  // The other checkpoint is still checked.
  ASSERT_EQ(doc["checkpoints"].size(), 2u);
  EXPECT_EQ(doc["checkpoints"][1]["ok"], true);
}

TEST_F(CliTest, VerifyReportsADamagedHistoryAndStillChecksTheCheckpoints) {
  make_experiment("alpha", 1);
  testing::write_text(root_ / "alpha/checkpoint_manager.json", R"({"format": 7})");
  ProcessResult r = cairn({"verify", "--json", root()});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  json doc = json::parse(r.out);
  ASSERT_EQ(doc["problems"].size(), 1u);
  EXPECT_EQ(doc["problems"][0]["path"], "checkpoint_manager.json");
  EXPECT_EQ(doc["checkpoints"].size(), 1u);
}

TEST_F(CliTest, VerifyOfOneCheckpointChecksOnlyThatOne) {
  make_experiment("alpha", 2);
  fs::remove(checkpoint_dir("alpha", 0) / "model.bin");
  ProcessResult good = cairn({"verify", checkpoint_dir("alpha", 1).string()});
  EXPECT_EQ(good.exit_code, 0) << good.out;
  EXPECT_NE(good.out.find("1 checkpoint checked"), std::string::npos) << good.out;
  ProcessResult bad = cairn({"verify", checkpoint_dir("alpha", 0).string()});
  EXPECT_EQ(bad.exit_code, 1) << bad.out;
}

TEST_F(CliTest, VerifyDoesNotFailOnALeftoverButListsItAsNotVerified) {
  make_experiment("alpha", 1);
  fs::path leftover = make_leftover("alpha", 4);
  ProcessResult r = cairn({"verify", "--json", root()});
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(json::parse(r.out)["skipped_uncommitted"], json::array({uri_of(leftover)}));
}

// ---- gc -----------------------------------------------------------------

TEST_F(CliTest, GcRemovesTheLeftoverOfAnInterruptedSaveAndReportsIt) {
  make_experiment("alpha", 2);
  fs::path leftover = make_leftover("alpha", 9);
  ProcessResult r = cairn({"gc", root()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("removed " + uri_of(leftover / "model.bin")), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(leftover / "model.bin"));
  // Committed checkpoints are untouched.
  EXPECT_EQ(cairn({"verify", root()}).exit_code, 0);
  EXPECT_TRUE(Checkpoint::from_directory(checkpoint_dir("alpha", 1).string()).verify().empty());
}

TEST_F(CliTest, GcJsonListsWhatWasRemoved) {
  make_experiment("alpha", 1);
  fs::path leftover = make_leftover("alpha", 2);
  ProcessResult r = cairn({"gc", "--json", root()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json doc = json::parse(r.out);
  EXPECT_EQ(doc["schema_version"], 1);
  EXPECT_EQ(doc["command"], "gc");
  EXPECT_EQ(doc["dry_run"], false);
  EXPECT_EQ(doc["removed"], json::array({uri_of(leftover / "model.bin")}));
  EXPECT_TRUE(doc["skipped"].empty());
}

TEST_F(CliTest, GcDryRunReportsTheLeftoverButKeepsIt) {
  make_experiment("alpha", 1);
  fs::path leftover = make_leftover("alpha", 2);
  ProcessResult r = cairn({"gc", "--dry-run", "--json", root()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json doc = json::parse(r.out);
  EXPECT_EQ(doc["dry_run"], true);
  EXPECT_EQ(doc["removed"], json::array({uri_of(leftover / "model.bin")}));
  EXPECT_TRUE(fs::exists(leftover / "model.bin"));
}

TEST_F(CliTest, GcSkipsAnExperimentWhoseLockALiveWriterHolds) {
  make_experiment("alpha", 1);
  make_experiment("beta", 1);
  CheckpointManager writer((root_ / "alpha").string(), {});  // holds alpha's lock
  fs::path busy = make_leftover("alpha", 5);  // looks like a leftover: an in-flight save
  fs::path stale = make_leftover("beta", 5);
  ProcessResult r = cairn({"gc", "--json", root()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json doc = json::parse(r.out);
  ASSERT_EQ(doc["skipped"].size(), 1u);
  EXPECT_NE(doc["skipped"][0].get<std::string>().find(uri_of(root_.path() / "alpha")),
            std::string::npos);
  EXPECT_TRUE(fs::exists(busy / "model.bin"));
  EXPECT_FALSE(fs::exists(stale / "model.bin"));
}

// ---- errors and help ------------------------------------------------------

TEST_F(CliTest, AMissingPathIsNotFoundWithAOneLineErrorForEveryCommand) {
  const std::string missing = (root_ / "no-such-dir").string();
  for (std::string command : {"ls", "show", "verify", "gc"}) {
    SCOPED_TRACE(command);
    ProcessResult r = cairn({command, missing});
    EXPECT_EQ(r.exit_code, 3);
    expect_one_line_error(r, missing);
    EXPECT_FALSE(fs::exists(missing));  // nothing was created
  }
}

TEST_F(CliTest, AMemoryUriIsNotFoundInAnotherProcess) {
  ProcessResult r = cairn({"ls", "memory://elsewhere/experiments"});
  EXPECT_EQ(r.exit_code, 3);
  expect_one_line_error(r, "memory://elsewhere/experiments");
}

TEST_F(CliTest, AnUnknownSchemeIsAUsageError) {
  ProcessResult r = cairn({"ls", "ftp://host/x"});
  EXPECT_EQ(r.exit_code, 2);
  expect_one_line_error(r, "ftp");
}

TEST_F(CliTest, BadCommandLinesAreUsageErrorsOnOneLine) {
  ProcessResult none = cairn({});
  EXPECT_EQ(none.exit_code, 2);
  expect_one_line_error(none, "subcommand");

  ProcessResult unknown = cairn({"frobnicate", root()});
  EXPECT_EQ(unknown.exit_code, 2);
  expect_one_line_error(unknown, "frobnicate");

  ProcessResult no_path = cairn({"verify"});
  EXPECT_EQ(no_path.exit_code, 2);
  expect_one_line_error(no_path, "PATH");

  ProcessResult bad_flag = cairn({"ls", "--frob", root()});
  EXPECT_EQ(bad_flag.exit_code, 2);
  expect_one_line_error(bad_flag, "--frob");
}

TEST_F(CliTest, HelpOfEveryCommandDescribesItAndExitsZero) {
  ProcessResult top = cairn({"--help"});
  EXPECT_EQ(top.exit_code, 0);
  for (std::string command : {"ls", "show", "verify", "gc", "cp"}) {
    SCOPED_TRACE(command);
    EXPECT_NE(top.out.find(command), std::string::npos) << top.out;
    ProcessResult r = cairn({command, "--help"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("Usage: cairn " + command), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("Exit codes"), std::string::npos) << r.out;
  }
  EXPECT_NE(cairn({"gc", "--help"}).out.find("--dry-run"), std::string::npos);
  EXPECT_NE(cairn({"ls", "--help"}).out.find("--json"), std::string::npos);
}

// ---- cp -------------------------------------------------------------------

TEST_F(CliTest, CpCopiesAnExperimentAndPrintsOneJsonResult) {
  make_experiment("exp", 3);
  make_leftover("exp", 3);
  const std::string dst = (root_ / "copies/exp").string();
  ProcessResult r =
      cairn({"cp", "--json", "--no-progress", "--jobs", "3", (root_ / "exp").string(), dst});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(r.err.empty()) << r.err;
  json j = json::parse(r.out);
  EXPECT_EQ(j["schema_version"], 1);
  EXPECT_EQ(j["command"], "cp");
  EXPECT_EQ(j["kind"], "experiment");
  EXPECT_EQ(j["destination"], uri_of(dst));
  EXPECT_EQ(j["files_copied"], 6);
  EXPECT_EQ(j["bytes_copied"], 3 * (kModel.size() + kOptimizer.size()));
  EXPECT_EQ(j["files_skipped"], 0);
  EXPECT_EQ(j["checkpoints_copied"].size(), 3u);
  ASSERT_EQ(j["uncommitted_skipped"].size(), 1u);
  EXPECT_EQ(j["uncommitted_skipped"][0], uri_of(checkpoint_dir("exp", 3)));
  EXPECT_TRUE(j["seconds"].is_number());
  EXPECT_FALSE(fs::exists(fs::path(dst) / checkpoint_name(3)));
  EXPECT_EQ(cairn({"verify", dst}).exit_code, 0);
  // The source's snapshot with its log folded in.
  auto src_storage = open_storage((root_ / "exp").string());
  EXPECT_EQ(testing::read_text(fs::path(dst) / "checkpoint_manager.json"),
            history::read_folded(*src_storage, [](const std::string&) {}).value());

  ProcessResult again = cairn({"cp", "--json", "--no-progress", (root_ / "exp").string(), dst});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  json k = json::parse(again.out);
  EXPECT_EQ(k["files_copied"], 0);
  EXPECT_EQ(k["files_skipped"], 6);
  EXPECT_EQ(k["checkpoints_unchanged"].size(), 3u);
}

TEST_F(CliTest, CpVerifiesBySizeOrChecksumAsAskedAndRefusesOtherModes) {
  make_experiment("exp", 1);
  for (const char* mode : {"size", "checksum", "auto"}) {
    const std::string dst = (root_ / "copies" / mode).string();
    ProcessResult r =
        cairn({"cp", "--no-progress", "--verify", mode, checkpoint_dir("exp", 0).string(), dst});
    ASSERT_EQ(r.exit_code, 0) << mode << ": " << r.err;
    EXPECT_EQ(cairn({"verify", dst}).exit_code, 0) << mode;
  }
  ProcessResult bad = cairn({"cp", "--verify", "sometimes", checkpoint_dir("exp", 0).string(),
                             (root_ / "copies/bad").string()});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--verify"), std::string::npos) << bad.err;
  EXPECT_FALSE(fs::exists(root_ / "copies/bad"));
}

TEST_F(CliTest, ABadOptionValueIsNamedWithTheValuesAccepted) {
  make_experiment("exp", 1);
  const std::string src = checkpoint_dir("exp", 0).string();
  const std::string dst = (root_ / "copies/bad").string();
  ProcessResult verify = cairn({"cp", "--verify", "bogus", src, dst});
  EXPECT_EQ(verify.exit_code, 2);
  expect_one_line_error(verify,
                        "--verify: \"bogus\" is not accepted; use one of: auto, checksum, size");
  for (const std::string jobs : {"0", "many", "2000", "3x"}) {
    SCOPED_TRACE(jobs);
    ProcessResult r = cairn({"cp", "--jobs", jobs, src, dst});
    EXPECT_EQ(r.exit_code, 2);
    expect_one_line_error(
        r, "--jobs: \"" + jobs + "\" is not accepted; use a whole number from 1 to 1024");
  }
  // Nothing of CLI11's own wording.
  for (const auto& r : {verify, cairn({"cp", "--jobs", "0", src, dst})}) {
    EXPECT_EQ(r.err.find("Check "), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("FAILED"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("->"), std::string::npos) << r.err;
  }
  EXPECT_FALSE(fs::exists(dst));
}

TEST_F(CliTest, CpReportsProgressAsLinesWhenStderrIsNotATerminal) {
  make_experiment("exp", 1);
  const std::string dst = (root_ / "one").string();
  ProcessResult r = cairn({"cp", checkpoint_dir("exp", 0).string(), dst});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << r.err;  // no bar outside a terminal
  EXPECT_EQ(r.err.find("\x1b"), std::string::npos) << r.err;
  std::vector<std::string> lines;
  for (size_t at = 0; at < r.err.size();) {
    size_t end = r.err.find('\n', at);
    ASSERT_NE(end, std::string::npos) << r.err;
    lines.push_back(r.err.substr(at, end - at));
    at = end + 1;
  }
  for (const auto& line : lines) EXPECT_EQ(line.rfind("cp: ", 0), 0u) << line;
  EXPECT_EQ(lines.back().rfind("cp: 100% ", 0), 0u) << lines.back();
  EXPECT_NE(lines.back().find("2/2 files"), std::string::npos) << lines.back();
  EXPECT_NE(r.out.find("cp: copied 2 files"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(uri_of(dst)), std::string::npos) << r.out;
  EXPECT_EQ(cairn({"verify", dst}).exit_code, 0);

  ProcessResult quiet = cairn({"cp", "--no-progress", checkpoint_dir("exp", 0).string(), dst});
  ASSERT_EQ(quiet.exit_code, 0) << quiet.err;
  EXPECT_TRUE(quiet.err.empty()) << quiet.err;
  EXPECT_NE(quiet.out.find("skipped 2 files"), std::string::npos) << quiet.out;
}

TEST_F(CliTest, CpRefusesUncommittedSourcesAndCommittedDestinationsOnOneLine) {
  make_experiment("exp", 2);
  const fs::path leftover = make_leftover("exp", 2);
  ProcessResult uncommitted =
      cairn({"cp", "--no-progress", leftover.string(), (root_ / "dst").string()});
  EXPECT_EQ(uncommitted.exit_code, 5);
  expect_one_line_error(uncommitted, leftover.string());
  EXPECT_FALSE(fs::exists(root_ / "dst"));

  const std::string other = checkpoint_dir("exp", 1).string();
  const std::string manifest_before =
      testing::read_text(checkpoint_dir("exp", 1) / ".cairn/manifest.json");
  ProcessResult taken = cairn({"cp", "--no-progress", checkpoint_dir("exp", 0).string(), other});
  EXPECT_EQ(taken.exit_code, 6);
  expect_one_line_error(taken, other);
  EXPECT_EQ(testing::read_text(checkpoint_dir("exp", 1) / ".cairn/manifest.json"), manifest_before);

  ProcessResult missing = cairn({"cp", (root_ / "nope").string(), (root_ / "dst").string()});
  EXPECT_EQ(missing.exit_code, 3);
  expect_one_line_error(missing, (root_ / "nope").string());

  ProcessResult bad_jobs = cairn({"cp", "--jobs", "0", other, (root_ / "dst").string()});
  EXPECT_EQ(bad_jobs.exit_code, 2);
  expect_one_line_error(bad_jobs, "--jobs");
}

TEST_F(CliTest, CpIntoAFolderHoldingAnotherExperimentIsTheAlreadyExistsCode) {
  make_experiment("a", 2);
  make_experiment("b", 1);
  ProcessResult r = cairn({"cp", "--no-progress", (root_ / "a").string(), (root_ / "b").string()});
  EXPECT_EQ(r.exit_code, 6);
  expect_one_line_error(r, (root_ / "b").string());
  ProcessResult one =
      cairn({"cp", "--no-progress", checkpoint_dir("a", 1).string(), (root_ / "b").string()});
  EXPECT_EQ(one.exit_code, 6);
  expect_one_line_error(one, (root_ / "b").string());
  EXPECT_EQ(cairn({"verify", (root_ / "b").string()}).exit_code, 0);
}

TEST_F(CliTest, CpToAnUnwritableDestinationNamesTheDestinationAsGiven) {
  make_experiment("exp", 1);
  // Not even root may create a folder in /proc.
  for (const std::string dst : {"/proc/forbidden", "/proc/forbidden/copy"}) {
    SCOPED_TRACE(dst);
    ProcessResult r = cairn({"cp", "--no-progress", checkpoint_dir("exp", 0).string(), dst});
    EXPECT_NE(r.exit_code, 0);
    expect_one_line_error(r, dst);
  }
}

}  // namespace
}  // namespace cairn
