#include "experiment/tuner_state.h"

#include <fmt/format.h>

#include "cairn/error.h"
#include "util/json.h"

namespace cairn::experiment {

namespace {

using nlohmann::json;

[[noreturn]] void damaged(std::string_view source, std::string_view what) {
  throw Error(ErrorCode::kCorruption, fmt::format("{}: {}", source, what));
}

// `object[key]` as a string; nullopt when absent or null.
std::optional<std::string> optional_string(const json& object, const char* key,
                                           std::string_view source, std::string_view where) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) damaged(source, fmt::format("{}\"{}\" is not a string", where, key));
  return it->get<std::string>();
}

TunerTrialState parse_trial(const json& t, size_t i, std::string_view source) {
  const std::string where = fmt::format("trials[{}]: ", i);
  if (!t.is_object()) damaged(source, where + "is not an object");
  TunerTrialState out;
  auto id = optional_string(t, "trial_id", source, where);
  if (!id || id->empty()) damaged(source, where + "has no \"trial_id\"");
  out.trial_id = *id;
  out.dir = optional_string(t, "dir", source, where).value_or(out.trial_id);
  if (out.dir.empty() || out.dir == "." || out.dir == ".." ||
      out.dir.find_first_of("/\\") != std::string::npos ||
      out.dir.find('\0') != std::string::npos) {
    damaged(source, fmt::format("{}\"dir\" \"{}\" is not a folder name", where, out.dir));
  }
  out.status = optional_string(t, "status", source, where).value_or("UNKNOWN");
  if (auto it = t.find("config"); it != t.end()) out.config = *it;
  if (auto it = t.find("last_result"); it != t.end() && !it->is_null()) {
    if (!it->is_object()) damaged(source, where + "\"last_result\" is not an object");
    out.last_result = *it;
  }
  if (auto it = t.find("num_failures"); it != t.end() && !it->is_null()) {
    if (!it->is_number_integer()) damaged(source, where + "\"num_failures\" is not an integer");
    out.num_failures = it->get<int64_t>();
  }
  out.error = optional_string(t, "error", source, where);
  out.latest_checkpoint = optional_string(t, "latest_checkpoint", source, where);
  return out;
}

}  // namespace

TunerState parse_tuner_state(std::string_view text, std::string_view source) {
  json doc = parse_json(text, source);
  if (!doc.is_object()) damaged(source, "tuner state is not a JSON object");
  auto format = optional_string(doc, "format", source, "");
  if (format != kTunerStateFormat) {
    damaged(source, fmt::format("not a tuner state (\"format\" is {}, expected \"{}\")",
                                format ? "\"" + *format + "\"" : "missing", kTunerStateFormat));
  }
  auto version = doc.find("version");
  if (version == doc.end() || !version->is_number_integer()) {
    damaged(source, "tuner state has no integer \"version\"");
  }
  if (version->get<int64_t>() != kTunerStateVersion) {
    damaged(source, fmt::format("tuner state version {} is not supported (this cairn reads "
                                "version {})",
                                version->get<int64_t>(), kTunerStateVersion));
  }
  TunerState out;
  out.name = optional_string(doc, "name", source, "").value_or("");
  if (auto it = doc.find("updated_at"); it != doc.end() && !it->is_null()) {
    if (!it->is_number()) damaged(source, "\"updated_at\" is not a number");
    out.updated_at = it->get<double>();
  }
  out.metric = optional_string(doc, "metric", source, "").value_or("");
  out.mode = optional_string(doc, "mode", source, "").value_or("");
  auto trials = doc.find("trials");
  if (trials != doc.end() && !trials->is_null()) {
    if (!trials->is_array()) damaged(source, "\"trials\" is not an array");
    for (size_t i = 0; i < trials->size(); ++i) {
      out.trials.push_back(parse_trial((*trials)[i], i, source));
    }
  }
  out.doc = std::move(doc);
  return out;
}

TunerState read_tuner_state(Storage& experiment) {
  return parse_tuner_state(experiment.get(kTunerStateKey), experiment.uri_of(kTunerStateKey));
}

std::optional<TunerState> find_tuner_state(Storage& experiment) {
  if (!experiment.exists(kTunerStateKey)) return std::nullopt;
  return read_tuner_state(experiment);
}

void write_tuner_state(Storage& experiment, std::string_view text) {
  experiment.put(kTunerStateKey, text);
}

}  // namespace cairn::experiment
