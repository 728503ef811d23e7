// Shared pieces of the benchmarks: the workload (a transformer-shaped state
// plus an Adam state of the same shapes), timing, cache dropping and the JSON
// every benchmark binary prints for bench/run.py to collect.
//
// Every benchmark binary builds the same workload from the same --size-mib, so
// Cairn, LibTorch and Python's torch (which asks `cairn_bench --workload`) move
// exactly the same tensors.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace CLI {
class App;
}  // namespace CLI

namespace cairn::bench {

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t numel() const;
  uint64_t bytes() const { return numel() * 4; }  // float32
};

// A GPT-like model of 7 layers (per layer: two layernorms, qkv, attention
// output and a 4x MLP, weights and biases) plus the token embedding and the
// final layernorm: 87 parameter tensors, and Adam's exp_avg and exp_avg_sq for
// each, 261 float32 tensors in all. At the default 2048 MiB the width is 1280
// and the vocabulary 32000 (1.997 GiB); other sizes scale width and
// vocabulary by sqrt(size / 2048) and keep the tensor count.
std::vector<TensorSpec> transformer_workload(uint64_t size_mib);
uint64_t total_bytes(const std::vector<TensorSpec>& specs);
nlohmann::json workload_json(const std::vector<TensorSpec>& specs);

// Fills `out` with cheap pseudo-random floats in [-1, 1) derived from `seed`
// (incompressible enough; no format here compresses anyway).
void fill_random(std::span<float> out, uint64_t seed);

// A float buffer from the ordinary allocator (aligned_alloc, 4 KiB aligned),
// so every system under test goes through the same malloc and the same
// GLIBC_TUNABLES. Large buffers ask for transparent huge pages.
class FloatBuffer {
 public:
  FloatBuffer() = default;
  explicit FloatBuffer(uint64_t numel);
  ~FloatBuffer();
  FloatBuffer(FloatBuffer&& o) noexcept;
  FloatBuffer& operator=(FloatBuffer&& o) noexcept;
  FloatBuffer(const FloatBuffer&) = delete;
  FloatBuffer& operator=(const FloatBuffer&) = delete;
  float* data() const { return data_; }
  uint64_t numel() const { return numel_; }
  uint64_t bytes() const { return numel_ * 4; }
  std::span<float> span() const { return {data_, numel_}; }

 private:
  float* data_ = nullptr;
  uint64_t numel_ = 0;
};

// Allocates and fills one buffer per tensor (this is where first touch is paid,
// before any timing).
std::vector<FloatBuffer> make_state(const std::vector<TensorSpec>& specs, uint64_t seed);

// Empties the page cache for `paths` before a cold read. Prefers
// `echo 3 > /proc/sys/vm/drop_caches` (needs root); otherwise fsyncs each file
// and posix_fadvise(DONTNEED)s it. Returns which method was used: "drop_caches"
// or "fadvise". Paths may be files or directories (walked recursively).
std::string drop_caches(const std::vector<std::filesystem::path>& paths);

// sync(2) so that dirty pages left by a previous step do not bill the next one.
void sync_all();

// Seconds of the steady clock, which every process on the machine shares.
double now_seconds();

// The median of `v`: the middle value, or the mean of the two middle ones;
// 0 for none.
double median(std::vector<double> v);

// Sums every byte of `data` as 64-bit words (so a mapping is really read and
// the compiler cannot drop the loop).
uint64_t touch_all(std::span<const std::byte> data);

// One measured operation: its runs in seconds and the bytes each run moves.
struct Measurement {
  std::string name;
  std::string what;  // one line: what the figure means
  uint64_t bytes = 0;
  std::vector<double> runs_s;
  nlohmann::json to_json() const;
};

// Runs `fn` `runs` times, calling `before` (untimed) before each run.
template <typename Before, typename Fn>
Measurement measure(std::string name, std::string what, uint64_t bytes, int runs, Before before,
                    Fn fn) {
  Measurement m{std::move(name), std::move(what), bytes, {}};
  for (int i = 0; i < runs; ++i) {
    before(i);
    double t0 = now_seconds();
    fn(i);
    m.runs_s.push_back(now_seconds() - t0);
  }
  return m;
}

// Parses a bench's command line described by `app` (CLI11); on a mistake
// prints CLI11's message naming the flag and exits with 2 (0 for --help).
void parse_or_exit(CLI::App& app, int argc, char** argv);

// Common command line: --size-mib N --runs N --dir PATH --out FILE
// [--many-tensors N].
struct Options {
  uint64_t size_mib = 2048;
  int runs = 3;
  std::filesystem::path dir = ".";
  std::string out;  // JSON output file; empty = stdout
  bool workload_only = false;
  // --many-tensors N: instead of the transformer workload, N float32 tensors
  // of 4 KiB against the same bytes in 10 tensors (cairn_bench only).
  uint64_t many_tensors = 0;
  // --disk-rounds: manager saves and cold loads against fio inside every
  // round (disk_rounds.h; cairn_bench only; --runs is the number of rounds).
  bool disk_rounds = false;
  // --idle-s S: in disk rounds, let the machine idle S seconds after each
  // cache drop, before each cold read (fio's and Cairn's alike), so that the
  // memory freed by the drop has gone back to the host (PERF-NOTES).
  double idle_s = 0;
  // --reshard: bytes read by a 2 -> 4 rank re-shard (reshard.h).
  bool reshard = false;
  // --save-load: only memcpy, the save, the cold loads and the AsyncSaver
  // stall of the workload, the C++ side of bench/python_bench.py
  // (cairn_bench only).
  bool save_load = false;
  // --fio PATH: the fio binary for reference runs (empty: fio on PATH, and
  // gpu_bench runs none).
  std::string fio;
};
Options parse_options(int argc, char** argv, const char* usage);

// fio's options for one sequential job over the first `bytes` of `file`
// (whole MiB) in 1 MiB requests: with `direct`, O_DIRECT through libaio with
// 8 in flight (the strongest O_DIRECT figure fio reached here); otherwise
// buffered psync. Add --rw=... and the like.
std::vector<std::string> fio_args(const std::filesystem::path& file, uint64_t bytes, bool direct);

// Runs `fio` (empty: fio on PATH) with --output-format=json and `args`; returns the first job's
// runtime in seconds for `rw` ("write" or "read"). Throws if fio fails.
double run_fio(const std::string& fio, const std::vector<std::string>& args, const char* rw);

// Writes {"tool", "size_mib", "bytes", "tensors", "cache_drop", "results"}
// plus the keys of `extra` to opts.out (or stdout).
void write_report(const Options& opts, const std::string& tool,
                  const std::vector<TensorSpec>& specs, const std::string& cache_drop,
                  const std::vector<Measurement>& results,
                  const nlohmann::json& extra = nlohmann::json::object());

}  // namespace cairn::bench
