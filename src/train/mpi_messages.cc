#include "train/mpi_messages.h"

#include <fmt/format.h>

namespace cairn::train_internal {

nlohmann::json context_to_json(const TrainContext& c) {
  return {{"world_rank", c.world_rank},
          {"world_size", c.world_size},
          {"local_rank", c.local_rank},
          {"local_world_size", c.local_world_size},
          {"node_rank", c.node_rank},
          {"experiment_name", c.experiment_name},
          {"storage_path", c.storage_path},
          {"experiment_path", c.experiment_path},
          {"attempt", c.attempt},
          {"rendezvous", {{"master_addr", c.master_addr}, {"master_port", c.master_port}}}};
}

TrainContext context_from_json(const nlohmann::json& j) {
  TrainContext c;
  c.world_rank = j.at("world_rank").get<int>();
  c.world_size = j.at("world_size").get<int>();
  c.local_rank = j.at("local_rank").get<int>();
  c.local_world_size = j.at("local_world_size").get<int>();
  c.node_rank = j.at("node_rank").get<int>();
  c.experiment_name = j.at("experiment_name").get<std::string>();
  c.storage_path = j.at("storage_path").get<std::string>();
  c.experiment_path = j.at("experiment_path").get<std::string>();
  c.attempt = j.at("attempt").get<int>();
  c.master_addr = j.at("rendezvous").at("master_addr").get<std::string>();
  c.master_port = j.at("rendezvous").at("master_port").get<int>();
  return c;
}

nlohmann::json result_to_json(const Result& r) {
  nlohmann::json best = nlohmann::json::array();
  for (const auto& b : r.best_checkpoints) {
    best.push_back({{"uri", b.checkpoint.uri()}, {"metrics", b.metrics}});
  }
  nlohmann::json restores = nlohmann::json::array();
  for (const auto& x : r.restores) {
    restores.push_back({{"attempt", x.attempt},
                        {"checkpoint", x.checkpoint},
                        {"tier", x.tier},
                        {"world_size", x.world_size},
                        {"rank_tiers", x.rank_tiers},
                        {"damaged", x.damaged}});
  }
  return {{"metrics", r.metrics},
          {"restores", restores},
          {"checkpoint", r.checkpoint ? nlohmann::json(r.checkpoint->uri()) : nlohmann::json()},
          {"best", best},
          {"path", r.path},
          {"preempted", r.preempted},
          {"history", r.metrics_history},
          {"error", r.error ? nlohmann::json(*r.error) : nlohmann::json()}};
}

Result result_from_json(const nlohmann::json& j) {
  Result r;
  r.metrics = j.at("metrics");
  if (j.at("checkpoint").is_string()) {
    r.checkpoint = Checkpoint::from_directory(j["checkpoint"].get<std::string>());
  }
  for (const auto& b : j.at("best")) {
    r.best_checkpoints.push_back(
        {Checkpoint::from_directory(b.at("uri").get<std::string>()), b.at("metrics")});
  }
  r.path = j.at("path").get<std::string>();
  if (j.at("error").is_string()) r.error = j["error"].get<std::string>();
  r.preempted = j.value("preempted", false);
  if (j.contains("history")) r.metrics_history = j["history"].get<std::vector<nlohmann::json>>();
  for (const auto& x : j.value("restores", nlohmann::json::array())) {
    r.restores.push_back(
        {x.at("attempt").get<int>(), x.at("checkpoint").get<std::string>(),
         x.at("tier").get<std::string>(), x.value("world_size", 0),
         x.value("rank_tiers", nlohmann::json::array()).get<std::vector<std::string>>(),
         x.value("damaged", nlohmann::json::array()).get<std::vector<std::string>>()});
  }
  return r;
}

nlohmann::json error_to_json(ErrorCode code, std::string_view message) {
  return {{"code", std::string(error_code_name(code))}, {"message", std::string(message)}};
}

Error error_from_json(const nlohmann::json& j, std::string_view prefix) {
  const std::string name = j.value("code", "internal");
  ErrorCode code = ErrorCode::kInternal;
  for (int c = 0; c <= static_cast<int>(ErrorCode::kInternal); ++c) {
    if (error_code_name(static_cast<ErrorCode>(c)) == name) code = static_cast<ErrorCode>(c);
  }
  return Error(code, fmt::format("{}{}", prefix, j.value("message", std::string("unknown"))));
}

std::string type_of(const nlohmann::json& m) {
  auto it = m.is_object() ? m.find("t") : m.end();
  return it != m.end() && it->is_string() ? it->get<std::string>() : std::string();
}

Error malformed(std::string_view from, const nlohmann::json::exception& e) {
  return Error(ErrorCode::kCorruption,
               fmt::format("malformed message from {}: {}", from, e.what()));
}

}  // namespace cairn::train_internal
