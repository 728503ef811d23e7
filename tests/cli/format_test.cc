// The CLI's pure parts: size, time and metrics formatting, tables, the JSON
// documents and the exit-code mapping, without storage.
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cairn/error.h"
#include "cli/exit_codes.h"
#include "cli/format.h"
#include "cli/views.h"
#include "experiment/tuner_state.h"

namespace cairn::cli {
namespace {

using experiment::parse_tuner_state;
using experiment::TunerState;
using experiment::TunerTrialState;
using nlohmann::json;

TEST(FormatSize, BytesBelowOneKibibyteAreExact) {
  EXPECT_EQ(format_size(0), "0 B");
  EXPECT_EQ(format_size(1023), "1023 B");
}

TEST(FormatSize, LargerSizesUseBinaryUnitsWithOneDecimal) {
  EXPECT_EQ(format_size(1024), "1.0 KiB");
  EXPECT_EQ(format_size(1536), "1.5 KiB");
  EXPECT_EQ(format_size(5ull << 20), "5.0 MiB");
  EXPECT_EQ(format_size(3ull << 30), "3.0 GiB");
  // Just under a unit rounds up into that unit rather than reading "1024.0 KiB".
  EXPECT_EQ(format_size((1ull << 20) - 1), "1.0 MiB");
  EXPECT_EQ(format_size(UINT64_MAX), "16.0 EiB");
}

TEST(FormatTime, IsIso8601InUtcWithSeconds) {
  EXPECT_EQ(format_time_utc(0), "1970-01-01T00:00:00Z");
  EXPECT_EQ(format_time_utc(1700000000.0), "2023-11-14T22:13:20Z");
  EXPECT_EQ(format_time_utc(1700000000.999), "2023-11-14T22:13:20Z");  // truncated, not rounded
  EXPECT_EQ(format_time_utc(951782400.0), "2000-02-29T00:00:00Z");
}

TEST(FormatMetrics, FlattensNestedKeysWithSlashesInKeyOrder) {
  json m = {{"loss", 0.25}, {"eval", {{"acc", 0.9}, {"f1", {{"macro", 0.5}}}}}, {"epoch", 3}};
  EXPECT_EQ(format_metrics(m), "epoch=3 eval/acc=0.9 eval/f1/macro=0.5 loss=0.25");
}

TEST(FormatMetrics, RoundsFloatsToSixDigitsAndKeepsIntegersAndStrings) {
  EXPECT_EQ(format_metrics({{"loss", 0.28837231568634736}}), "loss=0.288372");
  EXPECT_EQ(format_metrics({{"step", 1234567890}}), "step=1234567890");
  EXPECT_EQ(format_metrics({{"phase", "warmup"}, {"done", true}}), "done=true phase=warmup");
  EXPECT_EQ(format_metrics(json::array({1, 2})), "[1,2]");
}

TEST(FormatMetrics, NullAndEmptyAreEmpty) {
  EXPECT_EQ(format_metrics(nullptr), "");
  EXPECT_EQ(format_metrics(json::object()), "");
}

TEST(OneLine, JoinsLinesWithSemicolons) {
  EXPECT_EQ(one_line("a\nb"), "a; b");
  EXPECT_EQ(one_line("first line  \n\n   second\r\nthird\n"), "first line; second; third");
  EXPECT_EQ(one_line("plain"), "plain");
}

TEST(RenderTable, AlignsColumnsAndTrimsTrailingSpaces) {
  std::string t = render_table({"NAME", "SIZE"}, {{"a", "1 B"}, {"longer", "22 B"}}, "  ");
  EXPECT_EQ(t,
            "  NAME    SIZE\n"
            "  a       1 B\n"
            "  longer  22 B\n");
}

TEST(RenderTable, PadsShortRows) {
  EXPECT_EQ(render_table({"A", "B", "C"}, {{"x"}}), "A  B  C\nx\n");
}

TEST(ExitCodes, MapEachErrorKindToItsDocumentedCode) {
  EXPECT_EQ(exit_code_for(ErrorCode::kInvalidArgument), 2);
  EXPECT_EQ(exit_code_for(ErrorCode::kNotFound), 3);
  EXPECT_EQ(exit_code_for(ErrorCode::kCorruption), 4);
  EXPECT_EQ(exit_code_for(ErrorCode::kAlreadyExists), 6);
  for (ErrorCode c : {ErrorCode::kPermissionDenied, ErrorCode::kNoSpace, ErrorCode::kIO,
                      ErrorCode::kLocked, ErrorCode::kTimeout, ErrorCode::kUnavailable,
                      ErrorCode::kFailedPrecondition, ErrorCode::kInternal}) {
    EXPECT_EQ(exit_code_for(c), 5) << error_code_name(c);
  }
}

TEST(ErrorLine, IsOnePrefixedLine) {
  EXPECT_EQ(error_line("file:///x: missing\nmore"), "cairn: error: file:///x: missing; more");
}

LsView sample_ls() {
  LsView v;
  v.uri = "file:///s";
  ExperimentView e;
  e.name = "exp";
  e.uri = "file:///s/exp";
  e.config.num_to_keep = 2;
  e.config.checkpoint_score_attribute = "loss";
  e.config.checkpoint_score_order = "min";
  e.best = {"checkpoint_000001"};
  CheckpointRow c;
  c.name = "checkpoint_000001";
  c.index = 1;
  c.uri = "file:///s/exp/checkpoint_000001";
  c.committed = true;
  c.time = 1700000000.5;
  c.size_bytes = 2048;
  c.file_count = 2;
  c.metrics = {{"loss", 0.5}};
  e.checkpoints.push_back(c);
  CheckpointRow leftover;
  leftover.name = "checkpoint_000002";
  leftover.index = 2;
  leftover.uri = "file:///s/exp/checkpoint_000002";
  e.checkpoints.push_back(leftover);
  v.experiments.push_back(e);
  return v;
}

TEST(LsJson, FollowsSchemaVersionOne) {
  nlohmann::ordered_json doc = to_json(sample_ls());
  EXPECT_EQ(doc.begin().key(), "schema_version");
  EXPECT_EQ(doc["schema_version"], 1);
  EXPECT_EQ(doc["command"], "ls");
  const auto& e = doc["experiments"][0];
  EXPECT_EQ(e["config"]["num_to_keep"], 2);
  EXPECT_EQ(e["config"]["checkpoint_score_attribute"], "loss");
  EXPECT_TRUE(e["config"]["keep_checkpoint_every_n_hours"].is_null());
  EXPECT_EQ(e["latest"], "checkpoint_000001");  // the leftover is never the latest
  const auto& c = e["checkpoints"][0];
  EXPECT_EQ(c["time"], "2023-11-14T22:13:20Z");
  EXPECT_EQ(c["time_unix"], 1700000000.5);
  EXPECT_EQ(c["size_bytes"], 2048);
  EXPECT_EQ(c["state"], "committed");
  const auto& l = e["checkpoints"][1];
  EXPECT_EQ(l["state"], "uncommitted");
  EXPECT_TRUE(l["time"].is_null());
  EXPECT_TRUE(l["size_bytes"].is_null());
  EXPECT_TRUE(l["metrics"].is_null());
}

TEST(LsText, IsATablePerExperiment) {
  std::string t = to_text(sample_ls());
  EXPECT_NE(t.find("experiment exp  (1 checkpoint, keep 2 by loss (min))"), std::string::npos) << t;
  EXPECT_NE(t.find("checkpoint_000001 *  committed    2023-11-14T22:13:20Z  2.0 KiB  loss=0.5"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("checkpoint_000002    uncommitted  -"), std::string::npos) << t;
}

TEST(LsText, SaysWhenThereIsNothing) {
  LsView v;
  v.uri = "file:///empty";
  EXPECT_EQ(to_text(v), "no experiments at file:///empty\n");
}

TEST(VerifyViews, NameEachBadFileWithItsCheckpointAndReason) {
  VerifyView v;
  v.uri = "file:///s";
  v.checkpoints.push_back({"file:///s/e/checkpoint_000000", 2, 10, false});
  v.problems.push_back({"file:///s/e/checkpoint_000000", "model.bin", "missing"});
  EXPECT_FALSE(v.ok());
  std::string t = to_text(v);
  EXPECT_NE(t.find("bad file: file:///s/e/checkpoint_000000 model.bin: missing"), std::string::npos)
      << t;
  EXPECT_NE(t.find("FAILED"), std::string::npos) << t;
  auto doc = to_json(v);
  EXPECT_EQ(doc["ok"], false);
  EXPECT_EQ(doc["problems"][0]["reason"], "missing");
}

TEST(GcViews, SayWhatWouldBeRemovedInADryRun) {
  GcView v;
  v.uri = "file:///s";
  v.dry_run = true;
  v.removed = {"file:///s/e/checkpoint_000003/a"};
  std::string t = to_text(v);
  EXPECT_NE(t.find("would remove file:///s/e/checkpoint_000003/a"), std::string::npos) << t;
  EXPECT_EQ(to_json(v)["dry_run"], true);
}

TEST(ShowViews, GiveChecksumsAsSixteenHexDigits) {
  ShowView v;
  v.uri = "file:///c";
  v.committed = true;
  v.manifest = Manifest{};
  v.files.push_back({"a.bin", 3, 0xabcULL});
  auto doc = to_json(v);
  EXPECT_EQ(doc["files"][0]["xxh3"], "0000000000000abc");
  EXPECT_NE(to_text(v).find("a.bin  3      0000000000000abc"), std::string::npos) << to_text(v);
}

TEST(TunerState, ReadsTheFieldsTheCliShowsAndIgnoresTheRest) {
  TunerState s = parse_tuner_state(
      R"({"format": "cairn-tuner-state", "version": 1, "name": "t", "updated_at": 12.5,
          "metric": "loss", "mode": "min", "searcher": {"any": "thing"},
          "trials": [{"trial_id": "trial_00001", "status": "ERROR", "config": {"lr": 1},
                      "last_result": {"loss": 2}, "num_failures": 3, "error": "boom",
                      "latest_checkpoint": null, "future_field": 1}]})",
      "file:///e/tuner_state.json");
  EXPECT_EQ(s.name, "t");
  EXPECT_EQ(s.updated_at, 12.5);
  EXPECT_EQ(s.metric, "loss");
  ASSERT_EQ(s.trials.size(), 1u);
  const TunerTrialState& t = s.trials[0];
  EXPECT_EQ(t.dir, "trial_00001") << "dir defaults to the trial id";
  EXPECT_EQ(t.status, "ERROR");
  EXPECT_EQ(t.config, json({{"lr", 1}}));
  EXPECT_EQ(t.num_failures, 3);
  EXPECT_EQ(t.error, "boom");
  EXPECT_FALSE(t.latest_checkpoint.has_value());
}

TEST(TunerState, DamageIsCorruptionNamingTheFile) {
  for (
      const char* text :
      {"", "[]", R"({"version": 1})", R"({"format": "cairn-tuner-state", "version": "1"})",
       R"({"format": "cairn-tuner-state", "version": 1, "trials": [7]})",
       R"({"format": "cairn-tuner-state", "version": 1, "trials": [{"status": "RUNNING"}]})",
       R"({"format": "cairn-tuner-state", "version": 1, "trials": [{"trial_id": "a", "dir": "x/y"}]})",
       R"({"format": "cairn-tuner-state", "version": 1, "trials": [{"trial_id": "a", "dir": ".."}]})",
       R"({"format": "cairn-tuner-state", "version": 1, "trials": [{"trial_id": "a", "last_result": 3}]})"}) {
    SCOPED_TRACE(text);
    try {
      parse_tuner_state(text, "file:///e/tuner_state.json");
      ADD_FAILURE() << "expected kCorruption";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kCorruption);
      EXPECT_NE(std::string(e.what()).find("file:///e/tuner_state.json"), std::string::npos);
    }
  }
}

