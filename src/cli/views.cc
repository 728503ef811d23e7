#include "cli/views.h"

#include <fmt/format.h>

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

nlohmann::ordered_json to_json(const LsView& view) {
  json experiments = json::array();
  for (const auto& e : view.experiments) {
    json checkpoints = json::array();
    std::optional<std::string> latest;
    for (const auto& c : e.checkpoints) {
      if (c.committed) latest = c.name;
      checkpoints.push_back({
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
          {"error", c.error.empty() ? json(nullptr) : json(c.error)},
      });
    }
    experiments.push_back({
        {"name", e.name},
        {"uri", e.uri},
        {"config", config_json(e.config)},
        {"latest", latest ? json(*latest) : json(nullptr)},
        {"best", e.best},
        {"checkpoints", std::move(checkpoints)},
        {"error", e.error.empty() ? json(nullptr) : json(e.error)},
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
    size_t committed = 0;
    for (const auto& c : e.checkpoints) committed += c.committed ? 1 : 0;
    out += fmt::format("experiment {}  ({} checkpoint{}, {})\n", e.name.empty() ? e.uri : e.name,
                       committed, committed == 1 ? "" : "s", config_text(e.config));
    if (!e.name.empty()) out += fmt::format("  {}\n", e.uri);
    if (!e.error.empty()) out += fmt::format("  error: {}\n", e.error);
    if (e.checkpoints.empty()) continue;
    const bool ranked = !e.config.checkpoint_score_attribute.empty() && !e.best.empty();
    std::string best = e.best.empty() ? "" : e.best.front();
    std::vector<std::vector<std::string>> rows;
    for (const auto& c : e.checkpoints) {
      std::string state = c.committed ? "committed" : "uncommitted";
      if (c.pinned) state += ",pinned";
      std::string metrics = c.error.empty() ? format_metrics(c.metrics) : "error: " + c.error;
      std::string name = c.name;
      if (ranked && c.name == best) name += " *";
      rows.push_back({name, state, c.time ? format_time_utc(*c.time) : "-",
                      c.size_bytes ? format_size(*c.size_bytes) : "-", or_dash(metrics)});
    }
    out += render_table({"CHECKPOINT", "STATE", "TIME (UTC)", "SIZE", "METRICS"}, rows, "  ");
    if (ranked) {
      out += fmt::format("  * best by {} ({})\n", e.config.checkpoint_score_attribute,
                         e.config.checkpoint_score_order);
    }
  }
  return out;
}

// ---- show -------------------------------------------------------------

nlohmann::ordered_json to_json(const ShowView& view) {
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
        {"total_bytes", m.total_bytes()},
        {"file_count", m.files.size()},
    };
  }
  return {{"schema_version", kSchemaVersion},
          {"command", "show"},
          {"uri", view.uri},
          {"state", view.committed ? "committed" : "uncommitted"},
          {"manifest", std::move(manifest)},
          {"files", std::move(files)},
          {"metadata", view.metadata}};
}

std::string to_text(const ShowView& view) {
  std::vector<std::vector<std::string>> head;
  head.push_back({"checkpoint", view.uri});
  head.push_back(
      {"state", view.committed ? "committed" : "uncommitted (not a visible checkpoint)"});
  uint64_t total = 0;
  for (const auto& f : view.files) total += f.size;
  if (view.manifest) {
    const Manifest& m = *view.manifest;
    head.push_back({"created", format_time_utc(m.created_at)});
    head.push_back({"metrics", or_dash(format_metrics(m.metrics))});
    head.push_back({"layout", m.layout.is_null() ? "-" : m.layout.dump()});
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
