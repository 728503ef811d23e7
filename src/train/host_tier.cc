// The host leaders' side of the memory tier across hosts (host_tier.h).
#include "train/host_tier.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "cairn/error.h"
#include "cairn/manager.h"
#include "cairn/storage.h"
#include "checkpoint/copy.h"
#include "train/mpi_peer.h"
#include "util/hash.h"

namespace cairn::train_internal {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kControlFolder = ".cairn";
constexpr std::string_view kPeerTmp = ".cairn-peer-tmp";

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Writes `text` at `p` whole or not at all (tmpfs: a rename suffices).
void write_whole(const fs::path& p, const std::string& text) {
  std::error_code ec;
  fs::create_directories(p.parent_path(), ec);
  const fs::path tmp = p.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out.flush()) {
      throw Error(ErrorCode::kIO, fmt::format("{}: could not write it", tmp.string()));
    }
  }
  fs::rename(tmp, p, ec);
  if (ec)
    throw Error(ErrorCode::kIO,
                fmt::format("{}: could not write it: {}", p.string(), ec.message()));
}

// Writes a checkpoint's control files, the manifest last: it is what makes
// the copy count as committed.
void write_control(const fs::path& dir, const nlohmann::json& control) {
  std::optional<std::string> manifest;
  for (auto it = control.begin(); it != control.end(); ++it) {
    if (it.key() == kManifestKey) {
      manifest = it.value().get<std::string>();
      continue;
    }
    write_whole(dir / it.key(), it.value().get<std::string>());
  }
  if (manifest) write_whole(dir / std::string(kManifestKey), *manifest);
}

// Removes a checkpoint's copy on this host, the manifest first, so that it
// never counts as committed half removed.
void remove_copy(const fs::path& dir) {
  std::error_code ec;
  fs::remove(dir / std::string(kManifestKey), ec);  // ignore-error: absent is fine
  fs::remove_all(dir, ec);
  if (ec)
    throw Error(ErrorCode::kIO,
                fmt::format("{}: could not remove it: {}", dir.string(), ec.message()));
}

bool has_size(const fs::path& p, uint64_t size) {
  std::error_code ec;
  const auto got = fs::file_size(p, ec);
  return !ec && got == size;
}

std::vector<ManifestEntry> entries_of(const nlohmann::json& list) {
  std::vector<ManifestEntry> out;
  for (const auto& e : list) out.push_back(entry_of_message(e));
  return out;
}

nlohmann::json entries_json(const std::vector<ManifestEntry>& list) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& e : list) out.push_back(entry_message(e));
  return out;
}

Held inventory(const fs::path& root) {
  Held held;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return held;
  for (const auto& d : fs::directory_iterator(root)) {
    const std::string name = d.path().filename().string();
    if (!d.is_directory() || !parse_checkpoint_name(name)) continue;
    HeldCheckpoint h;
    for (auto it = fs::recursive_directory_iterator(d.path());
         it != fs::recursive_directory_iterator(); ++it) {
      if (!it->is_regular_file()) continue;
      const std::string rel = fs::relative(it->path(), d.path()).generic_string();
      if (rel.find(kPeerTmp) != std::string::npos) continue;
      if (rel.rfind(std::string(kControlFolder) + "/", 0) == 0) {
        if (rel == kManifestKey) {
          h.manifest = slurp(it->path());
        } else if (!rel.ends_with(".tmp")) {
          h.control[rel] = slurp(it->path());
        }
        continue;
      }
      h.files[rel] = it->file_size();
    }
    held[name] = std::move(h);
  }
  return held;
}

nlohmann::json replicate(const nlohmann::json& op, const HostLayout& layout, int host) {
  const fs::path dir = op.at("dir").get<std::string>();
  std::vector<ManifestEntry> own;
  for (const ManifestEntry& e : entries_of(op.at("files"))) {
    if (has_size(dir / e.path, e.size)) own.push_back(e);
  }
  nlohmann::json paths = nlohmann::json::array();
  for (const auto& e : own) paths.push_back(e.path);
  // The next `replicas` hosts of the ring hold this host's files, and this
  // host those of the `replicas` hosts before it. Header k goes to the k-th
  // next host while the k-th previous one's arrives: every pair meets at
  // the same k.
  const int hosts = static_cast<int>(layout.count());
  const int replicas = std::min(op.value("replicas", 1), hosts - 1);
  std::vector<PeerFile> sends;
  std::vector<PeerFile> recvs;
  for (int k = 1; k <= replicas; ++k) {
    const int to = layout.leader.at(static_cast<size_t>((host + k) % hosts));
    const int from = layout.leader.at(static_cast<size_t>((host + hosts - k) % hosts));
    const nlohmann::json header = swap_json(to, {{"files", entries_json(own)}}, from);
    for (const auto& e : own) sends.push_back({e.path, e.size, e.xxh3, to});
    for (const auto& e : entries_of(header.at("files"))) {
      recvs.push_back({e.path, e.size, e.xxh3, from});
    }
  }
  exchange_files(dir, sends, recvs);
  return {{"t", "tier_replicated"}, {"own", paths}};
}

