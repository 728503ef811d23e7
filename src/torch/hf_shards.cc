#include "hf_shards.h"

#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cairn/error.h"

namespace cairn::libtorch_internal {
namespace {

// "model.safetensors" -> {"model", ".safetensors"}; no extension: {name, ""}.
std::pair<std::string_view, std::string_view> split_ext(std::string_view name) {
  const size_t dot = name.rfind('.');
  if (dot == std::string_view::npos || dot == 0) return {name, {}};
  return {name.substr(0, dot), name.substr(dot)};
}

bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

}  // namespace

std::vector<std::vector<size_t>> plan_shards(const std::vector<uint64_t>& sizes,
                                             uint64_t max_shard_size,
                                             const std::vector<uint64_t>& storage_ids) {
  // huggingface_hub's split_state_dict_into_shards_factory, step for step.
  std::vector<std::vector<size_t>> shards;
  std::vector<size_t> current;
  uint64_t current_size = 0;
  // Storage id -> the positions sharing it, the first one placed.
  std::vector<std::pair<uint64_t, std::vector<size_t>>> groups;
  std::map<uint64_t, size_t> group_of;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const uint64_t id = i < storage_ids.size() ? storage_ids[i] : 0;
    if (id != 0) {
      auto [it, fresh] = group_of.emplace(id, groups.size());
      if (!fresh) {
        groups[it->second].second.push_back(i);  // placed with the first, below
        continue;
      }
      groups.push_back({id, {i}});
    }
    if (sizes[i] > max_shard_size) {
      // A shard of its own, listed now; the open shard stays open.
      shards.push_back({i});
      continue;
    }
    if (current_size + sizes[i] > max_shard_size) {
      shards.push_back(std::move(current));
      current.clear();
      current_size = 0;
    }
    current.push_back(i);
    current_size += sizes[i];
  }
  if (!current.empty()) shards.push_back(std::move(current));
  for (const auto& [id, members] : groups) {
    if (members.size() < 2) continue;
    for (auto& shard : shards) {
      if (std::find(shard.begin(), shard.end(), members.front()) == shard.end()) continue;
      shard.insert(shard.end(), members.begin() + 1, members.end());
      break;
    }
  }
  return shards;
}

std::string shard_name(std::string_view weights_name, size_t k, size_t n) {
  auto [stem, ext] = split_ext(weights_name);
  return fmt::format("{}-{:05d}-of-{:05d}{}", stem, k, n, ext);
}

std::string index_name(std::string_view weights_name) {
  return std::string(weights_name) + ".index.json";
}

bool is_weights_file(std::string_view name, std::string_view weights_name) {
  if (name == weights_name || name == index_name(weights_name)) return true;
  auto [stem, ext] = split_ext(weights_name);
  // <stem>-NNNNN-of-NNNNN<ext>
  if (name.size() <= stem.size() + ext.size() || name.substr(0, stem.size()) != stem ||
      name.substr(name.size() - ext.size()) != ext) {
    return false;
  }
  std::string_view mid = name.substr(stem.size(), name.size() - stem.size() - ext.size());
  if (mid.size() < 2 || mid[0] != '-') return false;
  mid.remove_prefix(1);
  const size_t of = mid.find("-of-");
  return of != std::string_view::npos && all_digits(mid.substr(0, of)) &&
         all_digits(mid.substr(of + 4));
}

std::vector<std::string> ShardIndex::files() const {
  std::set<std::string> unique;
  for (const auto& [name, file] : weight_map) unique.insert(file);
  return {unique.begin(), unique.end()};
}

std::string index_to_json(const ShardIndex& index) {
  nlohmann::json j = {{"metadata", {{"total_size", index.total_size}}},
                      {"weight_map", index.weight_map}};
  return j.dump(2) + "\n";
}

ShardIndex parse_index(std::string_view text, std::string_view source) {
  auto bad = [&](const std::string& why) {
    return Error(ErrorCode::kCorruption, fmt::format("{}: {}", source, why));
  };
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw bad("not valid JSON");
  if (!j.is_object()) throw bad("not a JSON object");
  auto wm = j.find("weight_map");
  if (wm == j.end() || !wm->is_object()) throw bad("has no \"weight_map\" object");
  ShardIndex index;
  for (const auto& [name, file] : wm->items()) {
    if (!file.is_string()) throw bad(fmt::format("weight_map[\"{}\"] is not a string", name));
    const std::string f = file.get<std::string>();
    if (f.empty() || f == "." || f == ".." || f.find('/') != std::string::npos ||
        f.find('\\') != std::string::npos || f.find('\0') != std::string::npos) {
      throw bad(
          fmt::format("weight_map[\"{}\"] names \"{}\", not a file in the same folder", name, f));
    }
    index.weight_map.emplace(name, f);
  }
  auto meta = j.find("metadata");
  if (meta != j.end() && meta->is_object()) {
    auto ts = meta->find("total_size");
    if (ts != meta->end() && ts->is_number_unsigned()) index.total_size = ts->get<uint64_t>();
  }
  return index;
}

}  // namespace cairn::libtorch_internal
