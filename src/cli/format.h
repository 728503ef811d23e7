// Pure text helpers of the `cairn` command: sizes, times, metrics and tables.
// No I/O here, so every rule is unit-tested (tests/cli/format_test.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace cairn::cli {

// "0 B", "999 B", "1.0 KiB", "12.3 MiB", ... (binary units, one decimal).
std::string format_size(uint64_t bytes);

// ISO-8601 in UTC with second precision: "2024-05-01T12:00:00Z". Fractions
// of a second are truncated toward the past.
std::string format_time_utc(double seconds_since_epoch);

// Metrics on one line, nested keys joined with '/' as in score attributes:
// {"loss":0.25,"eval":{"acc":0.9}} -> "eval/acc=0.9 loss=0.25". Floating
// point numbers get 6 significant digits (the exact values are in --json);
// integers are exact; strings are written bare. Null or empty -> "".
std::string format_metrics(const nlohmann::json& metrics);

// Replaces line breaks (and the spaces around them) with "; ", so that an
// error message stays on one line.
std::string one_line(std::string_view text);

// A left-aligned text table: a header row, then one row per entry, columns
// separated by two spaces, trailing spaces removed. Each line starts with
// `indent` and ends with '\n'. Rows shorter than the header are padded.
std::string render_table(const std::vector<std::string>& header,
                         const std::vector<std::vector<std::string>>& rows,
                         std::string_view indent = "");

}  // namespace cairn::cli
