#include "experiment/location.h"

#include <time.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <random>

#include <fmt/format.h>

#include "cairn/error.h"
#include "cairn/manager.h"
#include "experiment/layout.h"
#include "util/fs.h"
#include "util/json.h"
#include "util/settings.h"

namespace cairn::experiment {

bool holds_experiment(Storage& storage) {
  if (storage.exists(kTrainerStateKey) || storage.exists(kManagerHistoryKey)) return true;
  auto is_checkpoint = [](std::string_view key) {
    const size_t slash = key.find('/');
    return slash != std::string_view::npos &&
           parse_checkpoint_name(key.substr(0, slash)).has_value();
  };
  for (const auto& o : storage.list("")) {
    if (is_checkpoint(o.key)) return true;
  }
  for (const auto& id : storage.list_incomplete("")) {
    if (is_checkpoint(id)) return true;
  }
  return false;
}

void check_experiment_name(std::string_view name, std::string_view field) {
  const char* why = nullptr;
  if (name.empty()) {
    why = "it is empty";
  } else if (name == "." || name == "..") {
    why = "it names a relative folder";
  } else if (name.find('/') != std::string_view::npos) {
    why = "it contains '/'";
  } else if (name.find('\\') != std::string_view::npos) {
    why = "it contains a backslash";
  } else if (name.find('\0') != std::string_view::npos) {
    why = "it contains a NUL byte";
  } else if (!is_valid_utf8(name)) {
    why = "it is not valid UTF-8";
  }
  if (why == nullptr) return;
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("{} {} is not a valid experiment name: {}. The experiment is the "
                          "folder <storage_path>/<name>, so the name must be one folder name "
                          "(not \"\", \".\" or \"..\"; no '/', backslash or NUL)",
                          field, dump_for_output(nlohmann::json(std::string(name))), why));
}

std::string default_run_name(std::chrono::system_clock::time_point now, uint32_t random) {
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(
                          now - std::chrono::system_clock::from_time_t(t))
                          .count();
  std::tm tm{};
  ::localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "cairn_train_%Y-%m-%d_%H-%M-%S", &tm);
  // from_time_t truncates toward the past only for times after 1970; clamp anyway.
  const long long us = micros < 0 ? 0 : (micros > 999999 ? 999999 : micros);
  return fmt::format("{}.{:06d}_{:06x}", buf, us, random & 0xffffffu);
}

ExperimentParts split_experiment_path(std::string_view path) {
  std::string p(path);
  const size_t scheme = p.find("://");
  const bool is_uri = scheme != std::string::npos;
  if (!is_uri) p = std::filesystem::absolute(expand_home(p)).lexically_normal().string();
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  const size_t first = is_uri ? scheme + 3 : 0;  // where the path part starts
  if (slash == std::string::npos || slash < first || slash + 1 >= p.size()) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: not an experiment folder (a path or URI ending in the "
                            "experiment's name)",
                            path));
  }
  ExperimentParts parts;
  parts.name = p.substr(slash + 1);
  // Keep the root's '/' ("/exp" is in "/", "file:///exp" in "file:///").
  parts.storage_path = p.substr(0, std::max(slash, first + (is_uri ? 0 : 1)));
  if (is_uri && slash == first) parts.storage_path.push_back('/');
  check_experiment_name(parts.name, fmt::format("the experiment folder of {}:", path));
  return parts;
}

std::string experiment_uri_of(std::string_view path) {
  const ExperimentParts where = split_experiment_path(path);
  return open_storage(where.storage_path)->child(where.name)->uri();
}

ExperimentLocation locate_experiment(std::string_view storage_path, std::string_view name) {
  ExperimentLocation loc;
  loc.storage_path = std::string(storage_path);
  if (loc.storage_path.empty()) {
    loc.storage_path = Settings::from(Environment::process()).storage_path;
  }
  const bool is_uri = loc.storage_path.find("://") != std::string::npos;
  if (!is_uri) {
    loc.storage_path =
        std::filesystem::absolute(expand_home(loc.storage_path)).lexically_normal().string();
  }
  while (loc.storage_path.size() > 1 && loc.storage_path.back() == '/') loc.storage_path.pop_back();
  loc.name = std::string(name);
  if (loc.name.empty()) {
    loc.name = default_run_name(std::chrono::system_clock::now(), std::random_device{}());
  }
  check_experiment_name(loc.name, "RunConfig::name");
  validate_key(loc.name);
  loc.uri = open_storage(loc.storage_path)->child(loc.name)->uri();
  loc.path = is_uri ? loc.uri : (std::filesystem::path(loc.storage_path) / loc.name).string();
  return loc;
}

}  // namespace cairn::experiment
