// How the processes of a launch find each other (the MPI launcher's and the
// torchrun-style launcher's first step, mpi.h and env_launch.h): every
// process learns its rank and the world size, process 0 listens for the
// others on TCP, and every other process learns where to connect and the
// job's token. The Tuner places trials on the processes of a launch the
// same way (tune/trial_hosts.h).
//
// Failure: cairn::Error. Under MPI the boot is collective: an error of
// process 0 (it cannot listen) reaches every process, prefixed "the driver
// (MPI rank 0) could not listen: ".
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cairn/error.h"
#include "cairn/train.h"
#include "train/control/net.h"
#include "train/env_launch.h"
#include "train/mpi.h"
#include "train/mpi_bootstrap.h"
#include "util/settings.h"

namespace cairn::train_internal {

struct JobBoot {
  MpiWorld world;  // under a torchrun-style launch only this process's host is known
  std::string token;
  std::string where;  // the control address, for messages: "[10.0.0.1, node0] port 4000"
  // Process 0: where it listens and what it told the others.
  std::unique_ptr<TcpListener> listener;
  ControlAddress control;
  // Every other process: where process 0 listens.
  std::vector<std::string> addresses;
  int port = 0;
};

// The MPI job's boot (collective over MPI_COMM_WORLD): host names gathered,
// and process 0's address, port and a random token broadcast.
JobBoot boot_mpi_job();

// A torchrun-style launch's: process 0 listens at MASTER_ADDR on the control
// port; the token is derived from the launch's variables.
JobBoot boot_env_job(const EnvLaunch& launch);

// The boot of the launch that started this process, for a program that
// does what `launcher` says (cairn/train.h, Launcher): kMpi an MPI job's,
// kEnv a torchrun-style launch's, kAuto whichever started it; nullopt when
// none did (kAuto) or for kLocal. kInvalidArgument naming the missing
// variables for kEnv without a launch.
std::optional<JobBoot> boot_launch(Launcher launcher);

// The error of Launcher::kEnv without a launch (`settings`: this process's).
Error env_launch_missing(const Settings& settings);

// A random token of 32 hex digits (connections without it are dropped).
std::string random_token();

}  // namespace cairn::train_internal
