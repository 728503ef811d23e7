#include "experiment/results.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <climits>
#include <cmath>
#include <cstring>
#include <set>

#include <fmt/format.h>

#include "cairn/error.h"
#include "util/fs.h"
#include "util/json.h"
#include "util/log.h"

namespace cairn::experiment {

namespace {

constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

// Protobuf field keys: (number << 3) | wire type.
void put_key(std::string& out, int field, int wire) { put_varint(out, (field << 3) | wire); }

void put_bytes_field(std::string& out, int field, std::string_view bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}

void put_double_field(std::string& out, int field, double v) {
  put_key(out, field, 1);
  put_le(out, std::bit_cast<uint64_t>(v), 8);
}

void flatten_into(const nlohmann::json& j, const std::string& prefix, nlohmann::json& out) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    std::string key = prefix.empty() ? it.key() : prefix + "/" + it.key();
    if (it.value().is_object()) {
      flatten_into(it.value(), key, out);
    } else {
      out[key] = it.value();
    }
  }
}

}  // namespace

uint32_t crc32c(std::string_view data, uint32_t crc) {
  crc = ~crc;
  for (unsigned char c : data) crc = kCrc32cTable[(crc ^ c) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  put_le(out, data.size(), 8);
  put_le(out, masked_crc32c(out), 4);
  out.append(data);
  put_le(out, masked_crc32c(data), 4);
  return out;
}

std::string encode_file_version_event(double wall_time) {
  std::string e;
  put_double_field(e, 1, wall_time);
  put_bytes_field(e, 3, "brain.Event:2");
  return e;
}

std::string encode_scalars_event(double wall_time, int64_t step,
                                 const std::vector<std::pair<std::string, float>>& values) {
  std::string summary;
  for (const auto& [tag, v] : values) {
    std::string value;
    put_bytes_field(value, 1, tag);
    put_key(value, 2, 5);
    put_le(value, std::bit_cast<uint32_t>(v), 4);
    put_bytes_field(summary, 1, value);
  }
  std::string e;
  put_double_field(e, 1, wall_time);
  put_key(e, 2, 0);
  put_varint(e, static_cast<uint64_t>(step));
  put_bytes_field(e, 5, summary);
  return e;
}

nlohmann::json flatten_metrics(const nlohmann::json& metrics) {
  nlohmann::json out = nlohmann::json::object();
  if (metrics.is_object()) flatten_into(metrics, "", out);
  return out;
}

std::vector<std::pair<std::string, float>> numeric_scalars(const nlohmann::json& metrics) {
  std::vector<std::pair<std::string, float>> out;
  const nlohmann::json flat = flatten_metrics(metrics);
  for (auto it = flat.begin(); it != flat.end(); ++it) {
    if (it.value().is_number()) out.emplace_back(it.key(), it.value().get<float>());
  }
  return out;
}

int64_t tensorboard_step(const nlohmann::json& row) {
  for (const char* key : {"timesteps_total", "training_iteration"}) {
    const nlohmann::json v = row.value(key, nlohmann::json());
    if (v.is_number_integer()) return v.get<int64_t>();
  }
  return 0;
}

std::vector<std::pair<std::string, float>> tensorboard_scalars(const nlohmann::json& row) {
  nlohmann::json rest = row.is_object() ? row : nlohmann::json::object();
  for (const char* axis : {"training_iteration", "timestamp", "time_total_s"}) rest.erase(axis);
  return numeric_scalars(rest);
}

std::string csv_field(const nlohmann::json& value) {
  if (value.is_null()) return "";
  std::string s = value.is_string() ? value.get<std::string>() : dump_for_output(value);
  const bool quote = s.find_first_of(",\"\r\n") != std::string::npos ||
                     (!s.empty() && (s.front() == ' ' || s.back() == ' '));
  if (!quote) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out.push_back('"');
    out.push_back(c);
  }
  out.push_back('"');
  return out;
}

std::string csv_record(const std::vector<std::string>& header, const nlohmann::json& flat_row) {
  std::string out;
  for (size_t i = 0; i < header.size(); ++i) {
    if (i > 0) out.push_back(',');
    auto it = flat_row.find(header[i]);
    if (it != flat_row.end()) out += csv_field(*it);
  }
  out.push_back('\n');
  return out;
}

