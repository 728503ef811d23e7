#include "util/settings.h"

#include <cstdlib>

namespace cairn {

Environment Environment::process() {
  return Environment([](std::string_view name) -> std::optional<std::string> {
    // The only getenv in Cairn (scripts/check_layers.py holds it to that).
    const char* v = std::getenv(std::string(name).c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  });
}

Environment Environment::of(std::map<std::string, std::string, std::less<>> variables) {
  return Environment([vars = std::move(variables)](std::string_view name) {
    auto it = vars.find(name);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  });
}

std::string Environment::get_or(std::string_view name, std::string_view fallback) const {
  std::optional<std::string> v = get(name);
  return v && !v->empty() ? *v : std::string(fallback);
}

Settings Settings::from(const Environment& env) {
  Settings s;
  s.log_level = env.get_or("CAIRN_LOG_LEVEL", "");
  s.direct_io = env.get_or("CAIRN_DIRECT_IO", "");
  s.tune_state_period_s = env.get_or("CAIRN_TUNE_STATE_PERIOD_S", "");
  s.storage_path = env.get_or("CAIRN_STORAGE_PATH", "~/cairn_results");
  s.cache_dir = env.get_or("CAIRN_CACHE_DIR", "");
  s.memory_tier_dir = env.get_or("CAIRN_MEMORY_TIER_DIR", "/dev/shm");
  s.mpi_address = env.get_or("CAIRN_MPI_ADDRESS", "");
  s.gloo_socket_ifname = env.get_or("GLOO_SOCKET_IFNAME", "");
  s.temp_dir = env.get_or("TMPDIR", "/tmp");
  s.home = env.get_or("HOME", "");
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
    s.launched_by_mpi = s.launched_by_mpi || env.get(v).has_value();
  }
  s.rank = env.get_or("RANK", "");
  s.world_size = env.get_or("WORLD_SIZE", "");
  s.master_addr = env.get_or("MASTER_ADDR", "");
  s.master_port = env.get_or("MASTER_PORT", "");
  s.control_port = env.get_or("CAIRN_CONTROL_PORT", "");
  s.launcher_holds_master_port = env.get_or("TORCHELASTIC_USE_AGENT_STORE", "") == "True";
  s.in_cairn_worker = env.get("CAIRN_WORKER").has_value();
  s.slurm_procid = env.get_or("SLURM_PROCID", "");
  s.slurm_step_id = env.get_or("SLURM_STEP_ID", "");
  s.slurm_step_tasks = env.get_or("SLURM_STEP_NUM_TASKS", "");
  s.slurm_step_nodelist = env.get_or("SLURM_STEP_NODELIST", "");
  s.slurm_job_id = env.get_or("SLURM_JOB_ID", "");
  if (auto v = env.get("CUDA_VISIBLE_DEVICES")) s.cuda_visible_devices = std::string(*v);
  return s;
}

}  // namespace cairn
