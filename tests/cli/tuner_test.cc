// `cairn ls` and `cairn show` of a Tuner experiment, run as a subprocess
// against a fixture written by hand: tuner_state.json as the Tuner saves it,
// and trial folders holding real checkpoints, params.json and result.json.
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cairn/checkpoint.h"
#include "cairn/manager.h"
#include "cli/subprocess.h"
#include "support/temp_dir.h"

namespace cairn {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::ProcessResult;
using testing::TempDir;

class TunerCliTest : public ::testing::Test {
 protected:
  ProcessResult cairn(const std::vector<std::string>& args) {
    return testing::run_process(CAIRN_CLI_PATH, args);
  }

  // `count` checkpoints in the experiment (or trial) folder `dir`, with
  // metrics {"training_iteration": i + 1, "loss": 1 / (i + 1)}.
  static void write_checkpoints(const fs::path& dir, int count) {
    CheckpointManager manager(dir.string(), CheckpointConfig{});
    for (int i = 0; i < count; ++i) {
      TempDir scratch;
      testing::write_text(scratch / "model.bin", std::string(100, 'w'));
      manager.register_checkpoint({{"training_iteration", i + 1}, {"loss", 1.0 / (i + 1)}},
                                  Checkpoint::from_directory(scratch.str()));
    }
  }

  static json trial(const std::string& id, const std::string& status, json config, json last_result,
                    json error = nullptr) {
    return {{"trial_id", id},
            {"dir", id},
            {"status", status},
            {"config", std::move(config)},
            {"last_result", std::move(last_result)},
            {"num_failures", error.is_null() ? 0 : 1},
            {"error", std::move(error)},
            {"latest_checkpoint", nullptr}};
  }

  // <root>/tune: trial_00000 TERMINATED (2 checkpoints, 3 results),
  // trial_00001 ERROR (1 checkpoint), trial_00002 PENDING whose folder does
  // not exist, and trial_00003, a folder the (stale) state does not list.
  void make_tuner() {
    const fs::path exp = tune();
    json state = {
        {"format", "cairn-tuner-state"},
        {"version", 1},
        {"name", "tune"},
        {"updated_at", 1714564803.5},
        {"metric", "loss"},
        {"mode", "min"},
        {"searcher", {{"kind", "basic_variant"}, {"seed", 7}}},  // ignored by the CLI
        {"trials",
         {trial("trial_00000", "TERMINATED", {{"lr", 0.1}},
                {{"training_iteration", 3}, {"loss", 0.25}}),
          trial("trial_00001", "ERROR", {{"lr", 10.0}}, {{"training_iteration", 1}, {"loss", 9.5}},
                "ValueError: lr too large\nTraceback (most recent call last):\n  ..."),
          trial("trial_00002", "PENDING", {{"lr", 0.01}}, nullptr)}},
    };
    testing::write_text(exp / "tuner_state.json", state.dump());

    write_checkpoints(exp / "trial_00000", 2);
    testing::write_text(exp / "trial_00000/params.json", R"({"lr": 0.1})");
    testing::write_text(exp / "trial_00000/result.json",
                        "{\"training_iteration\":1,\"loss\":1.0}\n"
                        "{\"training_iteration\":2,\"loss\":0.5}\n"
                        "{\"training_iteration\":3,\"loss\":0.25}\n");
    write_checkpoints(exp / "trial_00001", 1);
    testing::write_text(exp / "trial_00001/params.json", R"({"lr": 10.0})");
    write_checkpoints(exp / "trial_00003", 1);
    testing::write_text(exp / "trial_00003/params.json", R"({"lr": 0.4})");
  }

  fs::path tune() const { return root_.path() / "tune"; }
  std::string uri_of(const fs::path& p) const { return "file://" + p.string(); }

