// Cairn's side of the benchmark, plus the plain memcpy reference.
//
//   cairn_bench --size-mib N --runs N --dir DIR [--out FILE]
//   cairn_bench --size-mib N --workload      (prints the workload as JSON)
//   cairn_bench --many-tensors N --runs N --dir DIR [--out FILE]
//                                            (tensor-count scaling, below)
//   cairn_bench --save-load --size-mib N --runs N --dir DIR [--out FILE]
//                                            (memcpy, save, cold loads and the
//                                            AsyncSaver stall only: the engine's
//                                            side of bench/python_bench.py)
//
// Run 0 of each measurement is the first run in this process (fresh memory
// where the operation allocates); later runs are steady state. See
// docs/benchmarks.md for what each figure means.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "bench_util.h"
#include "disk_rounds.h"
#include "reshard.h"

#include "cairn/async_save.h"
#include "cairn/error.h"
#include "cairn/manager.h"
#include "cairn/state.h"
#include "cairn/state_manager.h"

namespace cb = cairn::bench;

namespace {

// memcpy of the whole state into destination buffers allocated once: run 0
// also pays the first touch of the destination, later runs reuse it. This is
// the reference for the async-save stall.
cb::Measurement bench_memcpy(const std::vector<cb::TensorSpec>& specs,
                             const std::vector<cb::FloatBuffer>& state, int runs) {
  std::vector<cb::FloatBuffer> dst;
  for (const auto& s : specs) dst.emplace_back(s.numel());
  return cb::measure(
      "memcpy", "memcpy of every tensor into buffers allocated once (1 thread)",
      cb::total_bytes(specs), runs, [](int) {},
      [&](int) {
        for (size_t i = 0; i < specs.size(); ++i) {
          std::memcpy(dst[i].data(), state[i].data(), specs[i].bytes());
        }
      });
}

cairn::Shape to_shape(const std::vector<int64_t>& v) { return {v.begin(), v.end()}; }

// A StateDict viewing `buffers` (writable, so it can be loaded into).
cairn::StateDict view_state(const std::vector<cb::TensorSpec>& specs,
                            const std::vector<cb::FloatBuffer>& buffers) {
  cairn::StateDict state;
  for (size_t i = 0; i < specs.size(); ++i) {
    state.add_mutable<float>(specs[i].name, to_shape(specs[i].shape), buffers[i].span());
  }
  return state;
}

void check_same(const std::vector<cb::TensorSpec>& specs, const std::vector<cb::FloatBuffer>& a,
                const std::vector<cb::FloatBuffer>& b, const char* what) {
  for (size_t i = 0; i < specs.size(); ++i) {
    if (std::memcmp(a[i].data(), b[i].data(), specs[i].bytes()) != 0) {
      throw std::runtime_error(std::string(what) + " returned different bytes for " +
                               specs[i].name);
    }
  }
}

// Times a durable save of `state` to `path`, then cold loads of the file
// into preallocated buffers and through a mapping, each checked against
// `state`. Measurement names are "<prefix>.save", ".load_copy", ".load_mmap".
void measure_save_and_cold_loads(const cb::Options& opts, const std::string& prefix,
                                 const std::vector<cb::TensorSpec>& specs,
                                 const std::vector<cb::FloatBuffer>& state,
                                 const std::filesystem::path& path, std::string& cache_drop,
                                 std::vector<cb::Measurement>& results) {
  const uint64_t bytes = cb::total_bytes(specs);
  const cairn::StateDict sd = view_state(specs, state);
  results.push_back(cb::measure(
      prefix + ".save", "save_file: parallel block writes, fsync file + directory, atomic rename",
      bytes, opts.runs,
      [&](int) {
        std::filesystem::remove(path);
        cb::sync_all();
      },
      [&](int) { cairn::save_file(sd, path); }));

  auto cold = [&](int) { cache_drop = cb::drop_caches({path}); };
  {
    std::vector<cb::FloatBuffer> dst;
    for (const auto& s : specs) {
      dst.emplace_back(s.numel());
      std::memset(dst.back().data(), 0, s.bytes());  // preallocated: already touched
    }
    cairn::StateDict target = view_state(specs, dst);
    results.push_back(cb::measure(
        prefix + ".load_copy", "load_into buffers allocated and touched beforehand, cold cache",
        bytes, opts.runs, cold, [&](int) { cairn::load_into(path, target); }));
    check_same(specs, state, dst, "load_into");
  }
  {
    uint64_t expected = 0;
    for (size_t i = 0; i < specs.size(); ++i) {
      expected += cb::touch_all(std::as_bytes(state[i].span()));
    }
    uint64_t sum = 0;
    results.push_back(
        cb::measure(prefix + ".load_mmap",
                    "MappedState::open, then read every byte of every tensor by name, cold cache",
                    bytes, opts.runs, cold, [&](int) {
                      cairn::MappedState m = cairn::MappedState::open(path);
                      sum = 0;
                      for (const auto& s : specs) sum += cb::touch_all(m.tensor(s.name).bytes);
                    }));
    if (sum != expected) throw std::runtime_error("mmap load read different bytes");
  }
}

// Times cold loads of `path` into newly allocated buffers (what torch.load
// and a copying cairn.load do), checked against `state`: "cairn.load_fresh".
void measure_fresh_load(const cb::Options& opts, const std::vector<cb::TensorSpec>& specs,
                        const std::vector<cb::FloatBuffer>& state,
                        const std::filesystem::path& path, std::string& cache_drop,
                        std::vector<cb::Measurement>& results) {
  const uint64_t bytes = cb::total_bytes(specs);
  auto cold = [&](int) { cache_drop = cb::drop_caches({path}); };
  {
    std::vector<cb::FloatBuffer> last;
    results.push_back(cb::measure(
        "cairn.load_fresh", "allocate new buffers + load_into, cold cache (what torch.load does)",
        bytes, opts.runs,
        [&](int run) {
          last.clear();
          cold(run);
        },
        [&](int) {
          std::vector<cb::FloatBuffer> dst;
          dst.reserve(specs.size());
          for (const auto& s : specs) dst.emplace_back(s.numel());
          cairn::StateDict target = view_state(specs, dst);
          cairn::load_into(path, target);
          last = std::move(dst);
        }));
    check_same(specs, state, last, "load_into (fresh buffers)");
  }
}

// AsyncSaver::save into a CheckpointManager keeping one checkpoint, until it
// returns (staging allocated by the first run, reused after), then waited
// for: "cairn.async_saver_stall", what cairn.torch.AsyncSaver.save calls.
void measure_async_saver_stall(const cb::Options& opts, const std::vector<cb::TensorSpec>& specs,
                               const std::vector<cb::FloatBuffer>& state,
                               std::vector<cb::Measurement>& results) {
  const cairn::StateDict sd = view_state(specs, state);
  const auto exp = opts.dir / "cairn-saver-exp";
  cairn::CheckpointConfig config;
  config.num_to_keep = 1;
  cb::Measurement stall{"cairn.async_saver_stall",
                        "AsyncSaver::save into a CheckpointManager until it returns (run 1 "
                        "allocates staging)",
                        cb::total_bytes(specs),
                        {}};
  {
    cairn::CheckpointManager manager(exp.string(), config);
    cairn::AsyncSaver saver;
    for (int run = 0; run < opts.runs; ++run) {
      cb::sync_all();
      const double t0 = cb::now_seconds();
      cairn::SaveHandle h = saver.save(sd, manager);
      stall.runs_s.push_back(cb::now_seconds() - t0);
      h.wait();
    }
  }
  std::filesystem::remove_all(exp);
  results.push_back(stall);
}

void bench_cairn(const cb::Options& opts, const std::vector<cb::TensorSpec>& specs,
                 const std::vector<cb::FloatBuffer>& state, std::string& cache_drop,
                 std::vector<cb::Measurement>& results) {
  const uint64_t bytes = cb::total_bytes(specs);
  const cairn::StateDict sd = view_state(specs, state);
  const auto path = opts.dir / "cairn.safetensors";

  // A save, then loads of the file just saved, each from a cold page cache.
  measure_save_and_cold_loads(opts, "cairn", specs, state, path, cache_drop, results);
  measure_fresh_load(opts, specs, state, path, cache_drop, results);
  std::filesystem::remove(path);

  // Through the manager: the full checkpoint path (manifest with checksums,
  // commit, retention) and the async save's stall.
  const auto exp = opts.dir / "cairn-exp";
  {
    cairn::StateCheckpointOptions o;
    o.max_to_keep = 1;
    cairn::StateCheckpointManager mgr(exp.string(), o);
    results.push_back(cb::measure(
        "cairn.save_checkpoint",
        "StateCheckpointManager::save: file + manifest (checksums) + commit, max_to_keep 1", bytes,
        opts.runs, [&](int) { cb::sync_all(); },
        [&](int run) { mgr.save(sd, static_cast<uint64_t>(run)); }));
  }
  std::filesystem::remove_all(exp);
  {
    cairn::StateCheckpointOptions o;
    o.max_to_keep = 1;
    cairn::StateCheckpointManager mgr(exp.string(), o);
    cb::Measurement stall{"cairn.async_stall",
                          "StateCheckpointManager::save_async until it returns (the training "
                          "loop's stall: snapshot into reused staging memory)",
                          bytes,
                          {}};
    cb::Measurement total{"cairn.async_total",
                          "save_async + wait: snapshot, parallel write, fsync, commit",
                          bytes,
                          {}};
    for (int run = 0; run < opts.runs; ++run) {
      cb::sync_all();
      const double t0 = cb::now_seconds();
      auto h = mgr.save_async(sd, static_cast<uint64_t>(1000 + run));
      const double t1 = cb::now_seconds();
      if (!h) throw std::runtime_error("save_async skipped a save");
      h->wait();
      const double t2 = cb::now_seconds();
      stall.runs_s.push_back(t1 - t0);
      total.runs_s.push_back(t2 - t0);
    }
    results.push_back(stall);
    results.push_back(total);
  }
  std::filesystem::remove_all(exp);
}

// The median of `v` (empty: 0).
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// ---- the first async save, its staging reserved in the background ----
//
// After a restore() that began readying `mgr`'s staging: waits for that
// background work to hold `bytes` (bounded by it: it ends or fails), then
// times the first save_async() of `sd` as `step`. Returns {the wait, the
// save's stall}.
std::pair<double, double> first_save_after_preparation(cairn::StateCheckpointManager& mgr,
                                                       const cairn::StateDict& sd, uint64_t bytes,
                                                       uint64_t step) {
  const double begin = cb::now_seconds();
  for (;;) {
    const auto stats = mgr.async_stats();
    if (!stats) throw std::runtime_error("restore() prepared no staging");
    if (stats->staging_bytes >= bytes) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const double waited = cb::now_seconds() - begin;
  cb::sync_all();
  const double t0 = cb::now_seconds();
  auto h = mgr.save_async(sd, step);
  const double stall = cb::now_seconds() - t0;
  if (!h) throw std::runtime_error("save_async skipped the first save");
  h->wait();
  return {waited, stall};
}

// StateCheckpointManager::reserve() readies the staging on the saver's
// thread while the caller goes on: here a sleep standing for a training
// loop's first steps, twice as long as a foreground reserve() took
// (cairn.async_reserve). Every run is a fresh manager, so every run is a
// first save: cairn.async_reserve_call is the caller's wait in reserve(),
// cairn.async_first_reserved the first save_async()'s stall.
// `foreground`: the cairn.async_reserve measurement of the same state.
void bench_reserve_in_background(const cb::Options& opts, const cairn::StateDict& sd,
                                 const cb::Measurement& foreground,
                                 std::vector<cb::Measurement>& results) {
  const double gap = 2 * median(foreground.runs_s);
  const uint64_t bytes = foreground.bytes;
  cb::Measurement call{"cairn.async_reserve_call",
                       "StateCheckpointManager::reserve(state): the caller's wait (the work "
                       "runs on the saver's thread)",
                       bytes,
                       {}};
  cb::Measurement first{"cairn.async_first_reserved",
                        "StateCheckpointManager::save_async stall of a fresh manager's first "
                        "save, reserve() called ahead (every run a first save)",
                        bytes,
                        {}};
  const auto dir = opts.dir / "cairn-reserve-exp";
  for (int run = 0; run < opts.runs; ++run) {
    std::filesystem::remove_all(dir);
    cairn::StateCheckpointOptions o;
    o.max_to_keep = 1;
    cairn::StateCheckpointManager mgr(dir.string(), o);
    double t0 = cb::now_seconds();
    mgr.reserve(sd);
    call.runs_s.push_back(cb::now_seconds() - t0);
    std::this_thread::sleep_for(std::chrono::duration<double>(gap));
    cb::sync_all();
    t0 = cb::now_seconds();
    auto h = mgr.save_async(sd, 1);
    first.runs_s.push_back(cb::now_seconds() - t0);
    if (!h) throw std::runtime_error("save_async skipped the first save");
    h->wait();
  }
  std::filesystem::remove_all(dir);
  results.push_back(call);
  results.push_back(first);

  // A resumed run, in the default configuration: a fresh manager opens an
  // experiment a synchronous save left and restore()s it, which readies the
  // staging on the saver's thread (StateCheckpointOptions::
  // prepare_async_on_restore) while the run trains; then its first
  // save_async(). cairn.async_resume_prepare is how long that background
  // work took after restore() returned (no one waits for it unless the first
  // save comes sooner), cairn.async_first_resumed the first save's stall
  // once it is done.
  cb::Measurement prepare{"cairn.async_resume_prepare",
                          "after StateCheckpointManager::restore returns: the staging readied "
                          "on the saver's thread (background, not a stall)",
                          bytes,
                          {}};
  cb::Measurement resumed{"cairn.async_first_resumed",
                          "StateCheckpointManager::save_async stall of a resumed run's first "
                          "save, after restore()'s preparation, default options (every run a "
                          "first save)",
                          bytes,
                          {}};
  for (int run = 0; run < opts.runs; ++run) {
    std::filesystem::remove_all(dir);
    cairn::StateCheckpointOptions o;
    o.max_to_keep = 1;
    cairn::StateCheckpointManager(dir.string(), o).save(sd, 0);
    cairn::StateCheckpointManager mgr(dir.string(), o);
    cairn::StateDict target = sd;
    mgr.restore(target);
    const auto [waited, stall] = first_save_after_preparation(mgr, sd, bytes, 1);
    prepare.runs_s.push_back(waited);
    resumed.runs_s.push_back(stall);
  }
  std::filesystem::remove_all(dir);
  results.push_back(prepare);
  results.push_back(resumed);

  // A fresh run written as restore-or-start, default options: its restore()
  // finds no checkpoint, readies the staging for the state it was given
  // (then raises kNotFound), and the run's first save_async() comes once
  // that background work is done.
  cb::Measurement fresh{"cairn.async_first_fresh",
                        "StateCheckpointManager::save_async stall of a fresh run's first save "
                        "after a restore() that found no checkpoint, default options (every run "
                        "a first save)",
                        bytes,
                        {}};
  for (int run = 0; run < opts.runs; ++run) {
    std::filesystem::remove_all(dir);
    cairn::StateCheckpointOptions o;
    o.max_to_keep = 1;
    cairn::StateCheckpointManager mgr(dir.string(), o);
    cairn::StateDict target = sd;
    try {
      mgr.restore(target);
      throw std::runtime_error("a fresh directory had a checkpoint");
    } catch (const cairn::Error& e) {
      if (e.code() != cairn::ErrorCode::kNotFound) throw;
    }
    fresh.runs_s.push_back(first_save_after_preparation(mgr, sd, bytes, 0).second);
  }
  std::filesystem::remove_all(dir);
  results.push_back(fresh);
}

// ---- async saves: staging reserved ahead, and saves issued while one writes ----
//
// AsyncSaver directly, into a CheckpointManager keeping one checkpoint.
//   cairn.async_reserved: save + wait on a saver whose staging reserve()
//     allocated and touched beforehand; run 0 is the first save after
//     reserve(), later runs are steady state. cairn.async_reserve times the
//     reserve() calls themselves (fresh memory each run).
//   cairn.async_busy_{wait,extra,skip}: a save issued right after another,
//     while that one is writing, under each WhenBusy policy (staging reserved
//     for every buffer the policy may use); the stall of the second save.
// Peak memory: the state plus two staging buffers of its size (kExtraBuffer).
void bench_async_policies(const cb::Options& opts, const std::vector<cb::TensorSpec>& specs,
                          const std::vector<cb::FloatBuffer>& state,
                          std::vector<cb::Measurement>& results) {
  const uint64_t bytes = cb::total_bytes(specs);
  const cairn::StateDict sd = view_state(specs, state);
  const auto exp = opts.dir / "cairn-async-exp";
  cairn::CheckpointConfig config;
  config.num_to_keep = 1;
  auto seconds_since = [](double t0) { return cb::now_seconds() - t0; };
  {
    cb::Measurement reserve{"cairn.async_reserve",
                            "AsyncSaver::reserve(state): allocate staging and write every page "
                            "(fresh memory each run)",
                            bytes,
                            {}};
    cb::Measurement first{"cairn.async_reserved",
                          "AsyncSaver::save stall after reserve(): run 1 is the first save "
                          "after reserve(), later runs steady state",
                          bytes,
                          {}};
    {
      cairn::CheckpointManager manager(exp.string(), config);
      cairn::AsyncSaver saver;
      for (int run = 0; run < opts.runs; ++run) {
        cb::sync_all();
        if (run == 0) {
          const double t0 = cb::now_seconds();
          saver.reserve(sd);
          reserve.runs_s.push_back(seconds_since(t0));
        }
        const double t0 = cb::now_seconds();
        cairn::SaveHandle h = saver.save(sd, manager);
        first.runs_s.push_back(seconds_since(t0));
        h.wait();
      }
      if (saver.stats().staging_allocations != 1) {
        throw std::runtime_error("a save after reserve() allocated staging");
      }
    }
    // reserve() again on fresh savers: its own cost, run after run.
    for (int run = 1; run < opts.runs; ++run) {
      cairn::AsyncSaver saver;
      const double t0 = cb::now_seconds();
      saver.reserve(sd);
      reserve.runs_s.push_back(seconds_since(t0));
    }
    results.push_back(reserve);
    results.push_back(first);
    std::filesystem::remove_all(exp);
    bench_reserve_in_background(opts, sd, reserve, results);
  }
  std::filesystem::remove_all(exp);

  {
    // The state's tensors dealt to 4 ranks of this process, whole (a tensor
    // held by one rank is a valid sharded layout), saved with save_sharded.
    cb::Measurement sharded{"cairn.async_sharded_stall",
                            "AsyncSaver::save_sharded stall, the state's tensors spread over 4 "
                            "ranks of one process, staging reserved: run 1 is the first save "
                            "after reserve(), later runs steady state",
                            bytes,
                            {}};
    std::vector<cairn::ShardedPart> parts(4);
    for (size_t r = 0; r < parts.size(); ++r) parts[r].rank = static_cast<int>(r);
    size_t next = 0;
    for (const auto& [name, e] : sd.entries()) {
      parts[next++ % parts.size()].state.add(name, e.dtype, e.shape, {e.data, e.nbytes});
    }
    {
      cairn::CheckpointManager manager(exp.string(), config);
      cairn::AsyncSaver saver;
      saver.reserve(parts);
      for (int run = 0; run < opts.runs; ++run) {
        cb::sync_all();
        const double t0 = cb::now_seconds();
        cairn::SaveHandle h = saver.save_sharded(parts, manager);
        sharded.runs_s.push_back(seconds_since(t0));
        h.wait();
      }
      if (saver.stats().staging_allocations != 1) {
        throw std::runtime_error("a sharded save after reserve() allocated staging");
      }
    }
    std::filesystem::remove_all(exp);
    results.push_back(sharded);
  }

  struct Policy {
    const char* name;
    cairn::WhenBusy when_busy;
    unsigned buffers;
  };
  for (const Policy& p : {Policy{"wait", cairn::WhenBusy::kWait, 1},
                          Policy{"extra", cairn::WhenBusy::kExtraBuffer, 2},
                          Policy{"skip", cairn::WhenBusy::kSkip, 1}}) {
    cb::Measurement busy{
        std::string("cairn.async_busy_") + p.name,
        fmt::format("stall of a save issued while the previous one writes, when_busy = {}", p.name),
        bytes,
        {}};
    {
      cairn::CheckpointManager manager(exp.string(), config);
      cairn::AsyncSaveOptions o;
      o.when_busy = p.when_busy;
      cairn::AsyncSaver saver(o);
      saver.reserve(sd, p.buffers);
      for (int run = 0; run < opts.runs; ++run) {
        cb::sync_all();
        cairn::SaveHandle a = saver.save(sd, manager);
        const double t0 = cb::now_seconds();
        cairn::SaveHandle b = saver.save(sd, manager);
        busy.runs_s.push_back(seconds_since(t0));
        if (b.skipped() != (p.when_busy == cairn::WhenBusy::kSkip)) {
          throw std::runtime_error(fmt::format("when_busy = {}: unexpected skip", p.name));
        }
        saver.wait_all();
      }
      if (saver.stats().staging_allocations != p.buffers) {
        throw std::runtime_error(
            fmt::format("when_busy = {}: staging allocated after reserve()", p.name));
      }
    }
    std::filesystem::remove_all(exp);
    results.push_back(busy);
  }
}

// Stall figures of the async saves as ratios to the memcpy reference (both
// first run and steady state), printed and returned for the report.
nlohmann::json async_ratios(const std::vector<cb::Measurement>& results) {
  auto find = [&](const std::string& name) -> const cb::Measurement* {
    for (const auto& m : results) {
      if (m.name == name) return &m;
    }
    return nullptr;
  };
  auto steady = [](const cb::Measurement& m) {
    std::vector<double> later(m.runs_s.begin() + (m.runs_s.size() > 1 ? 1 : 0), m.runs_s.end());
    std::sort(later.begin(), later.end());
    return later.empty() ? 0.0 : later[later.size() / 2];
  };
  const cb::Measurement* memcpy_ref = find("memcpy");
  nlohmann::json out = nlohmann::json::object();
  if (!memcpy_ref || memcpy_ref->runs_s.empty()) return out;
  const double ref = steady(*memcpy_ref);
  if (ref <= 0) return out;
  std::cerr << fmt::format("async stalls vs memcpy of the state ({:.3f} s, steady):\n", ref);
  for (const char* name :
       {"cairn.async_stall", "cairn.async_reserve", "cairn.async_reserved",
        "cairn.async_reserve_call", "cairn.async_first_reserved", "cairn.async_resume_prepare",
        "cairn.async_first_resumed", "cairn.async_first_fresh", "cairn.async_busy_wait",
        "cairn.async_busy_extra", "cairn.async_busy_skip", "cairn.async_sharded_stall"}) {
    const cb::Measurement* m = find(name);
    if (!m || m->runs_s.empty()) continue;
    const double first = m->runs_s.front() / ref, later = steady(*m) / ref;
    out[name] = {{"first", first}, {"steady", later}};
    std::cerr << fmt::format("  {:24} first {:8.2f}x  steady {:8.3f}x\n", name, first, later);
  }
  return out;
}

// ---- tensor-count scaling: N tensors of 4 KiB vs the same bytes in 10 ----
//
// Per-tensor costs (header parsing, name lookups, layout) must stay small next
// to the bytes moved: each operation is timed on N float32 tensors of 4 KiB
// and on the same bytes in 10 tensors, in the same process, and reported as
// the ratio of the medians (target: within 2x).

std::vector<cb::TensorSpec> even_split(uint64_t total_floats, uint64_t count, const char* prefix) {
  std::vector<cb::TensorSpec> out;
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t n = total_floats / count + (i + 1 == count ? total_floats % count : 0);
    out.push_back({fmt::format("{}.{:07d}", prefix, i), {static_cast<int64_t>(n)}});
  }
  return out;
}

// Times save, cold load_into, cold mapped open + read, and the async save's
// stall for one layout of the state; names are prefixed with `tag`.
std::vector<cb::Measurement> bench_layout(const cb::Options& opts, const std::string& tag,
                                          const std::vector<cb::TensorSpec>& specs,
                                          std::string& cache_drop) {
  const uint64_t bytes = cb::total_bytes(specs);
  const auto state = cb::make_state(specs, 1);
  const cairn::StateDict sd = view_state(specs, state);
  const auto path = opts.dir / (tag + ".safetensors");
  std::vector<cb::Measurement> out;
  measure_save_and_cold_loads(opts, tag, specs, state, path, cache_drop, out);
  std::filesystem::remove(path);
  const auto exp = opts.dir / (tag + "-exp");
  {
    cairn::StateCheckpointOptions o;
    o.max_to_keep = 1;
    cairn::StateCheckpointManager mgr(exp.string(), o);
    cb::Measurement stall{tag + ".async_stall", "save_async until it returns", bytes, {}};
    for (int run = 0; run < opts.runs; ++run) {
      cb::sync_all();
      const double t0 = cb::now_seconds();
      auto h = mgr.save_async(sd, static_cast<uint64_t>(run));
      stall.runs_s.push_back(cb::now_seconds() - t0);
      if (!h) throw std::runtime_error("save_async skipped a save");
      h->wait();
    }
    out.push_back(stall);
  }
  std::filesystem::remove_all(exp);
  return out;
}

int bench_tensor_count(const cb::Options& opts) {
  const uint64_t n = opts.many_tensors;
  const uint64_t floats = n * 1024;  // 4 KiB each
  const auto many = even_split(floats, n, "many");
  const auto few = even_split(floats, 10, "few");
  std::filesystem::create_directories(opts.dir);
  std::string cache_drop = "none";
  std::vector<cb::Measurement> results = bench_layout(opts, "many", many, cache_drop);
  const auto base = bench_layout(opts, "few", few, cache_drop);
  nlohmann::json ratios = nlohmann::json::object();
  std::cerr << fmt::format("{} tensors of 4 KiB vs 10 tensors, {} MB, median of {} runs:\n", n,
                           cb::total_bytes(many) / 1000000, opts.runs);
  for (size_t i = 0; i < base.size(); ++i) {
    const double a = median(results[i].runs_s), b = median(base[i].runs_s);
    const std::string op = base[i].name.substr(base[i].name.find('.') + 1);
    ratios[op] = b > 0 ? a / b : 0.0;
    std::cerr << fmt::format("  {:12} {:9.4f} s  vs {:9.4f} s  ratio {:6.2f}\n", op, a, b,
                             b > 0 ? a / b : 0.0);
  }
  results.insert(results.end(), base.begin(), base.end());
  cb::write_report(opts, "cairn.tensor_count", many, cache_drop, results,
                   {{"few_tensors", few.size()}, {"ratios", ratios}});
  return 0;
}

// --disk-rounds: see disk_rounds.h.
int bench_disk_rounds(const cb::Options& opts, const std::vector<cb::TensorSpec>& specs,
                      const std::vector<cb::FloatBuffer>& state) {
  std::vector<cb::FloatBuffer> dst;
  for (const auto& s : specs) {
    dst.emplace_back(s.numel());
    std::memset(dst.back().data(), 0, s.bytes());  // preallocated: already touched
  }
  cairn::StateDict target = view_state(specs, dst);
  auto same = [&] {
    for (size_t i = 0; i < specs.size(); ++i) {
      if (std::memcmp(dst[i].data(), state[i].data(), specs[i].bytes()) != 0) return false;
    }
    return true;
  };
  nlohmann::json out = cb::run_disk_rounds(opts, specs, view_state(specs, state), target, same);
  for (const auto& r : out["ratios"]) {
    std::cerr << fmt::format("{:>28} / {:<18} median {:.2f}x  (rounds: {})\n",
                             r["cairn"].get<std::string>(), r["reference"].get<std::string>(),
                             r["median"].get<double>(), r["per_round"].dump());
  }
  const std::string text = out.dump(2);
  if (opts.out.empty()) {
    std::cout << text << "\n";
  } else {
    std::ofstream(opts.out) << text << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const char* usage =
      "usage: cairn_bench --size-mib N [--runs N] [--dir DIR] [--out FILE] [--workload]\n"
      "       cairn_bench --many-tensors N [--runs N] [--dir DIR] [--out FILE]\n"
      "       cairn_bench --save-load --size-mib N [--runs N] [--dir DIR] [--out FILE]\n"
      "       cairn_bench --disk-rounds --size-mib N [--runs N] [--idle-s S] [--dir DIR]\n"
      "                   [--out FILE]\n"
      "       cairn_bench --reshard --size-mib N [--dir DIR] [--out FILE]\n";
  cb::Options opts = cb::parse_options(argc, argv, usage);
  try {
    if (opts.many_tensors > 0) return bench_tensor_count(opts);
    const auto specs = cb::transformer_workload(opts.size_mib);
    if (opts.workload_only) {
      std::cout << cb::workload_json(specs).dump() << "\n";
      return 0;
    }
    std::filesystem::create_directories(opts.dir);
    const auto state = cb::make_state(specs, 1);
    if (opts.disk_rounds) return bench_disk_rounds(opts, specs, state);
    if (opts.reshard) return cb::bench_reshard(opts, specs, state);
    std::string cache_drop = "none";
    std::vector<cb::Measurement> results;
    if (opts.save_load) {
      const auto path = opts.dir / "cairn.safetensors";
      results.push_back(bench_memcpy(specs, state, opts.runs));
      measure_save_and_cold_loads(opts, "cairn", specs, state, path, cache_drop, results);
      measure_fresh_load(opts, specs, state, path, cache_drop, results);
      std::filesystem::remove(path);
      measure_async_saver_stall(opts, specs, state, results);
      cb::write_report(opts, "cairn.save_load", specs, cache_drop, results);
      return 0;
    }
    results.push_back(bench_memcpy(specs, state, opts.runs));
    bench_cairn(opts, specs, state, cache_drop, results);
    bench_async_policies(opts, specs, state, results);
    cb::write_report(opts, "cairn", specs, cache_drop, results,
                     {{"async_ratios", async_ratios(results)}});
  } catch (const std::exception& e) {
    std::cerr << "cairn_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
