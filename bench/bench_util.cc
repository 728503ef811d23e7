#include "bench_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string_view>
#include <thread>

#include <CLI/CLI.hpp>

namespace cairn::bench {

uint64_t TensorSpec::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

std::vector<TensorSpec> transformer_workload(uint64_t size_mib) {
  const double scale = std::sqrt(static_cast<double>(size_mib) / 2048.0);
  const int64_t d = std::max<int64_t>(8, std::llround(1280 * scale));
  const int64_t vocab = std::max<int64_t>(8, std::llround(32000 * scale));
  const int layers = 7;

  std::vector<TensorSpec> params;
  params.push_back({"model.embed.weight", {vocab, d}});
  for (int i = 0; i < layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    params.push_back({p + "ln1.weight", {d}});
    params.push_back({p + "ln1.bias", {d}});
    params.push_back({p + "attn.qkv.weight", {3 * d, d}});
    params.push_back({p + "attn.qkv.bias", {3 * d}});
    params.push_back({p + "attn.out.weight", {d, d}});
    params.push_back({p + "attn.out.bias", {d}});
    params.push_back({p + "ln2.weight", {d}});
    params.push_back({p + "ln2.bias", {d}});
    params.push_back({p + "mlp.fc1.weight", {4 * d, d}});
    params.push_back({p + "mlp.fc1.bias", {4 * d}});
    params.push_back({p + "mlp.fc2.weight", {d, 4 * d}});
    params.push_back({p + "mlp.fc2.bias", {d}});
  }
  params.push_back({"model.ln_f.weight", {d}});
  params.push_back({"model.ln_f.bias", {d}});

  std::vector<TensorSpec> all = params;
  for (const char* slot : {"exp_avg", "exp_avg_sq"}) {
    for (const TensorSpec& p : params) {
      all.push_back({std::string("optim.") + slot + "." + p.name, p.shape});
    }
  }
  return all;
}

uint64_t total_bytes(const std::vector<TensorSpec>& specs) {
  uint64_t n = 0;
  for (const TensorSpec& s : specs) n += s.bytes();
  return n;
}

nlohmann::json workload_json(const std::vector<TensorSpec>& specs) {
  nlohmann::json tensors = nlohmann::json::array();
  for (const TensorSpec& s : specs) tensors.push_back({{"name", s.name}, {"shape", s.shape}});
  return {{"dtype", "float32"}, {"bytes", total_bytes(specs)}, {"tensors", tensors}};
}

void fill_random(std::span<float> out, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& f : out) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    f = static_cast<float>(static_cast<int32_t>(x >> 32)) * (1.0f / 2147483648.0f);
  }
}

FloatBuffer::FloatBuffer(uint64_t numel) : numel_(numel) {
  const uint64_t bytes = std::max<uint64_t>(4096, (numel * 4 + 4095) / 4096 * 4096);
  data_ = static_cast<float*>(std::aligned_alloc(4096, bytes));
  if (data_ == nullptr) throw std::bad_alloc();
  if (bytes >= (2u << 20)) {
    // ignore-error: huge pages are an optimization; without them we are slower, not wrong.
    (void)madvise(data_, bytes, MADV_HUGEPAGE);
  }
}

FloatBuffer::~FloatBuffer() { std::free(data_); }

FloatBuffer::FloatBuffer(FloatBuffer&& o) noexcept : data_(o.data_), numel_(o.numel_) {
  o.data_ = nullptr;
  o.numel_ = 0;
}

FloatBuffer& FloatBuffer::operator=(FloatBuffer&& o) noexcept {
  if (this != &o) {
    std::free(data_);
    data_ = o.data_;
    numel_ = o.numel_;
    o.data_ = nullptr;
    o.numel_ = 0;
  }
  return *this;
}

std::vector<FloatBuffer> make_state(const std::vector<TensorSpec>& specs, uint64_t seed) {
  std::vector<FloatBuffer> out;
  out.reserve(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    out.emplace_back(specs[i].numel());
    fill_random(out.back().span(), seed + i);
  }
  return out;
}

void sync_all() { ::sync(); }

