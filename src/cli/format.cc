#include "cli/format.h"

#include <time.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace cairn::cli {

std::string format_size(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double value = static_cast<double>(bytes) / 1024.0;
  size_t unit = 0;
  // Move up while the rounded figure would read 1024.0 or more.
  while (value >= 1023.95 && unit + 1 < std::size(kUnits)) {
    value /= 1024.0;
    ++unit;
  }
  return fmt::format("{:.1f} {}", value, kUnits[unit]);
}

std::string format_time_utc(double seconds_since_epoch) {
  time_t t = static_cast<time_t>(std::floor(seconds_since_epoch));
  struct tm tm {};
  if (gmtime_r(&t, &tm) == nullptr) return fmt::format("{}", seconds_since_epoch);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z", tm.tm_year + 1900, tm.tm_mon + 1,
                     tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
}

namespace {

void flatten(const nlohmann::json& value, const std::string& prefix,
             std::vector<std::string>& out) {
  if (value.is_object()) {
    for (const auto& [key, child] : value.items()) {
      flatten(child, prefix.empty() ? key : prefix + "/" + key, out);
    }
    return;
  }
  std::string text;
  if (value.is_string()) {
    text = value.get<std::string>();
  } else if (value.is_number_float()) {
    text = fmt::format("{:.6g}", value.get<double>());
  } else {
    text = value.dump();
  }
  out.push_back(prefix.empty() ? text : prefix + "=" + text);
}

}  // namespace

std::string format_metrics(const nlohmann::json& metrics) {
  if (metrics.is_null()) return "";
  std::vector<std::string> parts;
  flatten(metrics, "", parts);
  std::string out;
  for (const auto& p : parts) {
    if (!out.empty()) out += ' ';
    out += p;
  }
  return out;
}

std::string one_line(std::string_view text) {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == '\n' || text[i] == '\r') {
      while (!out.empty() && (out.back() == ' ' || out.back() == '\t')) out.pop_back();
      while (i < text.size() && std::string_view(" \t\r\n").find(text[i]) != std::string::npos) {
        ++i;
      }
      if (!out.empty() && i < text.size()) out += "; ";
      continue;
    }
    out += text[i++];
  }
  return out;
}

std::string render_table(const std::vector<std::string>& header,
                         const std::vector<std::vector<std::string>>& rows,
                         std::string_view indent) {
  std::vector<size_t> width(header.size(), 0);
  auto measure = [&](const std::vector<std::string>& row) {
    for (size_t c = 0; c < row.size() && c < width.size(); ++c) {
      width[c] = std::max(width[c], row[c].size());
    }
  };
  measure(header);
  for (const auto& row : rows) measure(row);

  std::string out;
  auto emit = [&](const std::vector<std::string>& row) {
    std::string line(indent);
    for (size_t c = 0; c < width.size(); ++c) {
      const std::string cell = c < row.size() ? row[c] : "";
      line += cell;
      if (c + 1 < width.size()) line += std::string(width[c] - cell.size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line;
    out += '\n';
  };
  emit(header);
  for (const auto& row : rows) emit(row);
  return out;
}

}  // namespace cairn::cli
