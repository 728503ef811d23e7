#include "cli/cp.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include <fmt/format.h>

#include "cli/format.h"
#include "cli/views.h"

namespace cairn::cli {

namespace {

constexpr std::string_view kClearToEnd = "\x1b[K";

std::string counts(const TransferProgress& p) {
  return fmt::format("{}/{}", format_size(p.bytes_done), format_size(p.bytes_total));
}

unsigned percent(const TransferProgress& p) {
  if (p.bytes_total == 0) return p.files_done >= p.files_total ? 100 : 0;
  return static_cast<unsigned>(std::min<uint64_t>(100, p.bytes_done * 100 / p.bytes_total));
}

std::string plural(uint64_t n, std::string_view what) {
  return fmt::format("{} {}{}", n, what, n == 1 ? "" : "s");
}

}  // namespace

std::string format_rate(double bytes_per_second) {
  if (!std::isfinite(bytes_per_second) || bytes_per_second <= 0) return "-";
  return format_size(static_cast<uint64_t>(std::llround(bytes_per_second))) + "/s";
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0 || seconds > 1e12) return "-";
  const auto s = static_cast<uint64_t>(std::ceil(seconds));
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
}

std::optional<double> transfer_rate(const TransferProgress& p, double elapsed_seconds) {
  const uint64_t moved = p.bytes_done - std::min(p.bytes_skipped, p.bytes_done);
  if (!(elapsed_seconds > 0) || moved == 0) return std::nullopt;
  return static_cast<double>(moved) / elapsed_seconds;
}

std::optional<double> estimate_eta(const TransferProgress& p, double elapsed_seconds) {
  if (p.bytes_done >= p.bytes_total) return 0.0;
  // A rate measured over the first file or the first instant says little
  // about the rest (a small file, a connection still opening): no estimate
  // until enough time has passed and enough of the bytes to move have moved.
  if (!(elapsed_seconds >= kEtaMinSeconds)) return std::nullopt;
  const uint64_t skipped = std::min(p.bytes_skipped, p.bytes_done);
  const uint64_t moved = p.bytes_done - skipped;
  const uint64_t to_move = p.bytes_total - std::min(p.bytes_skipped, p.bytes_total);
  if (static_cast<double>(moved) < kEtaMinFraction * static_cast<double>(to_move)) {
    return std::nullopt;
  }
  const std::optional<double> rate = transfer_rate(p, elapsed_seconds);
  if (!rate || !(*rate > 0)) return std::nullopt;
  return static_cast<double>(p.bytes_total - p.bytes_done) / *rate;
}

std::string render_progress_bar(const TransferProgress& p, double elapsed_seconds, size_t width) {
  const std::optional<double> rate = transfer_rate(p, elapsed_seconds);
  const std::optional<double> eta = estimate_eta(p, elapsed_seconds);
  // Every field is padded to the widest text it can take during one copy (the
  // totals do not change), so the line and its bar keep their width from one
  // redraw to the next; single spaces leave a bar on an 80-column terminal.
  const size_t file_digits = fmt::formatted_size("{}", p.files_total);
  const std::string numbers = fmt::format(
      "{:>3}% {:>10}/{} {:>12} ETA {:>6} {:>{}}/{} files", percent(p), format_size(p.bytes_done),
      format_size(p.bytes_total), rate ? format_rate(*rate) : "-",
      eta ? format_duration(*eta) : "-", p.files_done, file_digits, p.files_total);
  // "[" + bar + "]  " + numbers; a bar narrower than 10 cells says nothing.
  if (width < numbers.size() + 4 + 10) return numbers.substr(0, width);
  const size_t cells = std::min<size_t>(40, width - numbers.size() - 4);
  const size_t filled = cells * percent(p) / 100;
  return fmt::format("[{}{}]  {}", std::string(filled, '#'), std::string(cells - filled, '.'),
                     numbers);
}

std::string render_progress_line(const TransferProgress& p, double elapsed_seconds) {
  const std::optional<double> rate = transfer_rate(p, elapsed_seconds);
  const std::optional<double> eta = estimate_eta(p, elapsed_seconds);
  return fmt::format("cp: {}% {}, {}/{} files, {}, ETA {}", percent(p), counts(p), p.files_done,
                     p.files_total, rate ? format_rate(*rate) : "-",
                     eta ? format_duration(*eta) : "-");
}

