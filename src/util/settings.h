// Settings from the process's surroundings, read in one place.
//
// Environment variables change some of Cairn's defaults (docs list each one).
// They are read through an Environment and nowhere else: a part takes what
// it needs as an option or a parameter, and only the code that fills in an
// option the caller left unset asks `Settings::from(Environment::process())`.
// Tests build an Environment from a map.
//
// Thread-safety: an Environment may be used from many threads as long as its
// lookup may; process() reads the live environment on every call (Cairn
// never modifies it; tests that do so do it between calls).
// Failure: none here. A value is parsed and judged by the part that uses it,
// which names the variable in its kInvalidArgument.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace cairn {

class Environment {
 public:
  using Lookup = std::function<std::optional<std::string>(std::string_view name)>;

  explicit Environment(Lookup lookup) : lookup_(std::move(lookup)) {}

  // The process's environment variables (getenv), read at each call.
  static Environment process();
  // Exactly these variables, for tests.
  static Environment of(std::map<std::string, std::string, std::less<>> variables);

  // The variable's value; nullopt when it is not set.
  std::optional<std::string> get(std::string_view name) const { return lookup_(name); }
  // The variable's value, or `fallback` when it is unset or empty.
  std::string get_or(std::string_view name, std::string_view fallback) const;

 private:
  Lookup lookup_;
};

// Every setting Cairn takes from the environment, as read; empty when unset.
struct Settings {
  std::string log_level;            // CAIRN_LOG_LEVEL (spdlog level names)
  std::string direct_io;            // CAIRN_DIRECT_IO (engine/io.h judges it)
  std::string tune_state_period_s;  // CAIRN_TUNE_STATE_PERIOD_S (the Tuner judges it)
  std::string storage_path;         // CAIRN_STORAGE_PATH, else "~/cairn_results"
  std::string cache_dir;            // CAIRN_CACHE_DIR
  std::string memory_tier_dir;      // CAIRN_MEMORY_TIER_DIR, else "/dev/shm"
  std::string mpi_address;          // CAIRN_MPI_ADDRESS
  std::string gloo_socket_ifname;   // GLOO_SOCKET_IFNAME
  std::string temp_dir;             // TMPDIR, else "/tmp"
  std::string home;                 // HOME
  bool launched_by_mpi = false;     // OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK set
  // A torchrun-style launcher's variables (train/env_launch.h judges them).
  std::string rank;                         // RANK
  std::string world_size;                   // WORLD_SIZE
  std::string master_addr;                  // MASTER_ADDR
  std::string master_port;                  // MASTER_PORT
  std::string control_port;                 // CAIRN_CONTROL_PORT
  bool launcher_holds_master_port = false;  // TORCHELASTIC_USE_AGENT_STORE=True
  bool in_cairn_worker = false;             // CAIRN_WORKER set (worker.cc exports it)
  // A Slurm job step's (srun's) variables for the same launch; a batch
  // script outside any step has no SLURM_STEP_* variables.
  std::string slurm_procid;         // SLURM_PROCID
  std::string slurm_step_id;        // SLURM_STEP_ID
  std::string slurm_step_tasks;     // SLURM_STEP_NUM_TASKS
  std::string slurm_step_nodelist;  // SLURM_STEP_NODELIST
  std::string slurm_job_id;         // SLURM_JOB_ID
  // The GPUs this process may use (tune/gpu_pool.h); nullopt when unset.
  std::optional<std::string> cuda_visible_devices;  // CUDA_VISIBLE_DEVICES

  static Settings from(const Environment& env);
};

}  // namespace cairn