  TempDir root_;
};

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST_F(TunerCliTest, LsOfATunerExperimentNestsTrialsAndTheirCheckpoints) {
  make_tuner();
  ProcessResult r = cairn({"ls", tune().string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("experiment " + uri_of(tune()) +
                       "  (tuner, 4 trials: 1 PENDING, 1 TERMINATED, 1 ERROR, 1 UNKNOWN; metric "
                       "loss (min))\n"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("\n  trial trial_00000  TERMINATED  training_iteration=3 loss=0.25  (2 "
                       "checkpoints, keep all)\n"
                       "    CHECKPOINT         STATE      TIME (UTC)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("\n    checkpoint_000001  committed  "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("loss=0.5 training_iteration=2\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\n  trial trial_00001  ERROR  training_iteration=1 loss=9.5  (1 "
                       "checkpoint, keep all)\n"
                       "    error: ValueError: lr too large\n"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("Traceback"), std::string::npos) << "only the error's first line";
  EXPECT_NE(r.out.find("\n  trial trial_00002  PENDING  (folder missing)\n"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("\n  trial trial_00003  UNKNOWN  (1 checkpoint, keep all)\n"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(count_of(r.out, "experiment "), 1u) << "trials are not experiments of their own";
  EXPECT_TRUE(r.err.empty()) << r.err;
}

TEST_F(TunerCliTest, LsJsonOfATunerExperimentNestsTrialsWithTheirCheckpoints) {
  make_tuner();
  ProcessResult r = cairn({"ls", "--json", tune().string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json doc = json::parse(r.out);
  EXPECT_EQ(doc["schema_version"], 1);
  EXPECT_EQ(doc["command"], "ls");
  ASSERT_EQ(doc["experiments"].size(), 1u);
  const json& e = doc["experiments"][0];
  EXPECT_EQ(e["kind"], "tuner");
  EXPECT_EQ(e["name"], "");
  EXPECT_EQ(e["uri"], uri_of(tune()));
  EXPECT_EQ(e["metric"], "loss");
  EXPECT_EQ(e["mode"], "min");
  EXPECT_EQ(e["updated_at"], "2024-05-01T12:00:03Z");
  EXPECT_EQ(e["updated_at_unix"], 1714564803.5);
  EXPECT_EQ(e["status_counts"],
            json({{"PENDING", 1}, {"TERMINATED", 1}, {"ERROR", 1}, {"UNKNOWN", 1}}));
  EXPECT_TRUE(e["error"].is_null());
  ASSERT_EQ(e["trials"].size(), 4u);

  const json& t0 = e["trials"][0];
  EXPECT_EQ(t0["trial_id"], "trial_00000");
  EXPECT_EQ(t0["dir"], "trial_00000");
  EXPECT_EQ(t0["uri"], uri_of(tune() / "trial_00000"));
  EXPECT_EQ(t0["status"], "TERMINATED");
  EXPECT_EQ(t0["in_state"], true);
  EXPECT_EQ(t0["folder_missing"], false);
  EXPECT_EQ(t0["config"], json({{"lr", 0.1}}));
  EXPECT_EQ(t0["last_result"], json({{"training_iteration", 3}, {"loss", 0.25}}));
  EXPECT_EQ(t0["num_failures"], 0);
  EXPECT_TRUE(t0["error"].is_null());
  EXPECT_EQ(t0["latest"], "checkpoint_000001");
  EXPECT_EQ(t0["checkpoint_config"]["checkpoint_score_order"], "max");
  EXPECT_TRUE(t0["folder_error"].is_null());
  ASSERT_EQ(t0["checkpoints"].size(), 2u);
  // The same objects as a Trainer experiment's checkpoints.
  const json& c = t0["checkpoints"][1];
  EXPECT_EQ(c["name"], "checkpoint_000001");
  EXPECT_EQ(c["index"], 1);
  EXPECT_EQ(c["uri"], uri_of(tune() / "trial_00000/checkpoint_000001"));
  EXPECT_EQ(c["state"], "committed");
  EXPECT_EQ(c["size_bytes"], 100);
  EXPECT_EQ(c["file_count"], 1);
  EXPECT_EQ(c["metrics"], json({{"training_iteration", 2}, {"loss", 0.5}}));
  EXPECT_EQ(c["pinned"], false);
  EXPECT_TRUE(c["error"].is_null());

  const json& t1 = e["trials"][1];
  EXPECT_EQ(t1["status"], "ERROR");
  EXPECT_EQ(t1["num_failures"], 1);
  EXPECT_EQ(t1["error"].get<std::string>().rfind("ValueError: lr too large\nTraceback", 0), 0u);
  EXPECT_EQ(t1["checkpoints"].size(), 1u);

  const json& t3 = e["trials"][3];
  EXPECT_EQ(t3["trial_id"], "trial_00003");
  EXPECT_EQ(t3["status"], "UNKNOWN");
  EXPECT_EQ(t3["in_state"], false);
  EXPECT_EQ(t3["config"], json({{"lr", 0.4}})) << "from params.json";
  EXPECT_TRUE(t3["last_result"].is_null());
  EXPECT_EQ(t3["checkpoints"].size(), 1u);
}

TEST_F(TunerCliTest, ATrialWhoseFolderIsMissingIsListedAsSuchNotACrash) {
  make_tuner();
  ProcessResult r = cairn({"ls", "--json", tune().string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json t2 = json::parse(r.out)["experiments"][0]["trials"][2];
  EXPECT_EQ(t2["trial_id"], "trial_00002");
  EXPECT_EQ(t2["status"], "PENDING");
  EXPECT_EQ(t2["folder_missing"], true);
  EXPECT_EQ(t2["uri"], uri_of(tune() / "trial_00002"));
  EXPECT_EQ(t2["config"], json({{"lr", 0.01}}));
  EXPECT_TRUE(t2["checkpoints"].empty());
  EXPECT_TRUE(t2["latest"].is_null());
  // Showing it is "not found", as for any path that does not exist.
  ProcessResult show = cairn({"show", (tune() / "trial_00002").string()});
  EXPECT_EQ(show.exit_code, 3) << show.out << show.err;
}

TEST_F(TunerCliTest, LsOfAStorageRootListsATunerExperimentOnceWithItsTrialsNested) {
  make_tuner();
  write_checkpoints(root_.path() / "alpha", 1);
  write_checkpoints(root_.path() / "zeta", 1);
  ProcessResult r = cairn({"ls", "--json", root_.str()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json doc = json::parse(r.out);
  ASSERT_EQ(doc["experiments"].size(), 3u) << r.out;
  EXPECT_EQ(doc["experiments"][0]["name"], "alpha");
  EXPECT_EQ(doc["experiments"][0]["kind"], "trainer");
  EXPECT_EQ(doc["experiments"][1]["name"], "tune");
  EXPECT_EQ(doc["experiments"][1]["kind"], "tuner");
  EXPECT_EQ(doc["experiments"][1]["uri"], uri_of(tune()));
  EXPECT_EQ(doc["experiments"][1]["trials"].size(), 4u);
  EXPECT_EQ(doc["experiments"][2]["name"], "zeta");

  ProcessResult text = cairn({"ls", root_.str()});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("experiment tune  (tuner, 4 trials"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("\n  " + uri_of(tune()) + "\n"), std::string::npos) << text.out;
  EXPECT_EQ(count_of(text.out, "experiment "), 3u) << text.out;
  EXPECT_EQ(count_of(text.out, "trial trial_00000"), 1u) << text.out;
}

TEST_F(TunerCliTest, ShowOfATrialGivesItsStatusConfigResultsAndCheckpoints) {
  make_tuner();
  const fs::path dir = tune() / "trial_00000";
  ProcessResult r = cairn({"show", "--json", dir.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json doc = json::parse(r.out);
  EXPECT_EQ(doc["schema_version"], 1);
  EXPECT_EQ(doc["command"], "show");
  EXPECT_EQ(doc["kind"], "trial");
  EXPECT_EQ(doc["uri"], uri_of(dir));
  EXPECT_EQ(doc["experiment_uri"], uri_of(tune()));
  EXPECT_EQ(doc["state_updated_at_unix"], 1714564803.5);
  EXPECT_EQ(doc["metric"], "loss");
  EXPECT_EQ(doc["trial_id"], "trial_00000");
  EXPECT_EQ(doc["status"], "TERMINATED");
  EXPECT_EQ(doc["in_state"], true);
  EXPECT_EQ(doc["config"], json({{"lr", 0.1}}));
  EXPECT_EQ(doc["last_result"], json({{"training_iteration", 3}, {"loss", 0.25}}));
  EXPECT_EQ(doc["result_count"], 3);
  EXPECT_EQ(doc["num_failures"], 0);
  EXPECT_EQ(doc["latest"], "checkpoint_000001");
  ASSERT_EQ(doc["checkpoints"].size(), 2u);
  EXPECT_EQ(doc["checkpoints"][0]["metrics"], json({{"training_iteration", 1}, {"loss", 1.0}}));

  ProcessResult text = cairn({"show", dir.string()});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_EQ(text.out.rfind("trial        trial_00000\n", 0), 0u) << text.out;
  EXPECT_NE(text.out.find("\nstatus       TERMINATED\n"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("\nconfig       {\"lr\":0.1}\n"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("\nlast result  loss=0.25 training_iteration=3\n"), std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("\nresults      3\n"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("\nlatest       checkpoint_000001\n"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("\nCHECKPOINT         STATE"), std::string::npos) << text.out;
}

TEST_F(TunerCliTest, ShowOfATrialTheStateDoesNotListYetUsesItsParamsAndResults) {
  make_tuner();
  testing::write_text(tune() / "trial_00003/result.json",
                      "{\"training_iteration\":1,\"loss\":0.7}\n{\"training_iteration\":2,");
  ProcessResult r = cairn({"show", "--json", (tune() / "trial_00003").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json doc = json::parse(r.out);
  EXPECT_EQ(doc["kind"], "trial");
  EXPECT_EQ(doc["status"], "UNKNOWN");
  EXPECT_EQ(doc["in_state"], false);
  EXPECT_EQ(doc["config"], json({{"lr", 0.4}}));
  EXPECT_EQ(doc["result_count"], 1) << "the torn last line is not a result";
  EXPECT_EQ(doc["last_result"], json({{"training_iteration", 1}, {"loss", 0.7}}));
}

TEST_F(TunerCliTest, ShowOfACheckpointInATrialStillShowsTheCheckpoint) {
  make_tuner();
  ProcessResult r = cairn({"show", "--json", (tune() / "trial_00000/checkpoint_000000").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json doc = json::parse(r.out);
  EXPECT_EQ(doc["kind"], "checkpoint");
  EXPECT_EQ(doc["state"], "committed");
  EXPECT_EQ(doc["files"].size(), 1u);
}

TEST_F(TunerCliTest, ADamagedTunerStateIsACorruptionErrorNamingTheFile) {
  make_tuner();
  testing::write_text(tune() / "tuner_state.json", "{\"format\": \"cairn-tuner-state\", \"ver");
  for (const fs::path& path : {tune(), tune() / "trial_00000"}) {
    for (bool json : {false, true}) {
      std::vector<std::string> args = {path == tune() ? "ls" : "show"};
      if (json) args.push_back("--json");
      args.push_back(path.string());
      SCOPED_TRACE(args[0] + (json ? " --json" : ""));
      ProcessResult r = cairn(args);
      EXPECT_EQ(r.exit_code, 4) << r.out << r.err;
      EXPECT_TRUE(r.out.empty()) << r.out;
      EXPECT_EQ(r.err.rfind("cairn: error: ", 0), 0u) << r.err;
      EXPECT_NE(r.err.find(uri_of(tune() / "tuner_state.json")), std::string::npos) << r.err;
    }
  }
}

TEST_F(TunerCliTest, ATunerStateOfTheWrongShapeIsACorruptionError) {
  make_tuner();
  for (const std::string& text :
       {std::string(R"({"format": "something-else", "version": 1, "trials": []})"),
        std::string(R"({"format": "cairn-tuner-state", "version": 2, "trials": []})"),
        std::string(R"({"format": "cairn-tuner-state", "version": 1, "trials": {}})"),
        std::string(R"({"format": "cairn-tuner-state", "version": 1,
                        "trials": [{"trial_id": "t", "dir": "../elsewhere"}]})"),
        std::string(R"({"format": "cairn-tuner-state", "version": 1,
                        "trials": [{"trial_id": "t", "num_failures": "two"}]})")}) {
    SCOPED_TRACE(text);
    testing::write_text(tune() / "tuner_state.json", text);
    ProcessResult r = cairn({"ls", tune().string()});
    EXPECT_EQ(r.exit_code, 4) << r.out << r.err;
    EXPECT_NE(r.err.find("tuner_state.json"), std::string::npos) << r.err;
  }
}

TEST_F(TunerCliTest, ADamagedTunerStateUnderARootDoesNotHideTheOtherExperiments) {
  make_tuner();
  write_checkpoints(root_.path() / "alpha", 1);
  testing::write_text(tune() / "tuner_state.json", "not json");
  ProcessResult r = cairn({"ls", "--json", root_.str()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("cairn: warning: " + uri_of(tune() / "tuner_state.json")), std::string::npos)
      << r.err;
  json doc = json::parse(r.out);
  ASSERT_EQ(doc["experiments"].size(), 2u) << r.out;
  const json& e = doc["experiments"][1];
  EXPECT_EQ(e["kind"], "tuner");
  ASSERT_TRUE(e["error"].is_string());
  // Its trial folders are still listed, from the folders themselves.
  ASSERT_EQ(e["trials"].size(), 3u) << r.out;
  for (const auto& t : e["trials"]) EXPECT_EQ(t["status"], "UNKNOWN");
  EXPECT_EQ(e["trials"][0]["config"], json({{"lr", 0.1}}));
  EXPECT_EQ(e["trials"][0]["checkpoints"].size(), 2u);
}

}  // namespace
}  // namespace cairn
