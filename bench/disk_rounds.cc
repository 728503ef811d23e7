// Disk rounds: Cairn's manager saves and cold loads judged against fio run
// inside every round, under the condition a manager saves in (the previous
// checkpoint still on disk). See disk_rounds.h.
#include "disk_rounds.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "bench_util.h"
#include "cairn/state.h"
#include "cairn/state_manager.h"

namespace cairn::bench {

namespace {

namespace fs = std::filesystem;

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

fs::path state_file(const CheckpointRecord& r) {
  std::string uri = r.checkpoint.uri();
  const std::string scheme = "file://";
  if (uri.rfind(scheme, 0) == 0) uri = uri.substr(scheme.size());
  return fs::path(uri) / std::string(kStateFileName);
}

}  // namespace

nlohmann::json run_disk_rounds(const Options& opts, const std::vector<TensorSpec>& specs,
                               const StateDict& state, StateDict& target,
                               const std::function<bool()>& same) {
  const uint64_t bytes = total_bytes(specs);
  const fs::path dir = opts.dir / "disk-rounds";
  fs::remove_all(dir);
  fs::create_directories(dir);
  StateCheckpointOptions direct_options;
  direct_options.max_to_keep = 1;
  direct_options.write.io = IoPath::kAuto;
  StateCheckpointOptions buffered_options = direct_options;
  buffered_options.write.io = IoPath::kBuffered;
  // The default frees the previous checkpoint's space on the manager's
  // deleter thread (ManagerOptions::background_delete), waited for untimed
  // after each save; the same direct saves deleting inside the save, too.
  StateCheckpointOptions inline_options = direct_options;
  inline_options.manager.background_delete = false;
  StateCheckpointManager direct_mgr((dir / "direct").string(), direct_options);
  StateCheckpointManager buffered_mgr((dir / "buffered").string(), buffered_options);
  StateCheckpointManager inline_mgr((dir / "inline").string(), inline_options);

  std::map<std::string, std::vector<double>> seconds;  // name -> per round
  std::string cache_drop;
  std::string load_path;
  // A cold read: the page cache dropped, then (--idle-s) the machine idle.
  auto cold = [&](const fs::path& file) {
    cache_drop = drop_caches({file});
    if (opts.idle_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(opts.idle_s));
  };
  auto timed = [&](const std::string& name, const std::function<void()>& fn) {
    sync_all();
    const double t0 = now_seconds();
    fn();
    seconds[name].push_back(now_seconds() - t0);
  };
  // fio's O_DIRECT writes rotate over two files: each write replaces the
  // older one while the other is kept, as a manager writes a checkpoint while
  // the previous one is kept.
  int fio_writes = 0;
  fs::path fio_file;
  auto fio_write_direct = [&] {
    fio_file = dir / fmt::format("fio.{}", fio_writes++ % 2);
    fs::remove(fio_file);
    sync_all();
    const double s =
        run_fio(opts.fio, concat(fio_args(fio_file, bytes, true), {"--rw=write", "--end_fsync=1"}),
                "write");
    seconds["fio.write_direct"].push_back(s);
    return s;
  };
  for (int round = 0; round < opts.runs; ++round) {
    // The disk's speed drifts within seconds here, so each direct manager
    // save runs between two fio O_DIRECT writes and is judged against their
    // mean; the two saves swap places every round.
    std::optional<CheckpointRecord> direct_record;
    auto save_direct = [&] {
      timed("cairn.manager_save", [&] { direct_record = direct_mgr.save(state, round); });
      direct_mgr.wait();
    };
    auto save_inline = [&] {
      timed("cairn.manager_save_inline_delete", [&] { inline_mgr.save(state, round); });
    };
    const bool swap = round % 2 == 1;
    const double first = fio_write_direct();
    swap ? save_inline() : save_direct();
    const double middle = fio_write_direct();
    swap ? save_direct() : save_inline();
    const double last = fio_write_direct();
    seconds["fio.write_direct.around_manager_save"].push_back(swap ? (middle + last) / 2
                                                                   : (first + middle) / 2);
    seconds["fio.write_direct.around_inline_delete"].push_back(swap ? (first + middle) / 2
                                                                    : (middle + last) / 2);

    // Buffered: fio, then Cairn, each right after the last direct write.
    fs::remove(dir / "fio.buffered");
    sync_all();
    seconds["fio.write_buffered"].push_back(run_fio(
        opts.fio,
        concat(fio_args(dir / "fio.buffered", bytes, false), {"--rw=write", "--end_fsync=1"}),
        "write"));
    fs::remove(dir / "fio.buffered");
    timed("cairn.manager_save_buffered", [&] { buffered_mgr.save(state, round); });
    buffered_mgr.wait();
    seconds["fio.write_direct.before_buffered"].push_back(last);

    cold(fio_file);
    seconds["fio.read_direct"].push_back(
        run_fio(opts.fio, concat(fio_args(fio_file, bytes, true), {"--rw=read"}), "read"));
    cold(fio_file);
    seconds["fio.read_buffered"].push_back(
        run_fio(opts.fio, concat(fio_args(fio_file, bytes, false), {"--rw=read", "--invalidate=1"}),
                "read"));

    const fs::path file = state_file(*direct_record);
    IoReport load_report;
    cold(file);
    timed("cairn.cold_load", [&] { load_into(file, target, {.report = &load_report}); });
    if (!same()) throw std::runtime_error("disk rounds: the direct load read different bytes");
    cold(file);
    timed("cairn.cold_load_buffered", [&] { load_into(file, target, {.io = IoPath::kBuffered}); });
    if (!same()) throw std::runtime_error("disk rounds: the buffered load read different bytes");
    load_path = load_report.path == IoPath::kDirect ? "direct" : "buffered: " + load_report.reason;
  }
  fs::remove_all(dir);

  // Ratios per round (bandwidth of Cairn / bandwidth of the reference, i.e.
  // reference time / Cairn time), then their median.
  auto ratio = [&](const std::string& cairn, const std::string& ref) {
    std::vector<double> r;
    for (size_t i = 0; i < seconds[cairn].size(); ++i) {
      r.push_back(seconds[ref][i] / seconds[cairn][i]);
    }
    return nlohmann::json{{"cairn", cairn},
                          {"reference", ref},
                          {"per_round", r},
                          {"median", median(r)},
                          {"min", *std::min_element(r.begin(), r.end())},
                          {"max", *std::max_element(r.begin(), r.end())}};
  };
  nlohmann::json out;
  out["bytes"] = bytes;
  out["rounds"] = opts.runs;
  out["cache_drop"] = cache_drop;
  out["idle_s"] = opts.idle_s;
  out["load_path"] = load_path;
  for (const auto& [name, s] : seconds) {
    std::vector<double> gbps;
    for (double t : s) gbps.push_back(static_cast<double>(bytes) / t / 1e9);
    out["gbps"][name] = gbps;
  }
  out["ratios"] = {
      ratio("cairn.manager_save", "fio.write_direct.around_manager_save"),
      ratio("cairn.manager_save_inline_delete", "fio.write_direct.around_inline_delete"),
      ratio("cairn.manager_save_buffered", "fio.write_direct.before_buffered"),
      ratio("cairn.manager_save", "fio.write_buffered"),
      ratio("cairn.cold_load", "fio.read_direct"),
      ratio("cairn.cold_load_buffered", "fio.read_direct"),
      ratio("cairn.cold_load", "fio.read_buffered"),
  };
  return out;
}

}  // namespace cairn::bench
