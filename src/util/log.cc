#include "util/log.h"

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
    const char* level = std::getenv("CAIRN_LOG_LEVEL");
    l->set_level(level ? spdlog::level::from_str(level) : spdlog::level::info);
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