namespace {

void fadvise_dontneed(const std::filesystem::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;  // ignore-error: a file that vanished has no cache to drop.
  (void)::fdatasync(fd);
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

}  // namespace

std::string drop_caches(const std::vector<std::filesystem::path>& paths) {
  ::sync();
  {
    std::ofstream f("/proc/sys/vm/drop_caches");
    if (f) {
      f << "3\n";
      f.flush();
      if (f) return "drop_caches";
    }
  }
  for (const auto& p : paths) {
    std::error_code ec;
    if (std::filesystem::is_directory(p, ec)) {
      for (const auto& e : std::filesystem::recursive_directory_iterator(p, ec)) {
        if (e.is_regular_file(ec)) fadvise_dontneed(e.path());
      }
    } else {
      fadvise_dontneed(p);
    }
  }
  return "fadvise";
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

uint64_t touch_all(std::span<const std::byte> data) {
  uint64_t sum = 0;
  const size_t words = data.size() / 8;
  const std::byte* p = data.data();
  for (size_t i = 0; i < words; ++i) {
    uint64_t w;
    std::memcpy(&w, p + i * 8, 8);
    sum += w;
  }
  for (size_t i = words * 8; i < data.size(); ++i) sum += static_cast<uint8_t>(p[i]);
  return sum;
}

nlohmann::json Measurement::to_json() const {
  return {{"name", name}, {"what", what}, {"bytes", bytes}, {"runs_s", runs_s}};
}

void parse_or_exit(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e) == 0 ? 0 : 2);
  }
}

Options parse_options(int argc, char** argv, const char* usage) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << usage;
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--size-mib") {
      o.size_mib = std::stoull(value());
    } else if (a == "--runs") {
      o.runs = std::stoi(value());
    } else if (a == "--dir") {
      o.dir = value();
    } else if (a == "--out") {
      o.out = value();
    } else if (a == "--workload") {
      o.workload_only = true;
    } else if (a == "--many-tensors") {
      o.many_tensors = std::stoull(value());
    } else if (a == "--disk-rounds") {
      o.disk_rounds = true;
    } else if (a == "--idle-s") {
      o.idle_s = std::stod(value());
    } else if (a == "--reshard") {
      o.reshard = true;
    } else if (a == "--save-load") {
      o.save_load = true;
    } else if (a == "--fio") {
      o.fio = value();
    } else {
      std::cerr << usage;
      std::exit(2);
    }
  }
  if (o.runs < 1 || o.size_mib < 1 || o.idle_s < 0) {
    std::cerr << usage;
    std::exit(2);
  }
  return o;
}

std::vector<std::string> fio_args(const std::filesystem::path& file, uint64_t bytes, bool direct) {
  std::vector<std::string> a{"--name=round", "--filename=" + file.string(), "--bs=1M",
                             "--size=" + std::to_string(bytes >> 20) + "M"};
  if (direct) {
    a.insert(a.end(), {"--direct=1", "--ioengine=libaio", "--iodepth=8"});
  } else {
    a.insert(a.end(), {"--direct=0", "--ioengine=psync"});
  }
  return a;
}

double run_fio(const std::string& fio, const std::vector<std::string>& args, const char* rw) {
  std::string cmd = "'" + (fio.empty() ? std::string("fio") : fio) + "' --output-format=json";
  for (const auto& a : args) cmd += " '" + a + "'";
  cmd += " 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) throw std::runtime_error("cannot start fio");
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  if (::pclose(p) != 0) throw std::runtime_error("fio failed: " + cmd);
  // fio may print notes before the JSON document.
  const size_t start = out.find('{');
  if (start == std::string::npos) throw std::runtime_error("fio printed no JSON: " + cmd);
  auto j = nlohmann::json::parse(out.substr(start));
  return j["jobs"][0][rw]["runtime"].get<double>() / 1000.0;
}

void write_report(const Options& opts, const std::string& tool,
                  const std::vector<TensorSpec>& specs, const std::string& cache_drop,
                  const std::vector<Measurement>& results, const nlohmann::json& extra) {
  nlohmann::json j = extra;
  j["tool"] = tool;
  j["size_mib"] = opts.size_mib;
  j["bytes"] = total_bytes(specs);
  j["tensors"] = specs.size();
  j["cache_drop"] = cache_drop;
  j["results"] = nlohmann::json::array();
  for (const Measurement& m : results) j["results"].push_back(m.to_json());
  if (opts.out.empty()) {
    std::cout << j.dump(2) << "\n";
  } else {
    std::ofstream f(opts.out);
    f << j.dump(2) << "\n";
    if (!f) throw std::runtime_error("cannot write " + opts.out);
  }
}

}  // namespace cairn::bench