bool extend_header(std::vector<std::string>& header, const nlohmann::json& flat_row) {
  bool grew = false;
  for (auto it = flat_row.begin(); it != flat_row.end(); ++it) {
    if (std::find(header.begin(), header.end(), it.key()) == header.end()) {
      header.push_back(it.key());
      grew = true;
    }
  }
  return grew;
}

ParsedResults parse_result_lines(std::string_view text, std::string_view where) {
  ParsedResults r;
  const size_t last_nl = text.rfind('\n');
  if (last_nl == std::string_view::npos) return r;
  r.complete_bytes = last_nl + 1;
  size_t pos = 0;
  int line_no = 0;
  while (pos < r.complete_bytes) {
    const size_t nl = text.find('\n', pos);
    std::string_view line = text.substr(pos, nl - pos);
    ++line_no;
    pos = nl + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    nlohmann::json row = parse_json(line, fmt::format("{} line {}", where, line_no));
    if (!row.is_object()) {
      throw Error(ErrorCode::kCorruption,
                  fmt::format("{} line {}: not a JSON object", where, line_no));
    }
    r.rows.push_back(std::move(row));
  }
  return r;
}

std::vector<nlohmann::json> read_result_rows(Storage& experiment) {
  if (!experiment.exists(kResultJsonKey)) return {};
  return parse_result_lines(experiment.get(kResultJsonKey), experiment.uri_of(kResultJsonKey)).rows;
}

// One file of the history: appended to in place where it is a local file,
// else (or after a failed append) replaced whole.
struct RunResults::Appender {
  std::string key;
  std::optional<std::filesystem::path> local;
  UniqueFd fd;
  bool broken = false;
};

