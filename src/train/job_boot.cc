#include "train/job_boot.h"

#include <random>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cairn/error.h"
#include "train/mpi_messages.h"
#include "util/json.h"
#include "util/log.h"
#include "util/settings.h"

namespace cairn::train_internal {

std::string random_token() {
  std::random_device rd;
  return fmt::format("{:08x}{:08x}{:08x}{:08x}", rd(), rd(), rd(), rd());
}

JobBoot boot_mpi_job() {
  JobBoot b;
  b.world = mpi_join();
  // Rank 0 listens and broadcasts where; or broadcasts why it cannot.
  nlohmann::json boot = nlohmann::json::object();
  if (b.world.rank == 0) {
    try {
      const std::string forced = Settings::from(Environment::process()).mpi_address;
      std::vector<std::string> interfaces;
      try {
        interfaces = local_addresses();
      } catch (const Error& e) {
        // ignore-error: the host name is still advertised
        log::warn(fmt::format("driver: cannot list network interfaces: {}", e.what()));
      }
      b.control = choose_control_address(b.world.hosts, forced, interfaces, b.world.hosts.at(0));
      b.listener = std::make_unique<TcpListener>(b.control.bind);
      boot = {{"addresses", b.control.advertise},
              {"port", b.listener->port()},
              {"token", random_token()}};
    } catch (const Error& e) {
      boot = {{"error", error_to_json(e.code(), e.what())}};
    }
  }
  const std::string boot_source = "the MPI boot message of MPI rank 0";
  try {
    boot = parse_json(mpi_broadcast(b.world.rank == 0 ? boot.dump() : std::string()), boot_source);
    if (boot.contains("error")) {
      throw error_from_json(boot["error"], "the driver (MPI rank 0) could not listen: ");
    }
    b.addresses = boot.at("addresses").get<std::vector<std::string>>();
    b.port = boot.at("port").get<int>();
    b.token = boot.at("token").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    throw malformed(boot_source, e);
  }
  b.where = fmt::format("[{}] port {}", fmt::join(b.addresses, ", "), b.port);
  return b;
}

JobBoot boot_env_job(const EnvLaunch& launch) {
  JobBoot b;
  b.world.rank = launch.rank;
  b.world.size = launch.world_size;
  b.world.label = "rank";
  b.world.hosts.resize(static_cast<size_t>(launch.world_size));  // process 0 learns them at hello
  b.world.hosts.at(static_cast<size_t>(launch.rank)) = host_name();
  // No channel but the control port itself: the token only tells this
  // job's processes from strays that reach it.
  b.token = fmt::format("env:{}:{}:{}", launch.world_size, launch.master_addr, launch.control_port);
  b.where = fmt::format("{} port {}", launch.master_addr, launch.control_port);
  b.addresses = {launch.master_addr};
  b.port = launch.control_port;
  if (launch.rank == 0) {
    b.control = ControlAddress{launch.bind, {launch.master_addr}};
    b.listener = std::make_unique<TcpListener>(b.control.bind, launch.control_port);
  } else {
    b.world.hosts.at(0) = launch.master_addr;
  }
  return b;
}

Error env_launch_missing(const Settings& settings) {
  const std::string missing = missing_env_launch_variables(settings);
  return Error(ErrorCode::kInvalidArgument,
               missing.empty()
                   ? std::string("Launcher::kEnv inside a Trainer worker: the worker's "
                                 "RANK and WORLD_SIZE are its own group's")
                   : fmt::format("Launcher::kEnv needs the launcher's RANK, WORLD_SIZE, "
                                 "MASTER_ADDR and MASTER_PORT, or a Slurm job step's "
                                 "variables (run it under srun); not set: {}",
                                 missing));
}

std::optional<JobBoot> boot_launch(Launcher launcher) {
  if (launcher == Launcher::kMpi || (launcher == Launcher::kAuto && launched_by_mpi())) {
    return boot_mpi_job();
  }
  if (launcher == Launcher::kEnv || launcher == Launcher::kAuto) {
    const Settings settings = Settings::from(Environment::process());
    if (std::optional<EnvLaunch> env = env_launch_from(settings)) return boot_env_job(*env);
    if (launcher == Launcher::kEnv) throw env_launch_missing(settings);
  }
  return std::nullopt;
}

}  // namespace cairn::train_internal