nlohmann::json stage(const nlohmann::json& op, const HostLayout& layout, int host) {
  const fs::path root = op.at("root").get<std::string>();
  for (const auto& name : op.at("remove")) remove_copy(root / name.get<std::string>());
  std::vector<PeerFile> sends;
  std::vector<PeerFile> recvs;
  for (const auto& m : op.at("moves")) {
    const std::string path =
        m.at("name").get<std::string>() + "/" + m.at("path").get<std::string>();
    const int from = m.at("from").get<int>();
    const int to = m.at("to").get<int>();
    const uint64_t size = m.at("size").get<uint64_t>();
    const uint64_t xxh3 = m.at("xxh3").get<uint64_t>();
    if (from == host)
      sends.push_back({path, size, xxh3, layout.leader.at(static_cast<size_t>(to))});
    if (to == host)
      recvs.push_back({path, size, xxh3, layout.leader.at(static_cast<size_t>(from))});
  }
  exchange_files(root, sends, recvs);
  for (auto it = op.at("control").begin(); it != op.at("control").end(); ++it) {
    write_control(root / it.key(), it.value());
  }
  return {{"t", "tier_staged"}};
}

nlohmann::json persist(const nlohmann::json& op) {
  const fs::path dir = op.at("dir").get<std::string>();
  auto source = open_storage(dir.string());
  auto dest = open_storage(op.at("dest").get<std::string>());
  std::vector<ManifestEntry> written;
  for (const ManifestEntry& want : entries_of(op.at("files"))) {
    auto w = dest->open_writer(want.path);
    ManifestEntry got = stream_object(*source, want.path, w.get());
    if (got.size != want.size || got.xxh3 != want.xxh3) {
      throw Error(ErrorCode::kCorruption,
                  fmt::format("{}: does not match the checkpoint's manifest (size {}, XXH3 {}; "
                              "the manifest says {}, {})",
                              source->uri_of(want.path), got.size, hash_to_hex(got.xxh3), want.size,
                              hash_to_hex(want.xxh3)));
    }
    w->commit();
    got.path = want.path;
    written.push_back(std::move(got));
  }
  return {{"t", "tier_persisted"}, {"index", op.at("index")}, {"files", entries_json(written)}};
}

}  // namespace

HostLayout layout_hosts(const std::vector<std::string>& host_of_rank) {
  HostLayout l;
  for (size_t r = 0; r < host_of_rank.size(); ++r) {
    auto it = std::find(l.names.begin(), l.names.end(), host_of_rank[r]);
    if (it == l.names.end()) {
      l.names.push_back(host_of_rank[r]);
      l.leader.push_back(static_cast<int>(r));
      it = std::prev(l.names.end());
    }
    l.host_of.push_back(static_cast<int>(it - l.names.begin()));
  }
  return l;
}

nlohmann::json held_to_json(const Held& held) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, h] : held) {
    out[name] = {{"manifest", h.manifest ? nlohmann::json(*h.manifest) : nlohmann::json()},
                 {"control", h.control},
                 {"files", h.files}};
  }
  return out;
}

Held held_from_json(const nlohmann::json& j) {
  Held held;
  for (auto it = j.begin(); it != j.end(); ++it) {
    HeldCheckpoint h;
    const nlohmann::json& v = it.value();
    if (v.at("manifest").is_string()) h.manifest = v["manifest"].get<std::string>();
    h.control = v.at("control").get<std::map<std::string, std::string>>();
    h.files = v.at("files").get<std::map<std::string, uint64_t>>();
    held[it.key()] = std::move(h);
  }
  return held;
}

std::optional<std::vector<std::set<std::string>>> files_by_host(const Manifest& m,
                                                                const HostLayout& layout) {
  if (!m.ranks.is_object() || !m.ranks.contains("files")) return std::nullopt;
  if (m.ranks.value("world_size", 0) != static_cast<int>(layout.host_of.size())) {
    return std::nullopt;
  }
  std::vector<std::set<std::string>> out(layout.count());
  for (const auto& [rank, paths] : m.ranks.at("files").items()) {
    const size_t r = std::stoul(rank);  // Manifest::parse checked it is a rank of the group
    for (const auto& p : paths) {
      out.at(static_cast<size_t>(layout.host_of.at(r))).insert(p.get<std::string>());
    }
  }
  return out;
}

