#include "train/env_launch.h"

#include <charconv>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cairn/error.h"

namespace cairn::train_internal {

namespace {

int parse_int(const std::string& text, const char* variable, int low, int high) {
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < low || value > high) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}=\"{}\" is not a whole number from {} to {} (the launcher's "
                            "variable for the Trainer's torchrun-style launch)",
                            variable, text, low, high));
  }
  return value;
}

bool is_loopback(const std::string& address) {
  return address == "localhost" || address == "::1" || address.starts_with("127.");
}

}  // namespace

std::string missing_env_launch_variables(const Settings& s) {
  std::vector<std::string> missing;
  if (s.rank.empty()) missing.emplace_back("RANK");
  if (s.world_size.empty()) missing.emplace_back("WORLD_SIZE");
  if (s.master_addr.empty()) missing.emplace_back("MASTER_ADDR");
  if (s.master_port.empty()) missing.emplace_back("MASTER_PORT");
  return fmt::format("{}", fmt::join(missing, ", "));
}

std::optional<EnvLaunch> env_launch_from(const Settings& s) {
  if (s.in_cairn_worker || !missing_env_launch_variables(s).empty()) return std::nullopt;
  EnvLaunch e;
  e.world_size = parse_int(s.world_size, "WORLD_SIZE", 1, 1 << 20);
  e.rank = parse_int(s.rank, "RANK", 0, e.world_size - 1);
  e.master_addr = s.master_addr;
  const int master_port = parse_int(s.master_port, "MASTER_PORT", 1, 65535);
  if (!s.control_port.empty()) {
    e.control_port = parse_int(s.control_port, "CAIRN_CONTROL_PORT", 1, 65535);
  } else if (s.launcher_holds_master_port) {
    if (master_port == 65535) {
      throw Error(ErrorCode::kInvalidArgument,
                  "MASTER_PORT=65535 is held by the launcher's store "
                  "(TORCHELASTIC_USE_AGENT_STORE=True) and there is no next port for the "
                  "Trainer's driver: set CAIRN_CONTROL_PORT");
    }
    e.control_port = master_port + 1;
  } else {
    e.control_port = master_port;
  }
  e.bind = is_loopback(e.master_addr) ? (e.master_addr == "::1" ? "::1" : "127.0.0.1") : "";
  return e;
}

}  // namespace cairn::train_internal
