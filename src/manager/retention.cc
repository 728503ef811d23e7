#include "manager/retention.h"

#include <algorithm>
#include <cmath>
#include <set>

namespace cairn::retention {

namespace {

// The value `attribute` names below `node`: the literal key first, else the
// longest literal prefix (up to a '/') whose value is an object holding the
// rest. Depth is bounded by the number of '/' in the attribute.
const nlohmann::json* find_attribute(const nlohmann::json& node, std::string_view attribute) {
  if (!node.is_object()) return nullptr;
  if (auto it = node.find(std::string(attribute)); it != node.end()) return &*it;
  for (size_t cut = attribute.rfind('/'); cut != std::string_view::npos && cut > 0;
       cut = attribute.rfind('/', cut - 1)) {
    auto it = node.find(std::string(attribute.substr(0, cut)));
    if (it == node.end() || !it->is_object()) continue;
    if (const nlohmann::json* found = find_attribute(*it, attribute.substr(cut + 1))) return found;
  }
  return nullptr;
}

}  // namespace

Score extract_score(const nlohmann::json& metrics, std::string_view attribute) {
  const nlohmann::json* node = find_attribute(metrics, attribute);
  if (!node || node->is_null()) return {};
  if (node->is_number()) return {ScoreKind::kNumber, node->get<double>(), {}};
  return {ScoreKind::kNotNumber, 0.0,
          node->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)};
}

bool better(const Candidate& a, const Candidate& b, const Policy& policy) {
  if (policy.by_score) {
    const bool va = a.score && !std::isnan(*a.score);
    const bool vb = b.score && !std::isnan(*b.score);
    if (va != vb) return va;
    if (va && *a.score != *b.score)
      return policy.maximize ? *a.score > *b.score : *a.score < *b.score;
  }
  return a.index > b.index;
}

std::vector<uint64_t> rank(std::vector<Candidate> candidates, const Policy& policy) {
  std::sort(candidates.begin(), candidates.end(),
            [&](const Candidate& a, const Candidate& b) { return better(a, b, policy); });
  std::vector<uint64_t> out;
  out.reserve(candidates.size());
  for (const auto& c : candidates) out.push_back(c.index);
  return out;
}

std::vector<uint64_t> to_delete(const std::vector<Candidate>& candidates, const Policy& policy) {
  if (!policy.num_to_keep || candidates.empty()) return {};
  uint64_t latest = 0;
  std::set<uint64_t> pinned;
  for (const auto& c : candidates) {
    latest = std::max(latest, c.index);
    if (c.pinned) pinned.insert(c.index);
  }
  std::vector<uint64_t> ranked = rank(candidates, policy);
  std::vector<uint64_t> out;
  for (size_t i = static_cast<size_t>(std::max(0, *policy.num_to_keep)); i < ranked.size(); ++i) {
    if (ranked[i] != latest && !pinned.count(ranked[i])) out.push_back(ranked[i]);
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool should_pin(double created_at, double last_pinned_at, std::optional<double> hours) {
  return hours && created_at - last_pinned_at >= *hours * 3600.0;
}

}  // namespace cairn::retention
