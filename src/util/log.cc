#include "util/log.h"
#include "util/fork_safe.h"
#include "util/settings.h"

#include <cstdlib>
#include <memory>
#include <mutex>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace cairn::log {
namespace {

// Held around every message and across fork(): a process forked while
// another thread logs (the Trainer forks its workers while the memory tier's
// persister, the background deleter or an S3 lease's heartbeat may be
// logging) would otherwise start with spdlog's lock held and hang at its
// first message. The child's copy of this lock is its forking thread's, so
// it may unlock it.
// Innermost of the fork-safe locks (util/fork_safe.h): a thread that
// holds another may log, never the reverse.
ForkSafeMutex& fork_guard() {
  static ForkSafeMutex m(100);
  return m;
}

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> instance = [] {
    auto l = spdlog::stderr_color_mt("cairn");
    l->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [cairn] [%l] %v");
    const std::string level = Settings::from(Environment::process()).log_level;
    l->set_level(level.empty() ? spdlog::level::info : spdlog::level::from_str(level));
    return l;
  }();
  return *instance;
}

void write(spdlog::level::level_enum level, std::string_view message) {
  std::lock_guard<ForkSafeMutex> g(fork_guard());
  logger().log(level, "{}", message);
}

}  // namespace

void info(std::string_view message) { write(spdlog::level::info, message); }
void warn(std::string_view message) { write(spdlog::level::warn, message); }
void error(std::string_view message) { write(spdlog::level::err, message); }
void debug(std::string_view message) { write(spdlog::level::debug, message); }

}  // namespace cairn::log