TEST(LsViews, NestTrialsUnderATunerExperimentAndCountThemByStatus) {
  auto tuner = std::make_shared<TunerView>();
  tuner->metric = "acc/top1";
  tuner->mode = "max";
  TrialView done;
  done.trial_id = done.dir = "trial_00000";
  done.status = "TERMINATED";
  done.in_state = true;
  done.last_result = {{"training_iteration", 4}, {"acc", {{"top1", 0.5}}}};
  CheckpointRow row;
  row.name = "checkpoint_000003";
  row.index = 3;
  row.committed = true;
  row.metrics = {{"acc", {{"top1", 0.5}}}};
  done.folder.checkpoints.push_back(row);
  TrialView failed;
  failed.trial_id = failed.dir = "trial_00001";
  failed.status = "ERROR";
  failed.error = "\n  RuntimeError: out of memory\n  at line 3";
  failed.folder_missing = true;
  tuner->trials = {done, failed};
  LsView v;
  v.uri = "file:///s";
  ExperimentView e;
  e.name = "search";
  e.uri = "file:///s/search";
  e.tuner = tuner;
  v.experiments.push_back(e);

  std::string t = to_text(v);
  EXPECT_NE(t.find("experiment search  (tuner, 2 trials: 1 TERMINATED, 1 ERROR; metric acc/top1 "
                   "(max))\n  file:///s/search\n"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("\n  trial trial_00000  TERMINATED  training_iteration=4 acc/top1=0.5  (1 "
                   "checkpoint, keep all)\n    CHECKPOINT         STATE"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("\n  trial trial_00001  ERROR  (folder missing)\n"
                   "    error: RuntimeError: out of memory\n"),
            std::string::npos)
      << t;
  auto doc = to_json(v);
  const auto& j = doc["experiments"][0];
  EXPECT_EQ(j["kind"], "tuner");
  EXPECT_EQ(j["status_counts"]["ERROR"], 1);
  EXPECT_EQ(j["trials"][0]["latest"], "checkpoint_000003");
  EXPECT_EQ(j["trials"][1]["folder_missing"], true);
  EXPECT_TRUE(j["trials"][1]["checkpoints"].empty());
}

}  // namespace
}  // namespace cairn::cli
