// The torchrun-style launcher (docs/train.md, "Started by torchrun, a
// Kubernetes job or a shell loop").
//
// Every process the launcher starts runs the program and calls
// Trainer::fit(), as under MPI (mpi.h), but the ranks learn their place
// from the variables torchrun sets: RANK and WORLD_SIZE, and MASTER_ADDR and
// MASTER_PORT for rank 0's node. Rank 0 is the driver and listens at
// MASTER_ADDR on the control port; every other process is an agent that
// connects there, says its host name, and forks its rank's worker when told
// to. From there on it is the MPI launcher's protocol, storage rule and
// restarts (mpi_launch.cc).
//
// The control port is MASTER_PORT, unless the launcher holds that port
// itself (torchrun's static rendezvous keeps its store there and says so
// with TORCHELASTIC_USE_AGENT_STORE=True): then MASTER_PORT + 1.
// CAIRN_CONTROL_PORT overrides both. The workers' own rendezvous
// (TrainContext::master_port) is another port, reserved per attempt.
//
// This header holds the pure part (tested alone) and fit_env().
#pragma once

#include <optional>
#include <string>

#include "cairn/train.h"
#include "train/control/driver.h"
#include "util/settings.h"

namespace cairn::train_internal {

struct EnvLaunch {
  int rank = 0;
  int world_size = 1;
  std::string master_addr;
  int control_port = 0;
  std::string bind;  // where rank 0 listens: "127.0.0.1" for a loopback MASTER_ADDR, else ""
};

// The launch the variables describe; nullopt when RANK, WORLD_SIZE,
// MASTER_ADDR or MASTER_PORT is unset, or in a Cairn worker (which exports
// them for its own code). Throws kInvalidArgument naming the variable when
// one is not what torchrun would set (RANK outside [0, WORLD_SIZE), a port
// outside 1..65535).
std::optional<EnvLaunch> env_launch_from(const Settings& settings);

// Which of the four variables are unset, for Launcher::kEnv's error ("" when
// none is).
std::string missing_env_launch_variables(const Settings& settings);

// fit() on every process of a torchrun-style launch: `num_workers` is
// ScalingConfig's (0 or WORLD_SIZE). Returns the same Result on every
// process; throws the driver's error on every process when it throws.
Result fit_env(DriverSpec spec, int num_workers, const EnvLaunch& launch);

}  // namespace cairn::train_internal
