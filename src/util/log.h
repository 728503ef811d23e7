// Logging for the library: a thin door to spdlog so that the rest of the code
// does not depend on its API. Messages go to stderr; CAIRN_LOG_LEVEL
// (trace|debug|info|warn|error|off) sets the level, "info" by default.
// Thread-safe, and fork-safe: a process forked while another thread logs can
// log (the log's lock is held across fork(), never inherited held).
#pragma once

#include <string_view>

namespace cairn::log {

void info(std::string_view message);
void warn(std::string_view message);
void error(std::string_view message);
void debug(std::string_view message);

}  // namespace cairn::log