ProgressReporter::ProgressReporter(Mode mode, std::function<double()> clock,
                                   std::function<void(const std::string&)> write, size_t width)
    : mode_(mode), clock_(std::move(clock)), write_(std::move(write)), width_(width) {
  start_ = clock_();
}

void ProgressReporter::update(const TransferProgress& p) {
  last_ = p;
  if (mode_ == Mode::kOff) return;
  const double now = clock_();
  const double interval = mode_ == Mode::kBar ? kBarInterval : kLineInterval;
  if (last_draw_ && now - *last_draw_ < interval) return;
  draw(p, now);
}

void ProgressReporter::finish() {
  if (mode_ == Mode::kOff) return;
  draw(last_, clock_());
  abort();
}

void ProgressReporter::abort() {
  if (dirty_) write_("\n");
  dirty_ = false;
}

void ProgressReporter::draw(const TransferProgress& p, double now) {
  last_draw_ = now;
  if (mode_ == Mode::kBar) {
    // fmt rather than `"\r" + std::string&&`: g++ 12 at -O3 reports a false
    // -Wrestrict overlap for the latter (GCC bug 105329).
    write_(fmt::format("\r{}{}", render_progress_bar(p, now - start_, width_), kClearToEnd));
    dirty_ = true;
  } else {
    write_(render_progress_line(p, now - start_) + "\n");
  }
}

nlohmann::ordered_json cp_to_json(const TransferReport& r) {
  return {
      {"schema_version", kSchemaVersion},
      {"command", "cp"},
      {"kind", r.kind == TransferKind::kCheckpoint ? "checkpoint" : "experiment"},
      {"source", r.source},
      {"destination", r.destination},
      {"files_copied", r.files_copied},
      {"bytes_copied", r.bytes_copied},
      {"files_skipped", r.files_skipped},
      {"bytes_skipped", r.bytes_skipped},
      {"checkpoints_copied", r.checkpoints_copied},
      {"checkpoints_unchanged", r.checkpoints_unchanged},
      {"uncommitted_skipped", r.uncommitted_skipped},
      {"warnings", r.warnings},
      {"seconds", r.seconds},
  };
}

std::string cp_to_text(const TransferReport& r) {
  std::string out;
  for (const auto& u : r.uncommitted_skipped) {
    out += fmt::format("not copied (uncommitted, an interrupted save?): {}\n", u);
  }
  for (const auto& w : r.warnings) out += fmt::format("warning: {}\n", w);
  if (r.kind == TransferKind::kExperiment) {
    out += fmt::format("{} copied, {} already there\n",
                       plural(r.checkpoints_copied.size(), "checkpoint"),
                       r.checkpoints_unchanged.size());
  }
  out += fmt::format("cp: copied {} ({}), skipped {} ({}) already in place, in {:.1f} s, to {}\n",
                     plural(r.files_copied, "file"), format_size(r.bytes_copied),
                     plural(r.files_skipped, "file"), format_size(r.bytes_skipped), r.seconds,
                     r.destination);
  return out;
}

TransferReport run_cp(std::string_view src, std::string_view dst, int jobs, bool progress,
                      TransferVerify verify) {
  using Mode = ProgressReporter::Mode;
  Mode mode = Mode::kOff;
  size_t width = 80;
  if (progress) {
    mode = isatty(STDERR_FILENO) ? Mode::kBar : Mode::kLines;
    struct winsize ws {};
    if (mode == Mode::kBar && ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) {
      width = ws.ws_col - 1;  // the last column would wrap on some terminals
    }
  }
  auto clock = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  ProgressReporter reporter(
      mode, clock,
      [](const std::string& text) {
        std::fputs(render_text(text).c_str(), stderr);
        std::fflush(stderr);
      },
      width);
  TransferOptions options;
  options.jobs = jobs;
  options.clock = clock;
  options.verify = verify;
  if (mode != Mode::kOff) options.progress = [&](const TransferProgress& p) { reporter.update(p); };
  try {
    TransferReport report = transfer(src, dst, options);
    reporter.finish();
    return report;
  } catch (...) {
    reporter.abort();
    throw;
  }
}

}  // namespace cairn::cli