RestorePlan plan_restore(const std::vector<Held>& by_host, const std::optional<std::string>& only,
                         const HostLayout* own_files) {
  // Every checkpoint some host holds, newest first.
  std::map<uint64_t, std::string, std::greater<>> names;
  for (const Held& h : by_host) {
    for (const auto& [name, _] : h) {
      if (auto index = parse_checkpoint_name(name)) names.emplace(*index, name);
    }
  }
  const int hosts = static_cast<int>(by_host.size());
  RestorePlan plan;
  for (const auto& [index, name] : names) {
    if (only && name != *only) continue;
    // Its manifest, from any host that holds it whole.
    std::optional<Manifest> manifest;
    std::map<std::string, std::string> control;
    for (const Held& h : by_host) {
      auto it = h.find(name);
      if (it == h.end() || !it->second.manifest) continue;
      if (Manifest::torn(*it->second.manifest)) continue;
      try {
        manifest = Manifest::parse(*it->second.manifest, name);
        control = it->second.control;
        control[std::string(kManifestKey)] = *it->second.manifest;
        break;
      } catch (const Error&) {
        continue;  // ignore-error: a damaged copy; another host may hold a whole one
      }
    }
    // Where each file is: the first host holding it, looking onward from
    // the host that needs it (its replica holder first).
    auto holder = [&](const ManifestEntry& f, int from_host) -> std::optional<int> {
      for (int k = 0; k < hosts; ++k) {
        const int h = (from_host + k) % hosts;
        auto it = by_host[static_cast<size_t>(h)].find(name);
        if (it == by_host[static_cast<size_t>(h)].end()) continue;
        auto file = it->second.files.find(f.path);
        if (file != it->second.files.end() && file->second == f.size) return h;
      }
      return std::nullopt;
    };
    bool whole = manifest.has_value();
    if (whole) {
      for (const auto& f : manifest->files) whole = whole && holder(f, 0).has_value();
    }
    if (!whole || plan.newest) {
      if (!whole && !only) plan.remove.push_back(name);
      continue;
    }
    plan.newest = name;
    plan.control = control;
    std::optional<std::vector<std::set<std::string>>> needs;
    if (own_files && static_cast<int>(own_files->count()) == hosts) {
      needs = files_by_host(*manifest, *own_files);
    }
    for (int h = 0; h < hosts; ++h) {
      for (const auto& f : manifest->files) {
        if (needs && !(*needs)[static_cast<size_t>(h)].count(f.path)) continue;
        const int from = *holder(f, h);
        if (from == h) continue;
        plan.moves.push_back({name, f, from, h});
        plan.filled.insert(h);
      }
    }
  }
  return plan;
}

std::string answer_to(const std::string& op) {
  return op == "tier_replicate"   ? "tier_replicated"
         : op == "tier_inventory" ? "tier_held"
         : op == "tier_stage"     ? "tier_staged"
         : op == "tier_persist"   ? "tier_persisted"
         : op == "tier_space"     ? "tier_free"
                                  : "";
}

nlohmann::json carry_out(const nlohmann::json& op, const HostLayout& layout, int host) {
  const std::string t = op.at("t").get<std::string>();
  const std::string where = fmt::format("host {}", layout.names.at(static_cast<size_t>(host)));
  const std::string answer = answer_to(t);
  try {
    if (t == "tier_replicate") return replicate(op, layout, host);
    if (t == "tier_stage") return stage(op, layout, host);
    if (t == "tier_persist") return persist(op);
    if (t == "tier_space") {
      const fs::path root = op.at("root").get<std::string>();
      std::error_code ec;
      fs::create_directories(root, ec);
      const fs::space_info space = fs::space(root, ec);
      if (ec) {
        throw Error(ErrorCode::kIO, fmt::format("{}: could not read its free space: {}",
                                                root.string(), ec.message()));
      }
      return {{"t", "tier_free"}, {"bytes", static_cast<uint64_t>(space.available)}};
    }
    if (t == "tier_inventory") {
      return {{"t", "tier_held"},
              {"held", held_to_json(inventory(op.at("root").get<std::string>()))}};
    }
    if (t == "tier_commit") {
      write_control(op.at("dir").get<std::string>(), op.at("control"));
      if (op.contains("owner")) {
        const fs::path owner = op["owner"].at("file").get<std::string>();
        if (!fs::exists(owner)) write_whole(owner, op["owner"].at("text").get<std::string>());
      }
      return nullptr;
    }
    if (t == "tier_keep") {
      const fs::path root = op.at("root").get<std::string>();
      const auto keep = op.at("keep").get<std::set<std::string>>();
      std::error_code ec;
      if (!fs::is_directory(root, ec)) return nullptr;
      std::vector<fs::path> doomed;
      for (const auto& d : fs::directory_iterator(root)) {
        const std::string name = d.path().filename().string();
        if (d.is_directory() && parse_checkpoint_name(name) && !keep.count(name)) {
          doomed.push_back(d.path());
        }
      }
      for (const auto& d : doomed) remove_copy(d);
      return nullptr;
    }
    if (t == "tier_release") {
      std::error_code ec;
      fs::remove_all(op.at("folder").get<std::string>(), ec);
      return nullptr;
    }
  } catch (const Error& e) {
    if (answer.empty()) throw with_context(e, where);
    nlohmann::json out = {{"t", answer}, {"error", fmt::format("{}: {}", where, e.what())}};
    if (op.contains("index")) out["index"] = op["index"];
    return out;
  }
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("{}: unknown memory tier operation {}", where, t));
}

}  // namespace cairn::train_internal
