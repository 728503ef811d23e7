#include "manager/tier_policy.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "util/hash.h"

namespace cairn::tier_policy {

bool should_persist(int every_n, double every_minutes, uint64_t saves_since_persisted, double now,
                    double last_persisted_at) {
  if (every_n > 0 && saves_since_persisted >= static_cast<uint64_t>(every_n)) return true;
  return every_minutes > 0 && now - last_persisted_at >= every_minutes * 60.0;
}

std::optional<std::string> shortfall(uint64_t estimate, int keep, const Space& space) {
  if (estimate == 0) return std::nullopt;
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  const uint64_t copies = static_cast<uint64_t>(std::max(keep, 0)) + 1;
  const uint64_t need = estimate > kMax / copies ? kMax : estimate * copies;
  const uint64_t room = space.free > kMax - space.held ? kMax : space.held + space.free;
  const uint64_t capacity = space.max_bytes > 0 ? std::min(room, space.max_bytes) : room;
  if (need <= capacity) return std::nullopt;
  return fmt::format(
      "it needs {} bytes ({} checkpoint(s) of {} bytes kept plus the one being written) and can "
      "use {} ({} held, {} free on its file system{})",
      need, keep, estimate, capacity, space.held, space.free,
      space.max_bytes > 0 ? fmt::format(", MemoryTierConfig.max_bytes {}", space.max_bytes) : "");
}

std::string tier_folder_name(std::string_view experiment_uri) {
  std::string_view tail = experiment_uri;
  while (!tail.empty() && tail.back() == '/') tail.remove_suffix(1);
  const size_t slash = tail.rfind('/');
  if (slash != std::string_view::npos) tail.remove_prefix(slash + 1);
  std::string readable;
  for (char c : tail.substr(0, 48)) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       c == '-' || c == '_' || c == '.';
    readable.push_back(plain ? c : '_');
  }
  if (readable.empty() || readable[0] == '.') readable.insert(readable.begin(), 'x');
  return fmt::format("{}-{}", readable, hash_to_hex(xxh3_64(experiment_uri)));
}

}  // namespace cairn::tier_policy
