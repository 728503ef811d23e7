// Power loss, not just SIGKILL: each workload (workloads.h) runs once with
// the recorder preloaded, and every crash state the persistence model
// (crash_model.h) allows at every fsync boundary of the trace is built as a
// real folder and checked:
//   - every checkpoint with a manifest verifies and holds exactly the bytes
//     its save wrote (none is partially visible);
//   - every checkpoint whose save returned before the crash point, and that
//     the workload had not begun to delete, is still committed;
//   - a checkpoint's metadata is that of the last update that returned
//     before the crash point or of one begun after it, whole;
//   - a new manager opens the experiment without help, leaves no
//     uncommitted folder, and its history equals what storage holds (with
//     each record's metrics those of its manifest).
// The recording is checked too: the trace replayed in full must rebuild the
// folder the workload left, byte for byte.
//
// CAIRN_POWERLOSS_SAMPLES sets the random states drawn per crash point and
// model (default 2 in CI; docs/crash-testing.md gives the full run's counts).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cairn/state_manager.h"
#include "checkpoint/crash_pattern.h"
#include "powerloss/crash_model.h"
#include "powerloss/workloads.h"
#include "support/temp_dir.h"

namespace cairn::powerloss {
namespace {

namespace fs = std::filesystem;
using cairn::testing::TempDir;

// The repairs each reopening makes are logged at info; thousands of them
// would bury a failure.
const bool quiet_logs = [] { return ::setenv("CAIRN_LOG_LEVEL", "warn", 0) == 0; }();

int samples_per_point() {
  const char* env = std::getenv("CAIRN_POWERLOSS_SAMPLES");
  return env ? std::max(0, std::atoi(env)) : 2;
}

Image scan(const fs::path& root) {
  Image img;
  img.dirs.insert("");
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator();
       ++it) {
    const std::string rel = fs::relative(it->path(), root).generic_string();
    if (it->is_directory()) {
      img.dirs.insert(rel);
    } else if (it->is_regular_file()) {
      img.files[rel] = cairn::testing::read_text(it->path());
    }
  }
  return img;
}

void materialize(const Image& img, const fs::path& root) {
  fs::remove_all(root);
  fs::create_directories(root);
  for (const auto& d : img.dirs) fs::create_directories(root / d);
  for (const auto& [path, bytes] : img.files) cairn::testing::write_text(root / path, bytes);
}

// A folder for the states: tmpfs where there is one, so that the thousands
// of fsyncs the checks make cost nothing.
fs::path scratch_base() {
  std::error_code ec;
  if (fs::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0) return "/dev/shm";
  return fs::temp_directory_path();
}

// Runs the workload; with `trace`, under the recorder.
void run_workload(const Workload& w, const std::string& phase, const fs::path& exp,
                  const fs::path* trace) {
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (trace) {
      ::setenv("LD_PRELOAD", POWERLOSS_RECORDER, 1);
      ::setenv("CAIRN_POWERLOSS_ROOT", exp.parent_path().c_str(), 1);
      ::setenv("CAIRN_POWERLOSS_TRACE", trace->c_str(), 1);
      // In a sanitized build the recorder comes before the sanitizer's
      // runtime, which it then calls through; that order is intended.
      const char* asan = std::getenv("ASAN_OPTIONS");
      const std::string opts =
          std::string(asan ? asan : "") + (asan && *asan ? ":" : "") + "verify_asan_link_order=0";
      ::setenv("ASAN_OPTIONS", opts.c_str(), 1);
    }
    const std::string name(w.name);
    ::execl(POWERLOSS_WORKLOAD, POWERLOSS_WORKLOAD, name.c_str(), phase.c_str(), exp.c_str(),
            nullptr);
    ::_exit(127);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << w.name << " " << phase << " failed with status " << status;
}

std::set<uint64_t> committed(const fs::path& exp) {
  std::set<uint64_t> out;
  if (!fs::exists(exp)) return out;
  for (const auto& r : read_experiment(exp.string()).checkpoints) out.insert(r.index);
  return out;
}

// Expects checkpoint `r` to hold exactly the bytes its save wrote.
void expect_exact(const Workload& w, const CheckpointRecord& r, const std::string& where) {
  const Manifest m = r.checkpoint.manifest();
  ASSERT_TRUE(m.metrics.contains("seed")) << where << r.name;
  const uint64_t seed = m.metrics["seed"].get<uint64_t>();
  const int n = static_cast<int>(seed - seed_of(0));
  if (w.state_dict) {
    auto state = MappedState::open(r.checkpoint.storage(), "state.safetensors");
    const auto bytes = state.tensor("w").bytes;
    const std::string want = cairn::testing::crash_pattern(seed, 0, kStateBytes);
    EXPECT_TRUE(
        bytes.size() == want.size() &&
        std::equal(bytes.begin(), bytes.end(), reinterpret_cast<const std::byte*>(want.data())))
        << where << r.name << ": the state's bytes differ from the save's";
    return;
  }
  const auto sizes = file_sizes(n);
  ASSERT_EQ(m.files.size(), sizes.size()) << where << r.name;
  for (size_t f = 0; f < sizes.size(); ++f) {
    const std::string path = fmt::format("f{}.bin", f);
    EXPECT_EQ(r.checkpoint.storage().get(path),
              cairn::testing::crash_pattern(seed, static_cast<int>(f), sizes[f]))
        << where << r.name << "/" << path;
  }
}

struct Expectations {
  std::set<uint64_t> initial;                     // committed before the trace
  std::set<uint64_t> final;                       // committed when the workload ended
  std::map<uint64_t, size_t> committed_at;        // index -> the mark after its save
  std::map<uint64_t, size_t> deletion_starts_at;  // index -> its first removal
  // index -> (metadata version, the mark after its update returned)
  std::map<uint64_t, std::vector<std::pair<int, size_t>>> metadata_at;
  // The metadata version of each checkpoint at a crash before `point`: at
  // least the last update that returned, at most the last one begun.
  std::map<uint64_t, std::pair<int, int>> metadata_range(size_t point) const {
    std::map<uint64_t, std::pair<int, int>> out;
    for (const auto& [i, updates] : metadata_at) {
      int low = 0, high = 0;
      for (size_t u = 0; u < updates.size(); ++u) {
        if (updates[u].second < point) low = updates[u].first;
        // Update u begins after update u - 1's mark (or the commit's).
        const size_t begun = u == 0 ? committed_at.at(i) : updates[u - 1].second;
        if (begun < point) high = updates[u].first;
      }
      out[i] = {low, high};
    }
    return out;
  }
  // Checkpoints that must be committed at a crash before operation `point`.
  std::set<uint64_t> required(size_t point) const {
    std::set<uint64_t> out;
    auto alive = [&](uint64_t i) {
      auto d = deletion_starts_at.find(i);
      return d == deletion_starts_at.end() || point <= d->second;
    };
    for (uint64_t i : initial)
      if (alive(i)) out.insert(i);
    for (const auto& [i, at] : committed_at)
      if (at < point && alive(i)) out.insert(i);
    return out;
  }
};

Expectations expectations(const Trace& trace, std::set<uint64_t> initial,
                          std::set<uint64_t> final) {
  Expectations e{std::move(initial), std::move(final), {}, {}, {}};
  for (size_t i = 0; i < trace.ops.size(); ++i) {
    const Op& op = trace.ops[i];
    uint64_t index = 0;
    int version = 0;
    if (op.kind == OpKind::kMark && std::sscanf(op.path.c_str(), "committed %lu", &index) == 1) {
      e.committed_at[index] = i;
    }
    if (op.kind == OpKind::kMark &&
        std::sscanf(op.path.c_str(), "metadata %lu %d", &index, &version) == 2) {
      e.metadata_at[index].emplace_back(version, i);
    }
    if (op.kind == OpKind::kUnlink || op.kind == OpKind::kRmdir) {
      // exp/checkpoint_NNNNNN/...
      const size_t a = op.path.find('/');
      const size_t b = op.path.find('/', a + 1);
      if (a == std::string::npos) continue;
      auto idx =
          parse_checkpoint_name(op.path.substr(a + 1, b == std::string::npos ? b : b - a - 1));
      if (idx && !e.deletion_starts_at.count(*idx) &&
          (e.initial.count(*idx) || e.committed_at.count(*idx))) {
        e.deletion_starts_at[*idx] = i;
      }
    }
  }
  return e;
}

// The checks of one crash state, materialized at `root` (exp below it).
void check_state(const Workload& w, const fs::path& root, const std::set<uint64_t>& required,
                 const std::map<uint64_t, std::pair<int, int>>& metadata,
                 const std::string& where) {
  const fs::path exp = root / "exp";
  std::map<uint64_t, uint64_t> seeds;
  if (fs::exists(exp)) {
    ExperimentListing listing;
    try {
      listing = read_experiment(exp.string());
    } catch (const std::exception& e) {
      ADD_FAILURE() << where << "reading the experiment failed: " << e.what();
      return;
    }
    for (const auto& r : listing.checkpoints) {
      try {
        const auto problems = r.checkpoint.verify();
        EXPECT_TRUE(problems.empty())
            << where << r.name << " is committed but does not verify: "
            << (problems.empty() ? "" : problems[0].path + ": " + problems[0].reason);
        if (!problems.empty()) continue;
        expect_exact(w, r, where);
        seeds[r.index] = r.checkpoint.manifest().metrics["seed"].get<uint64_t>();
        if (auto m = metadata.find(r.index); m != metadata.end()) {
          // The previous metadata or the new one, never neither.
          const nlohmann::json meta = r.checkpoint.get_metadata();
          const int v = meta.value("v", 0);
          EXPECT_TRUE(v >= m->second.first && v <= m->second.second)
              << where << r.name << ": metadata version " << v << ", expected " << m->second.first
              << " to " << m->second.second;
          if (v > 0) {
            EXPECT_EQ(meta.value("pad", std::string()), std::string(kMetadataPad, 'a' + v))
                << where << r.name << ": the metadata of update " << v << " is not whole";
          }
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << where << r.name << " is committed but unreadable: " << e.what();
      }
    }
  }
  for (uint64_t i : required) {
    EXPECT_TRUE(seeds.count(i)) << where << checkpoint_name(i)
                                << " was saved (its save returned) but is not committed";
  }
  // A new manager repairs without help and agrees with storage.
  try {
    ManagerOptions quiet;
    quiet.warn = [](const std::string&) {};
    std::vector<CheckpointRecord> history;
    if (w.state_dict) {
      StateCheckpointOptions o;
      o.max_to_keep = w.num_to_keep;
      o.manager = quiet;
      StateCheckpointManager manager(exp.string(), o);
      history = manager.base().history();
    } else {
      quiet.background_delete = w.background_delete;
      CheckpointManager manager(exp.string(), config_of(w), quiet);
      history = manager.history();
    }
    const ExperimentListing after = read_experiment(exp.string());
    EXPECT_TRUE(after.uncommitted.empty())
        << where << "left uncommitted: " << after.uncommitted.front();
    std::set<uint64_t> stored, recorded;
    for (const auto& r : after.checkpoints) stored.insert(r.index);
    for (const auto& r : history) {
      recorded.insert(r.index);
      auto s = seeds.find(r.index);
      EXPECT_TRUE(s != seeds.end() && r.metrics.value("seed", uint64_t{0}) == s->second)
          << where << r.name << ": the history's record does not match its manifest";
    }
    EXPECT_EQ(recorded, stored) << where << "history and storage disagree after reopening";
    // Retention on open may delete older ones, never the newest committed.
    if (!seeds.empty()) {
      EXPECT_TRUE(recorded.count(seeds.rbegin()->first))
          << where << checkpoint_name(seeds.rbegin()->first)
          << ", the newest committed, vanished on reopening";
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << where << "reopening the experiment failed: " << e.what();
  }
}

std::string image_key(const Image& img) {
  std::string k;
  for (const auto& d : img.dirs) k += "d" + d + '\0';
  for (const auto& [p, b] : img.files) {
    k += "f" + p + '\0' + std::to_string(std::hash<std::string>{}(b)) + '\0' +
         std::to_string(b.size()) + '\0';
  }
  return k;
}

class PowerLoss : public ::testing::TestWithParam<Workload> {};

}  // namespace

void PrintTo(const Workload& w, std::ostream* os) { *os << w.name; }

namespace {

TEST_P(PowerLoss, EveryCommittedCheckpointSurvivesEveryCrashState) {
  const Workload& w = GetParam();
  TempDir dir;
  // The workload runs on tmpfs where there is one (the history workload's
  // setup alone makes a thousand fsyncs), but a direct save needs a file
  // system with O_DIRECT.
  const fs::path base = w.state_dict ? fs::canonical(dir.path()) : fs::canonical(scratch_base());
  const fs::path root = base / fmt::format("cairn-powerloss-{}-{}-run", ::getpid(), w.name);
  const fs::path exp = root / "exp";
  const fs::path trace_path = dir / "trace";
  fs::create_directories(root);
  struct RemoveRoot {
    fs::path p;
    ~RemoveRoot() {
      std::error_code ec;
      fs::remove_all(p, ec);  // ignore-error: scratch space of a test
    }
  } remove_root{root};
  ASSERT_NO_FATAL_FAILURE(run_workload(w, "setup", exp, nullptr));
  const Image initial = scan(root);
  const std::set<uint64_t> before = committed(exp);
  ASSERT_NO_FATAL_FAILURE(run_workload(w, "act", exp, &trace_path));
  const std::set<uint64_t> after = committed(exp);

  const Trace trace = parse_trace(cairn::testing::read_text(trace_path), initial);
  if (w.state_dict) {
    EXPECT_GT(trace.direct_opens, 0) << "the save did not use O_DIRECT";
    EXPECT_TRUE(std::any_of(trace.ops.begin(), trace.ops.end(), [](const Op& op) {
      return op.kind == OpKind::kFallocate;
    })) << "the save did not preallocate";
  }
  const Expectations expect = expectations(trace, before, after);
  ASSERT_EQ(expect.committed_at.size(), static_cast<size_t>(w.act_saves));
  if (w.name == "history") {
    // The recorded saves cross a compaction: a new snapshot, the log removed.
    bool snapshot = false, log_removed = false;
    for (const Op& op : trace.ops) {
      snapshot |= op.kind == OpKind::kRename && op.path2 == "exp/checkpoint_manager.json";
      log_removed |=
          op.kind == OpKind::kUnlink && op.path.rfind("exp/checkpoint_manager.log/", 0) == 0;
    }
    EXPECT_TRUE(snapshot && log_removed) << "the history workload did not compact";
  }
  size_t updates = 0;
  for (const auto& [i, u] : expect.metadata_at) updates += u.size();
  ASSERT_EQ(updates, static_cast<size_t>(w.metadata_updates * w.act_saves));

  const fs::path scratch =
      scratch_base() / fmt::format("cairn-powerloss-{}-{}", ::getpid(), w.name);
  struct Cleanup {
    fs::path p;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(p, ec);  // ignore-error: scratch space of a test
    }
  } cleanup{scratch};

  const int samples = samples_per_point();
  size_t points = 0, generated = 0, checked = 0;
  for (Model model : {Model::kExt4Ordered, Model::kPerDirectory}) {
    CrashStates states(trace, initial, model);
    // The recording is complete: replayed whole, it is the folder as left.
    if (model == Model::kExt4Ordered) {
      const Image replayed = states.issued(trace.ops.size());
      const Image real = scan(root);
      EXPECT_EQ(replayed.dirs, real.dirs);
      for (const auto& [path, bytes] : real.files) {
        auto it = replayed.files.find(path);
        EXPECT_TRUE(it != replayed.files.end() && it->second == bytes)
            << path << " differs between the folder and the replayed trace";
      }
      EXPECT_EQ(replayed.files.size(), real.files.size());
      ASSERT_FALSE(HasFailure()) << "the trace does not rebuild the workload's folder";
    }
    std::mt19937_64 rng(0x9e3779b9u + static_cast<uint64_t>(model));
    std::set<std::string> seen;
    for (size_t point : states.crash_points()) {
      ++points;
      for (const CrashState& s : states.states_at(point, samples, rng)) {
        ++generated;
        if (!seen.insert(image_key(s.image)).second) continue;
        ++checked;
        materialize(s.image, scratch);
        const std::string where =
            fmt::format("[{} model, {}]\n", model == Model::kExt4Ordered ? "ext4" : "per-directory",
                        states.describe(s.choice));
        check_state(w, scratch, expect.required(s.choice.crash_point),
                    expect.metadata_range(s.choice.crash_point), where);
        if (HasFailure()) return;
      }
    }
  }
  std::cout << fmt::format(
      "powerloss {}: {} operations, {} crash points, {} states generated, {} distinct checked\n",
      w.name, trace.ops.size(), points, generated, checked);
  EXPECT_GT(checked, 0u);
}

INSTANTIATE_TEST_SUITE_P(Workloads, PowerLoss, ::testing::ValuesIn(kWorkloads),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace cairn::powerloss
