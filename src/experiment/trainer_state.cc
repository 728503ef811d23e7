#include "experiment/trainer_state.h"

#include <fmt/format.h>

#include "cairn/error.h"
#include "experiment/layout.h"
#include "util/json.h"

namespace cairn::experiment {

namespace {

// Type of each trainer_state.json field that restore and the driver read.
// A field may be absent (defaults apply) or null where noted.
struct StateField {
  std::string_view name;
  nlohmann::json::value_t type;
  bool nullable;
};
constexpr StateField kStateFields[] = {
    {"name", nlohmann::json::value_t::string, false},
    {"storage_path", nlohmann::json::value_t::string, false},
    {"num_workers", nlohmann::json::value_t::number_unsigned, false},
    {"driver_starts", nlohmann::json::value_t::number_unsigned, false},
    {"failures", nlohmann::json::value_t::number_unsigned, false},
    {"checkpoint_config", nlohmann::json::value_t::object, false},
    {"failure_config", nlohmann::json::value_t::object, false},
    {"resume_from_checkpoint", nlohmann::json::value_t::string, true},
    {"error", nlohmann::json::value_t::string, true},
    {"status", nlohmann::json::value_t::string, false},
};

bool has_type(const nlohmann::json& v, nlohmann::json::value_t type) {
  if (type == nlohmann::json::value_t::number_unsigned) {
    return v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
  }
  return v.type() == type;
}

}  // namespace

nlohmann::json read_trainer_state(std::string_view experiment_uri) {
  auto storage = open_storage(experiment_uri);
  if (!storage->exists(kTrainerStateKey)) return nullptr;
  const std::string where = storage->uri_of(kTrainerStateKey);
  nlohmann::json j = parse_json(storage->get(kTrainerStateKey), where);
  if (!j.is_object() || j.value("format", nlohmann::json()) != std::string(kTrainerStateFormat)) {
    throw Error(ErrorCode::kCorruption, fmt::format("{}: not a Cairn trainer state file", where));
  }
  for (const StateField& f : kStateFields) {
    auto it = j.find(f.name);
    if (it == j.end() || (f.nullable && it->is_null()) || has_type(*it, f.type)) continue;
    throw Error(ErrorCode::kCorruption,
                fmt::format("{}: field \"{}\" is {} ({}), not what a trainer state holds there",
                            where, f.name, it->type_name(), dump_for_output(*it).substr(0, 80)));
  }
  return j;
}

void write_trainer_state(Storage& experiment, const nlohmann::json& state) {
  experiment.put(kTrainerStateKey, state.dump(2));
}

}  // namespace cairn::experiment