RunResults::RunResults(std::shared_ptr<Storage> experiment, Clock clock)
    : storage_(std::move(experiment)), clock_(std::move(clock)) {
  opened_at_ = clock_();
  auto make = [&](std::string key) {
    auto a = std::make_unique<Appender>();
    a->local = storage_->local_path(key);
    a->key = std::move(key);
    return a;
  };
  results_ = make(std::string(kResultJsonKey));
  progress_ = make(std::string(kProgressCsvKey));

  if (storage_->exists(kResultJsonKey)) {
    const std::string text = storage_->get(kResultJsonKey);
    ParsedResults parsed = parse_result_lines(text, storage_->uri_of(kResultJsonKey));
    rows_ = std::move(parsed.rows);
    // A line torn by a crash: drop it, so that the next append starts a line.
    if (parsed.complete_bytes != text.size()) {
      storage_->put(kResultJsonKey, std::string_view(text).substr(0, parsed.complete_bytes));
    }
  }
  for (const auto& row : rows_) extend_header(header_, flatten_metrics(row));
  if (!rows_.empty()) {
    const auto& t = rows_.back().value("time_total_s", nlohmann::json());
    if (t.is_number()) time_before_ = t.get<double>();
  }
  // progress.csv is derived from result.json: rewritten whole, which also
  // repairs a torn last record.
  storage_->put(kProgressCsvKey, csv_text());

  char host[HOST_NAME_MAX + 1] = {};
  if (gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::strcpy(host, "localhost");
  for (char& c : host) {
    if (c == '/' || c == '\\') c = '_';
  }
  const std::string base = fmt::format("{}{}.{}", kEventFilePrefix,
                                       static_cast<long long>(std::floor(opened_at_)), host);
  event_key_ = base;
  for (int n = 1; storage_->exists(event_key_); ++n) event_key_ = fmt::format("{}.{}", base, n);
  event_ = make(event_key_);
  events_ = tfrecord(encode_file_version_event(opened_at_));
  storage_->put(event_key_, events_);
}

RunResults::~RunResults() = default;

std::string RunResults::csv_text() const {
  std::string out;
  if (header_.empty()) return out;
  for (size_t i = 0; i < header_.size(); ++i) {
    if (i > 0) out.push_back(',');
    out += csv_field(header_[i]);
  }
  out.push_back('\n');
  for (const auto& row : rows_) out += csv_record(header_, flatten_metrics(row));
  return out;
}

void RunResults::append(Appender& file, std::string_view data,
                        const std::function<std::string()>& whole) {
  if (file.local && !file.broken) {
    try {
      if (!file.fd) file.fd = open_file(*file.local, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC);
      write_all(file.fd.get(), std::as_bytes(std::span(data.data(), data.size())),
                file.local->string());
      return;
    } catch (const Error&) {
      file.broken = true;  // what was written of `data` is rewritten whole next time
      file.fd = UniqueFd();
      throw;
    }
  }
  file.fd = UniqueFd();  // the object is replaced: an open descriptor would be stale
  file.broken = true;
  storage_->put(file.key, whole());
  file.broken = false;
}

void RunResults::record(const nlohmann::json& metrics,
                        const std::optional<std::string>& checkpoint_dir_name, int attempt,
                        std::optional<int64_t> iteration, std::optional<double> reported_at) {
  const double now = clock_();
  nlohmann::json row = metrics.is_object() ? metrics : nlohmann::json::object();
  row["training_iteration"] = iteration ? *iteration : static_cast<int64_t>(rows_.size()) + 1;
  row["timestamp"] = static_cast<int64_t>(std::floor(reported_at.value_or(now)));
  row["time_total_s"] = time_before_ + std::max(0.0, now - opened_at_);
  // As Ray's: the time since the previous row (or since this driver
  // started), and the rows since the last (re)start from a checkpoint.
  if (attempt != attempt_) {
    attempt_ = attempt;
    since_restore_ = 0;
  }
  row["time_this_iter_s"] = std::max(0.0, now - (last_row_at_ ? *last_row_at_ : opened_at_));
  row["iterations_since_restore"] = ++since_restore_;
  last_row_at_ = now;
  row["checkpoint_dir_name"] =
      checkpoint_dir_name ? nlohmann::json(*checkpoint_dir_name) : nlohmann::json(nullptr);
  row["attempt"] = attempt;
  const std::string line = row.dump() + "\n";
  const nlohmann::json flat = flatten_metrics(row);
  const std::string record =
      tfrecord(encode_scalars_event(now, tensorboard_step(row), tensorboard_scalars(row)));
  rows_.push_back(std::move(row));
  events_ += record;
  try {
    append(*results_, line, [&] {
      std::string all;
      for (const auto& r : rows_) all += r.dump() + "\n";
      return all;
    });
    if (extend_header(header_, flat)) {
      // New columns: the header widens and every row gets them (empty).
      progress_->fd = UniqueFd();
      progress_->broken = true;
      storage_->put(kProgressCsvKey, csv_text());
      progress_->broken = false;
    } else {
      append(*progress_, csv_record(header_, flat), [&] { return csv_text(); });
    }
    append(*event_, record, [&] { return events_; });
  } catch (const Error&) {
    // The files not written yet lack this round: rewrite each whole next time.
    for (Appender* f : {results_.get(), progress_.get(), event_.get()}) {
      f->fd = UniqueFd();
      f->broken = true;
    }
    throw;
  }
}

namespace {

bool cloned(const Checkpoint& checkpoint) {
  try {
    return checkpoint.get_metadata().contains(kClonedFromKey);
  } catch (const Error&) {  // ignore-error: unreadable metadata is no clone's marker
    return false;
  }
}

}  // namespace

void RunResults::backfill(const std::vector<CheckpointRecord>& committed, bool by_iteration,
                          const std::string& experiment_uri) {
  std::set<std::string> named;
  std::optional<uint64_t> newest_named;
  for (const auto& row : rows_) {
    const nlohmann::json dir = row.value("checkpoint_dir_name", nlohmann::json());
    if (!dir.is_string()) continue;
    named.insert(dir.get<std::string>());
    if (auto index = parse_checkpoint_name(dir.get<std::string>())) {
      newest_named = std::max(newest_named.value_or(0), *index);
    }
  }
  const nlohmann::json last = rows_.empty() ? nlohmann::json::object() : rows_.back();
  int64_t last_iteration = last.value("training_iteration", int64_t{0});
  const int attempt = last.value("attempt", 0);
  for (const CheckpointRecord& r : committed) {
    if (named.count(r.name) || (newest_named && r.index <= *newest_named)) continue;
    if (cloned(r.checkpoint)) continue;
    std::optional<int64_t> iteration;
    if (by_iteration) {
      const nlohmann::json it = r.metrics.value("training_iteration", nlohmann::json());
      if (!it.is_number_integer() || it.get<int64_t>() <= last_iteration) continue;
      iteration = last_iteration = it.get<int64_t>();
    }
    log::info(
        fmt::format("{}: {} was committed but its result row was not written (the run "
                    "was killed in between); writing the row from its metrics",
                    experiment_uri, r.name));
    record(r.metrics, r.name, attempt, iteration, r.created_at);
  }
}

}  // namespace cairn::experiment
