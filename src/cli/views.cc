#include "cli/views.h"

#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli/format.h"
#include "util/hash.h"
#include "util/json.h"

namespace cairn::cli {

namespace {

// ordered_json keeps the documented key order (schema_version first).
using json = nlohmann::ordered_json;

json optional_time(const std::optional<double>& t) {
  return t ? json(format_time_utc(*t)) : json(nullptr);
}

json optional_number(const std::optional<double>& v) { return v ? json(*v) : json(nullptr); }

json optional_count(const std::optional<uint64_t>& v) { return v ? json(*v) : json(nullptr); }

json config_json(const CheckpointConfig& c) {
  return {
      {"num_to_keep", c.num_to_keep ? json(*c.num_to_keep) : json(nullptr)},
      {"checkpoint_score_attribute",
       c.checkpoint_score_attribute.empty() ? json(nullptr) : json(c.checkpoint_score_attribute)},
      {"checkpoint_score_order", c.checkpoint_score_order},
      {"keep_checkpoint_every_n_hours", optional_number(c.keep_checkpoint_every_n_hours)},
  };
}

std::string config_text(const CheckpointConfig& c) {
  std::string keep = c.num_to_keep ? fmt::format("keep {}", *c.num_to_keep) : "keep all";
  if (!c.checkpoint_score_attribute.empty()) {
    keep += fmt::format(" by {} ({})", c.checkpoint_score_attribute, c.checkpoint_score_order);
  } else if (c.num_to_keep) {
    keep += " most recent";
  }
  if (c.keep_checkpoint_every_n_hours) {
    keep += fmt::format(", one every {} h", *c.keep_checkpoint_every_n_hours);
  }
  return keep;
}

std::string or_dash(const std::string& s) { return s.empty() ? "-" : s; }

}  // namespace

// ---- ls ---------------------------------------------------------------

namespace {

// Where a checkpoint is held: "memory" (this host's memory tier) and/or
// "persistent" (the experiment's storage), in that order.
json tiers_json(const CheckpointRow& c) {
  json tiers = json::array();
  if (c.in_memory) tiers.push_back("memory");
  if (c.persistent) tiers.push_back("persistent");
  return tiers;
}

json checkpoint_json(const CheckpointRow& c) {
  return {
      {"name", c.name},
      {"index", c.index},
      {"uri", c.uri},
      {"state", c.committed ? "committed" : "uncommitted"},
      {"time", optional_time(c.time)},
      {"time_unix", optional_number(c.time)},
      {"size_bytes", optional_count(c.size_bytes)},
      {"file_count", optional_count(c.file_count)},
      {"metrics", c.metrics},
      {"pinned", c.pinned},
      {"tiers", tiers_json(c)},
      {"error", c.error.empty() ? json(nullptr) : json(c.error)},
  };
}

json checkpoints_json(const ExperimentView& e) {
  json checkpoints = json::array();
  for (const auto& c : e.checkpoints) checkpoints.push_back(checkpoint_json(c));
  return checkpoints;
}

// The most recent committed checkpoint's name, or null.
json latest_json(const ExperimentView& e) {
  std::optional<std::string> latest;
  for (const auto& c : e.checkpoints) {
    if (c.committed) latest = c.name;
  }
  return latest ? json(*latest) : json(nullptr);
}

json error_json(const std::string& error) { return error.empty() ? json(nullptr) : json(error); }

json optional_string(const std::string& s) { return s.empty() ? json(nullptr) : json(s); }

size_t committed_count(const ExperimentView& e) {
  size_t committed = 0;
  for (const auto& c : e.checkpoints) committed += c.committed ? 1 : 0;
  return committed;
}

// The statuses of a Tuner's trials with their counts, in a trial's life
// order (statuses this version does not know last, by name).
std::vector<std::pair<std::string, size_t>> status_counts(const TunerView& t) {
  static const std::vector<std::string> kOrder = {"PENDING",    "RUNNING", "PAUSED",
                                                  "TERMINATED", "ERROR",   "UNKNOWN"};
  std::map<std::string, size_t> counts;
  for (const auto& trial : t.trials) ++counts[trial.status];
  std::vector<std::pair<std::string, size_t>> out;
  for (const auto& s : kOrder) {
    if (auto it = counts.find(s); it != counts.end()) {
      out.emplace_back(s, it->second);
      counts.erase(it);
    }
  }
  for (const auto& [s, n] : counts) out.emplace_back(s, n);
  return out;
}

// The trial fields that `ls` and `show` share, then its folder's checkpoints.
void add_trial_json(json& out, const TrialView& t) {
  out["trial_id"] = t.trial_id;
  out["dir"] = t.dir;
  out["uri"] = t.uri;
  out["status"] = t.status;
  out["in_state"] = t.in_state;
  out["folder_missing"] = t.folder_missing;
  out["config"] = t.config;
  out["last_result"] = t.last_result;
  out["num_failures"] = t.num_failures;
  out["error"] = t.error ? json(*t.error) : json(nullptr);
  out["latest"] = latest_json(t.folder);
  out["best"] = t.folder.best;
  out["checkpoint_config"] = config_json(t.folder.config);
  out["checkpoints"] = checkpoints_json(t.folder);
  out["folder_error"] = error_json(t.folder.error);
}

json tuner_json(const ExperimentView& e) {
  const TunerView& t = *e.tuner;
  json counts = json::object();
  for (const auto& [status, n] : status_counts(t)) counts[status] = n;
  json trials = json::array();
  for (const auto& trial : t.trials) {
    json j = json::object();
    add_trial_json(j, trial);
    trials.push_back(std::move(j));
  }
  return {
      {"kind", "tuner"},
      {"name", e.name},
      {"uri", e.uri},
      {"metric", optional_string(t.metric)},
      {"mode", optional_string(t.mode)},
      {"updated_at", optional_time(t.updated_at)},
      {"updated_at_unix", optional_number(t.updated_at)},
      {"status_counts", std::move(counts)},
      {"trials", std::move(trials)},
      {"error", error_json(e.error)},
  };
}

// The value of `metric` in `result` ("a/b" also as nested keys); null when absent.
nlohmann::json metric_value(const nlohmann::json& result, const std::string& metric) {
  if (!result.is_object() || metric.empty()) return nullptr;
  if (auto it = result.find(metric); it != result.end()) return *it;
  const nlohmann::json* at = &result;
  size_t from = 0;
  while (true) {
    size_t slash = metric.find('/', from);
    auto it = at->find(metric.substr(from, slash == std::string::npos ? slash : slash - from));
    if (it == at->end()) return nullptr;
    at = &*it;
    if (slash == std::string::npos) return *at;
    if (!at->is_object()) return nullptr;
    from = slash + 1;
  }
}

// "training_iteration=10 loss=0.25": the trial's progress and the tuner's
// metric from its last result; "" when it has none.
std::string progress_text(const nlohmann::json& last_result, const std::string& metric) {
  std::vector<std::string> parts;
  for (const std::string& key : {std::string("training_iteration"), metric}) {
    nlohmann::json v = metric_value(last_result, key);
    if (v.is_null()) continue;
    std::string value = format_metrics(nlohmann::json{{"v", v}});  // "v=<value>"
    parts.push_back(key + value.substr(1));
    if (metric == "training_iteration") break;
  }
  return fmt::format("{}", fmt::join(parts, " "));
}

std::string plural(size_t n, std::string_view word) {
  return fmt::format("{} {}{}", n, word, n == 1 ? "" : "s");
}

// The checkpoint table of one experiment or trial folder, each line starting
// with `indent`, and the line explaining its best mark.
std::string checkpoints_text(const ExperimentView& e, const std::string& indent) {
  if (e.checkpoints.empty()) return "";
  const bool ranked = !e.config.checkpoint_score_attribute.empty() && !e.best.empty();
  std::string best = e.best.empty() ? "" : e.best.front();
  std::vector<std::vector<std::string>> rows;
  for (const auto& c : e.checkpoints) {
    std::string state = c.committed ? "committed" : "uncommitted";
    if (c.pinned) state += ",pinned";
    if (c.in_memory) state += c.persistent ? ",in memory" : ",memory only";
    std::string metrics = c.error.empty() ? format_metrics(c.metrics) : "error: " + c.error;
    std::string name = c.name;
    if (ranked && c.name == best) name += " *";
    rows.push_back({name, state, c.time ? format_time_utc(*c.time) : "-",
                    c.size_bytes ? format_size(*c.size_bytes) : "-", or_dash(metrics)});
  }
  std::string out =
      render_table({"CHECKPOINT", "STATE", "TIME (UTC)", "SIZE", "METRICS"}, rows, indent);
  if (ranked) {
    out += fmt::format("{}* best by {} ({})\n", indent, e.config.checkpoint_score_attribute,
                       e.config.checkpoint_score_order);
  }
  return out;
}

// The first line of a (possibly multi-line) error, such as a traceback's.
std::string first_line(const std::string& text) {
  size_t start = text.find_first_not_of(" \t\r\n");
  if (start == std::string::npos) return "";
  size_t end = text.find_first_of("\r\n", start);
  return text.substr(start, end == std::string::npos ? end : end - start);
}

std::string tuner_text(const ExperimentView& e) {
  const TunerView& t = *e.tuner;
  std::vector<std::string> counts;
  for (const auto& [status, n] : status_counts(t))
    counts.push_back(fmt::format("{} {}", n, status));
  std::string head = "tuner, " + plural(t.trials.size(), "trial");
  if (!counts.empty()) head += fmt::format(": {}", fmt::join(counts, ", "));
  if (!t.metric.empty()) {
    head += fmt::format("; metric {}{}", t.metric, t.mode.empty() ? "" : " (" + t.mode + ")");
  }
  std::string out = fmt::format("experiment {}  ({})\n", e.name.empty() ? e.uri : e.name, head);
  if (!e.name.empty()) out += fmt::format("  {}\n", e.uri);
  if (!e.error.empty()) out += fmt::format("  error: {}\n", e.error);
  for (const auto& trial : t.trials) {
    std::string line = fmt::format("  trial {}  {}", trial.trial_id, trial.status);
    if (trial.dir != trial.trial_id) line += fmt::format("  in {}/", trial.dir);
    std::string progress = progress_text(trial.last_result, t.metric);
    if (!progress.empty()) line += "  " + progress;
    if (trial.folder_missing) {
      line += "  (folder missing)";
    } else {
      line += fmt::format("  ({}, {})", plural(committed_count(trial.folder), "checkpoint"),
                          config_text(trial.folder.config));
    }
    out += line + '\n';
    if (trial.error && trial.status == "ERROR") {
      out += fmt::format("    error: {}\n", first_line(*trial.error));
    }
    if (!trial.folder.error.empty())
      out += fmt::format("    folder error: {}\n", trial.folder.error);
    out += checkpoints_text(trial.folder, "    ");
  }
  return out;
}

}  // namespace

nlohmann::ordered_json to_json(const LsView& view) {
  json experiments = json::array();
  for (const auto& e : view.experiments) {
    if (e.tuner) {
      experiments.push_back(tuner_json(e));
      continue;
    }
    experiments.push_back({
        {"kind", "trainer"},
        {"name", e.name},
        {"uri", e.uri},
        {"config", config_json(e.config)},
        {"latest", latest_json(e)},
        {"best", e.best},
        {"checkpoints", checkpoints_json(e)},
        {"error", error_json(e.error)},
    });
  }
  return {{"schema_version", kSchemaVersion},
          {"command", "ls"},
          {"uri", view.uri},
          {"experiments", std::move(experiments)}};
}

std::string to_text(const LsView& view) {
  if (view.experiments.empty()) return fmt::format("no experiments at {}\n", view.uri);
  std::string out;
  for (const auto& e : view.experiments) {
    if (!out.empty()) out += '\n';
    if (e.tuner) {
      out += tuner_text(e);
      continue;
    }
    out += fmt::format("experiment {}  ({}, {})\n", e.name.empty() ? e.uri : e.name,
                       plural(committed_count(e), "checkpoint"), config_text(e.config));
    if (!e.name.empty()) out += fmt::format("  {}\n", e.uri);
    if (!e.error.empty()) out += fmt::format("  error: {}\n", e.error);
    out += checkpoints_text(e, "  ");
  }
  return out;
}

// ---- show -------------------------------------------------------------

namespace {

json trial_show_json(const TrialShowView& show) {
  const TrialView& t = show.trial;
  json out = {{"schema_version", kSchemaVersion},
              {"command", "show"},
              {"kind", "trial"},
              {"uri", t.uri},
              {"experiment_uri", optional_string(show.experiment_uri)},
              {"state_updated_at", optional_time(show.state_updated_at)},
              {"state_updated_at_unix", optional_number(show.state_updated_at)},
              {"metric", optional_string(show.metric)},
              {"mode", optional_string(show.mode)},
              {"result_count", show.result_count}};
  add_trial_json(out, t);
  out.erase("folder_missing");  // a missing folder cannot be shown
  return out;
}

std::string trial_show_text(const TrialShowView& show) {
  const TrialView& t = show.trial;
  std::vector<std::vector<std::string>> head;
  head.push_back({"uri", t.uri});
  std::string experiment = or_dash(show.experiment_uri);
  if (show.state_updated_at) {
    experiment +=
        fmt::format("  (tuner_state.json saved {})", format_time_utc(*show.state_updated_at));
  }
  head.push_back({"experiment", experiment});
  head.push_back({"status", t.in_state ? t.status : t.status + " (not in tuner_state.json)"});
  head.push_back({"config", t.config.is_null() ? "-" : dump_for_output(t.config)});
  head.push_back({"last result", or_dash(format_metrics(t.last_result))});
  head.push_back({"results", std::to_string(show.result_count)});
  head.push_back({"failures", std::to_string(t.num_failures)});
  head.push_back({"error", t.error ? or_dash(one_line(*t.error)) : "-"});
  json latest = latest_json(t.folder);
  head.push_back({"latest", latest.is_null() ? "-" : latest.get<std::string>()});
  head.push_back({"checkpoints",
                  fmt::format("{} ({})", committed_count(t.folder), config_text(t.folder.config))});
  if (!t.folder.error.empty()) head.push_back({"folder error", t.folder.error});
  std::string out = render_table({"trial", t.trial_id}, head);
  std::string table = checkpoints_text(t.folder, "");
  if (!table.empty()) out += '\n' + table;
  return out;
}

}  // namespace

nlohmann::ordered_json to_json(const ShowView& view) {
  if (view.trial) return trial_show_json(*view.trial);
  json files = json::array();
  for (const auto& f : view.files) {
    files.push_back({{"path", f.path},
                     {"size_bytes", f.size},
                     {"xxh3", f.xxh3 ? json(hash_to_hex(*f.xxh3)) : json(nullptr)}});
  }
  json manifest = nullptr;
  if (view.manifest) {
    const Manifest& m = *view.manifest;
    manifest = {
        {"version", m.version},
        {"created_at", format_time_utc(m.created_at)},
        {"created_at_unix", m.created_at},
        {"metrics", m.metrics},
        {"layout", m.layout},
        {"ranks", m.ranks},
        {"total_bytes", m.total_bytes()},
        {"file_count", m.files.size()},
    };
  }
  return {{"schema_version", kSchemaVersion},
          {"command", "show"},
          {"kind", "checkpoint"},
          {"uri", view.uri},
          {"state", view.damage      ? "damaged"
                    : view.committed ? "committed"
                                     : "uncommitted"},
          {"damage", view.damage ? json(*view.damage) : json(nullptr)},
          {"manifest", std::move(manifest)},
          {"files", std::move(files)},
          {"metadata", view.metadata}};
}

std::string to_text(const ShowView& view) {
  if (view.trial) return trial_show_text(*view.trial);
  std::vector<std::vector<std::string>> head;
  head.push_back({"checkpoint", view.uri});
  head.push_back({"state", view.damage      ? "damaged (committed; its manifest cannot be read)"
                           : view.committed ? "committed"
                                            : "uncommitted (not a visible checkpoint)"});
  if (view.damage) head.push_back({"damage", *view.damage});
  uint64_t total = 0;
  for (const auto& f : view.files) total += f.size;
  if (view.manifest) {
    const Manifest& m = *view.manifest;
    head.push_back({"created", format_time_utc(m.created_at)});
    head.push_back({"metrics", or_dash(format_metrics(m.metrics))});
    head.push_back({"layout", m.layout.is_null() ? "-" : m.layout.dump()});
    if (!m.ranks.is_null()) {
      // Parsing checked the shape: {"world_size": N, "contributed": [...]}.
      std::vector<std::string> ranks;
      for (const auto& r : m.ranks.at("contributed")) ranks.push_back(r.dump());
      head.push_back({"ranks", fmt::format("{} of {} wrote files",
                                           or_dash(fmt::format("{}", fmt::join(ranks, ", "))),
                                           m.ranks.at("world_size").get<int64_t>())});
    }
    head.push_back({"manifest", fmt::format("version {}", m.version)});
  }
  head.push_back({"size", fmt::format("{} in {} file{}", format_size(total), view.files.size(),
                                      view.files.size() == 1 ? "" : "s")});
  head.push_back({"metadata", view.metadata.empty() ? "-" : view.metadata.dump()});
  // The key/value block has no header row: render it as a table whose header
  // is the first pair.
  std::vector<std::string> first = head.front();
  head.erase(head.begin());
  std::string out = render_table(first, head);
  if (view.files.empty()) return out + "\nno files\n";
  std::vector<std::vector<std::string>> rows;
  for (const auto& f : view.files) {
    rows.push_back({f.path, std::to_string(f.size), f.xxh3 ? hash_to_hex(*f.xxh3) : "-"});
  }
  out += '\n';
  out += render_table({"FILE", "BYTES", "XXH3"}, rows);
  return out;
}

// ---- verify -----------------------------------------------------------

nlohmann::ordered_json to_json(const VerifyView& view) {
  json checkpoints = json::array();
  for (const auto& c : view.checkpoints) {
    checkpoints.push_back(
        {{"uri", c.uri}, {"ok", c.ok}, {"file_count", c.files}, {"size_bytes", c.bytes}});
  }
  json problems = json::array();
  for (const auto& p : view.problems) {
    problems.push_back({{"checkpoint", p.checkpoint}, {"path", p.path}, {"reason", p.reason}});
  }
  return {{"schema_version", kSchemaVersion},
          {"command", "verify"},
          {"uri", view.uri},
          {"ok", view.ok()},
          {"checkpoints", std::move(checkpoints)},
          {"problems", std::move(problems)},
          {"skipped_uncommitted", view.skipped}};
}

std::string to_text(const VerifyView& view) {
  std::string out;
  std::vector<std::vector<std::string>> rows;
  for (const auto& c : view.checkpoints) {
    rows.push_back({c.ok ? "ok" : "BAD", c.uri, std::to_string(c.files), format_size(c.bytes)});
  }
  if (!rows.empty()) out += render_table({"STATUS", "CHECKPOINT", "FILES", "SIZE"}, rows);
  for (const auto& p : view.problems) {
    out += fmt::format("bad file: {} {}: {}\n", p.checkpoint, p.path, p.reason);
  }
  for (const auto& s : view.skipped) {
    out += fmt::format("not verified (uncommitted leftover): {}\n", s);
  }
  size_t bad = 0;
  for (const auto& c : view.checkpoints) bad += c.ok ? 0 : 1;
  out += fmt::format("verify: {} checkpoint{} checked, {} bad, {} problem{}: {}\n",
                     view.checkpoints.size(), view.checkpoints.size() == 1 ? "" : "s", bad,
                     view.problems.size(), view.problems.size() == 1 ? "" : "s",
                     view.ok() ? "OK" : "FAILED");
  return out;
}

// ---- gc ---------------------------------------------------------------

nlohmann::ordered_json to_json(const GcView& view) {
  return {{"schema_version", kSchemaVersion}, {"command", "gc"},         {"uri", view.uri},
          {"dry_run", view.dry_run},          {"removed", view.removed}, {"skipped", view.skipped}};
}

std::string to_text(const GcView& view) {
  std::string out;
  const char* verb = view.dry_run ? "would remove" : "removed";
  for (const auto& r : view.removed) out += fmt::format("{} {}\n", verb, r);
  for (const auto& s : view.skipped) out += fmt::format("skipped {}\n", s);
  out += fmt::format("gc: {} {} object{}, skipped {} experiment{}{}\n", verb, view.removed.size(),
                     view.removed.size() == 1 ? "" : "s", view.skipped.size(),
                     view.skipped.size() == 1 ? "" : "s", view.dry_run ? " (dry run)" : "");
  return out;
}

// ---- output -----------------------------------------------------------

namespace {

json printable_json(const json& j) {
  if (j.is_string()) return printable(j.get_ref<const std::string&>());
  if (j.is_array()) {
    json out = json::array();
    for (const auto& v : j) out.push_back(printable_json(v));
    return out;
  }
  if (j.is_object()) {
    json out = json::object();
    for (auto it = j.begin(); it != j.end(); ++it) out[printable(it.key())] = printable_json(*it);
    return out;
  }
  return j;
}

}  // namespace

std::string render_json(const nlohmann::ordered_json& document) {
  return printable_json(document).dump(2) + "\n";
}

std::string render_text(std::string_view text) { return printable(text); }

std::string error_line(std::string_view message) {
  return fmt::format("cairn: error: {}", one_line(message));
}

}  // namespace cairn::cli
