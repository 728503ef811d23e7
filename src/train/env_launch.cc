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
                            "variable for the Trainer's launch)",
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

namespace {

// CAIRN_CONTROL_PORT, else MASTER_PORT (+ 1 when the launcher holds it).
int control_port_from(const Settings& s, int master_port) {
  if (!s.control_port.empty()) return parse_int(s.control_port, "CAIRN_CONTROL_PORT", 1, 65535);
  if (!s.launcher_holds_master_port) return master_port;
  if (master_port == 65535) {
    throw Error(ErrorCode::kInvalidArgument,
                "MASTER_PORT=65535 is held by the launcher's store "
                "(TORCHELASTIC_USE_AGENT_STORE=True) and there is no next port for the "
                "Trainer's driver: set CAIRN_CONTROL_PORT");
  }
  return master_port + 1;
}

std::string bind_for(const std::string& master_addr) {
  if (!is_loopback(master_addr)) return "";  // every interface: other nodes connect
  return master_addr == "::1" ? "::1" : "127.0.0.1";
}

uint64_t parse_id(const std::string& text, const char* variable) {
  uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}=\"{}\" is not a whole number (Slurm's variable for the "
                            "Trainer's launch)",
                            variable, text));
  }
  return value;
}

EnvLaunch slurm_launch(const Settings& s) {
  EnvLaunch e;
  e.world_size = parse_int(s.slurm_step_tasks, "SLURM_STEP_NUM_TASKS", 1, 1 << 20);
  e.rank = parse_int(s.slurm_procid, "SLURM_PROCID", 0, e.world_size - 1);
  e.master_addr = s.master_addr.empty() ? first_slurm_host(s.slurm_step_nodelist) : s.master_addr;
  if (!s.control_port.empty() || !s.master_port.empty()) {
    const int master_port =
        s.master_port.empty() ? 0 : parse_int(s.master_port, "MASTER_PORT", 1, 65535);
    e.control_port = control_port_from(s, master_port);
  } else {
    const uint64_t job = s.slurm_job_id.empty() ? 0 : parse_id(s.slurm_job_id, "SLURM_JOB_ID");
    e.control_port = slurm_control_port(job, parse_id(s.slurm_step_id, "SLURM_STEP_ID"));
  }
  e.bind = bind_for(e.master_addr);
  e.world_size_source = "the Slurm job step's SLURM_STEP_NUM_TASKS";
  return e;
}

}  // namespace

std::optional<EnvLaunch> env_launch_from(const Settings& s) {
  if (s.in_cairn_worker) return std::nullopt;
  if (missing_env_launch_variables(s).empty()) {
    EnvLaunch e;
    e.world_size = parse_int(s.world_size, "WORLD_SIZE", 1, 1 << 20);
    e.rank = parse_int(s.rank, "RANK", 0, e.world_size - 1);
    e.master_addr = s.master_addr;
    e.control_port = control_port_from(s, parse_int(s.master_port, "MASTER_PORT", 1, 65535));
    e.bind = bind_for(e.master_addr);
    return e;
  }
  if (!s.slurm_procid.empty() && !s.slurm_step_id.empty() && !s.slurm_step_tasks.empty() &&
      !s.slurm_step_nodelist.empty()) {
    return slurm_launch(s);
  }
  return std::nullopt;
}

std::string first_slurm_host(std::string_view list) {
  std::string host;
  bool in_brackets = false;
  bool took_first = false;  // of the current bracket group
  for (char c : list) {
    if (in_brackets) {
      if (c == ']') {
        in_brackets = false;
      } else if (c == ',' || c == '-') {
        took_first = true;  // the first range's lower bound is complete
      } else if (!took_first) {
        host.push_back(c);
      }
      continue;
    }
    if (c == ',') break;  // the first host ends at a top-level comma
    if (c == '[') {
      in_brackets = true;
      took_first = false;
      continue;
    }
    host.push_back(c);
  }
  if (in_brackets || host.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("SLURM_STEP_NODELIST=\"{}\" names no host (a Slurm host list such "
                            "as \"node[01-04]\" was expected); set MASTER_ADDR to rank 0's host",
                            list));
  }
  return host;
}

int slurm_control_port(uint64_t job_id, uint64_t step_id) {
  return static_cast<int>(15000 + (job_id * 16 + step_id) % 15000);
}

}  // namespace cairn::train_internal
