// `cairn cp SRC DST`: copies a committed checkpoint or an experiment between
// storages (cairn::transfer), with progress on stderr. Everything but
// run_cp() is pure and unit-tested (tests/cli/cp_test.cc): the numbers in,
// the text out, the clock passed in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "cairn/transfer.h"

namespace cairn::cli {

// ---- pure rendering -----------------------------------------------------

// "512 B/s", "12.3 MiB/s" (binary units as format_size); "-" when unknown
// (zero, negative or not finite).
std::string format_rate(double bytes_per_second);

// "0s", "59s", "1m05s", "59m59s", "1h00m", "25h03m"; rounded up to the
// second; "-" when unknown (negative or not finite).
std::string format_duration(double seconds);

// Bytes per second actually transferred: bytes found in place do not count.
// nullopt before any time has passed or anything was transferred.
std::optional<double> transfer_rate(const TransferProgress& p, double elapsed_seconds);

// No ETA before this many seconds, nor before this share of the bytes to
// move (the total less those found in place) has moved: the rate of the
// first file or the first instant predicts nothing.
inline constexpr double kEtaMinSeconds = 2.0;
inline constexpr double kEtaMinFraction = 0.01;

// Seconds left at the rate so far (transfer_rate); 0 when done; nullopt when
// it cannot be estimated yet (see kEtaMinSeconds and kEtaMinFraction).
std::optional<double> estimate_eta(const TransferProgress& p, double elapsed_seconds);

// One frame of the terminal progress bar, at most `width` characters:
// "[#########...........]   45%   12.0 MiB/40.0 MiB    3.1 MiB/s ETA     9s  3/10 files".
// Each number is padded to the widest text it can take during the copy, so
// every frame of one copy has the same length and the same bar; the bar
// shrinks to fit the width; below a usable width only the numbers are shown.
std::string render_progress_bar(const TransferProgress& p, double elapsed_seconds, size_t width);

// One line for a log (stderr that is not a terminal):
// "cp: 45% 12.0 MiB/40.0 MiB, 3/10 files, 3.1 MiB/s, ETA 9s".
std::string render_progress_line(const TransferProgress& p, double elapsed_seconds);

// Decides when to draw. A bar is redrawn in place at most every
// `kBarInterval` seconds; log lines are written at most every
// `kLineInterval` seconds; both draw the final state once at finish().
class ProgressReporter {
 public:
  enum class Mode { kBar, kLines, kOff };
  static constexpr double kBarInterval = 0.1;
  static constexpr double kLineInterval = 5.0;

  // `clock`: seconds, monotonic. `write`: text for stderr, as is (a bar frame
  // begins with '\r' and clears the rest of the line).
  ProgressReporter(Mode mode, std::function<double()> clock,
                   std::function<void(const std::string&)> write, size_t width = 80);

  void update(const TransferProgress& p);
  // The last state once more, and the end of the bar's line.
  void finish();
  // Ends the bar's line (if one was drawn) so that an error starts on its own.
  void abort();

 private:
  void draw(const TransferProgress& p, double now);

  Mode mode_;
  std::function<double()> clock_;
  std::function<void(const std::string&)> write_;
  size_t width_;
  double start_ = 0.0;
  std::optional<double> last_draw_;
  TransferProgress last_;
  bool dirty_ = false;  // bar on screen without its newline
};

// ---- the result ---------------------------------------------------------

// The --json document (schema_version 1, docs/cli.md) and the text summary.
nlohmann::ordered_json cp_to_json(const TransferReport& report);
std::string cp_to_text(const TransferReport& report);

// ---- the command --------------------------------------------------------

// Copies SRC to DST (cairn::transfer) with `jobs` threads, reporting progress
// on stderr (a bar when stderr is a terminal, lines otherwise) unless
// `progress` is false. Throws cairn::Error as transfer() does.
TransferReport run_cp(std::string_view src, std::string_view dst, int jobs, bool progress,
                      TransferVerify verify = TransferVerify::kAuto);

}  // namespace cairn::cli
