#include "util/log.h"
#include "util/settings.h"

#include <cstdlib>
#include <memory>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace cairn::log {
namespace {

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

}  // namespace

void info(std::string_view message) { logger().info("{}", message); }
void warn(std::string_view message) { logger().warn("{}", message); }
void error(std::string_view message) { logger().error("{}", message); }
void debug(std::string_view message) { logger().debug("{}", message); }

}  // namespace cairn::log
