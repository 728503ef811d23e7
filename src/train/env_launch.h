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
// Slurm's srun without MPI sets none of torchrun's variables; a job step's
// own stand in for them: SLURM_PROCID for RANK, SLURM_STEP_NUM_TASKS for
// WORLD_SIZE, the first host of SLURM_STEP_NODELIST for MASTER_ADDR, and a
// control port derived from the job and step ids (slurm_control_port) for
// MASTER_PORT; any of MASTER_ADDR, MASTER_PORT and CAIRN_CONTROL_PORT that
// is set still wins. A batch script outside a step (no SLURM_STEP_*
// variables) is no launch.
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
  // What gave the world size, for errors: "the launcher's WORLD_SIZE" or
  // "the Slurm job step's SLURM_STEP_NUM_TASKS".
  std::string world_size_source = "the launcher's WORLD_SIZE";
};

// The launch the variables describe; nullopt when neither torchrun's four
// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) nor a Slurm job step's
// (SLURM_PROCID, SLURM_STEP_ID, SLURM_STEP_NUM_TASKS, SLURM_STEP_NODELIST)
// are all set, or in a Cairn worker (which exports torchrun's for its own
// code). Throws kInvalidArgument naming the variable when one is not what
// the launcher would set (a rank outside [0, world size), a port outside
// 1..65535, a node list without a host).
std::optional<EnvLaunch> env_launch_from(const Settings& settings);

// The first host of a Slurm host list ("node[07-09,12],gpu1" -> "node07",
// "rack[1-2]-n[01-04]" -> "rack1-n01", "vm" -> "vm"): where rank 0 runs,
// since Slurm gives task 0 to the step's first node. Zero padding is kept.
// Throws kInvalidArgument naming the list when it has no host or its
// brackets do not close.
std::string first_slurm_host(std::string_view nodelist);

// The control port of a Slurm step without MASTER_PORT: 15000 + (job id * 16
// + step id) mod 15000, below the usual ephemeral range (32768 and up), so
// that every process of the step computes the same port and two steps on
// one node rarely meet.
int slurm_control_port(uint64_t job_id, uint64_t step_id);

// Which of the four variables are unset, for Launcher::kEnv's error ("" when
// none is).
std::string missing_env_launch_variables(const Settings& settings);

// fit() on every process of a torchrun-style launch: `scaling` is the
// Trainer's (num_workers 0 or WORLD_SIZE, or an elastic range holding it).
// Returns the same Result on every process; throws the driver's error on
// every process when it throws. In an elastic group a process lost for good
// leaves the others running; one started again with its RANK joins the next
// attempt.
Result fit_env(DriverSpec spec, const ScalingConfig& scaling, const EnvLaunch& launch);

}  // namespace cairn::train_internal
