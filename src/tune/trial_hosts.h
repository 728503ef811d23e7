// Trials on the hosts of a launch (docs/tune.md, "Trials on several
// hosts"). Under mpirun, srun or a torchrun-style launch every process runs
// the program and calls Tuner::fit(): process 0 runs the experiment (the
// Tuner's driver, experiment.h) and starts trials on itself; every other
// process is a trial host, a place that offers its cores and GPUs and runs
// the trials the driver starts there. The processes find each other as the
// Trainer's do (train/job_boot.h); the storage must be shared (the same
// probe as the Trainer's). Protocol over each host's connection:
//
//   host -> driver   {"t":"hello",...} (train/mpi_agents.h)
//   driver -> host   {"t":"describe"} -> {"t":"offer","cores":n,"gpus":[ids]}
//   driver -> host   {"t":"probe",...} -> {"t":"probe_result",...}
//   driver -> host   {"t":"start","trial":id,"spec":{...}}   fork the trial's runner
//   driver -> host   {"t":"to","trial":id,"m":{...}}          to that runner (trial_runner.h)
//   host -> driver   {"t":"from","trial":id,"m":{...}}        from it
//   host -> driver   {"t":"exited","trial":id,"status":n}     its wait status; after its
//                                                             last "from"
//   driver -> host   {"t":"kill","trial":id}                  SIGKILL (then "exited")
//   host -> driver   {"t":"preempted"}                        it received SIGTERM
//   driver -> host   {"t":"end","grid":{...}} | {"t":"end","error":{...}}
//
// A host whose connection closes is lost: its trials resume on other places
// from their latest checkpoints, without counting a failure. A host that
// receives SIGTERM (its node is being preempted) says so and stays: no trial
// starts there any more, and its running trials pause with a checkpoint at
// their next result and resume on other places; it relays until the end, or
// until it is killed (then it is lost, with nothing left to resume). A process
// started again with a lost host's rank is taken in (probe, offer) and gets
// trials again. A host that
// loses the driver kills its runners and throws kUnavailable.
//
// Thread-safety: none; each object belongs to the thread that runs fit().
// Failure: cairn::Error naming the host (rank and host name).
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cairn/tuner.h"
#include "train/job_boot.h"
#include "train/mpi_agents.h"
#include "tune/trial_runner.h"

namespace cairn::tune::tuner_internal {

// What one process of the launch offers for trials.
struct PlaceOffer {
  int cores = 1;                     // the cores it may run on
  std::vector<std::string> gpu_ids;  // as its trials' CUDA_VISIBLE_DEVICES name them
};

// This process's offer: the cores of its CPU affinity, and
// TuneConfig::gpu_ids if given, else the GPUs it sees (GpuPool).
PlaceOffer own_offer(const TuneConfig& tune);

// How many trials a place with `cores` runs at once when
// max_concurrent_trials is 0: cores / resources_per_trial.cpu, or / the
// workers per trial when that is 0; at least 1.
int default_slots(int cores, double cpu_per_trial, int num_workers);

// What each process of a launch keeps of its offer when several run on one
// host (`hosts[i]` names process i's host; they all see the same cores and
// GPUs): the k-th of m processes on a host keeps cores / m (at least 1)
// and the GPU ids at positions k, k + m, k + 2m, ... of its list, so no
// GPU is handed out twice.
std::vector<PlaceOffer> share_hosts(const std::vector<std::string>& hosts,
                                    std::vector<PlaceOffer> offers);

// The places a trial may start on now, best first: those below their
// `limit` and not `gone`, the fewest `running` first, then the lowest index
// (so trials spread across hosts).
std::vector<std::size_t> placement_order(std::span<const int> running, std::span<const int> limit,
                                         const std::vector<bool>& gone);

// A runner's spec as it crosses to a host: the trial's own fields and the
// run's settings (name, storage, failure budget, checkpoint config), with
// the code (train_fn, callbacks) left to each process's own Tuner.
nlohmann::json runner_to_json(const tune_internal::RunnerSpec& rs,
                              const std::vector<std::string>& gpu_ids);
// The spec from `j`, the code and other settings from `local`; the GPU ids
// into `gpu_ids`. nlohmann's exceptions for a wrong field reach the caller.
tune_internal::RunnerSpec runner_from_json(const nlohmann::json& j,
                                           const tune_internal::RunnerSpec& local,
                                           std::vector<std::string>& gpu_ids);

nlohmann::json grid_to_json(const ResultGrid& grid);
ResultGrid grid_from_json(const nlohmann::json& j);

// The driver's side: the other processes of the launch.
class TrialHosts {
 public:
  // Accepts every other process of the launch (kTimeout naming those that
  // did not connect within 120 s), takes their offers, and checks that each
  // sees the experiment's storage (kInvalidArgument naming the first that
  // does not, as the Trainer's launchers do). Every host is sent "end" with
  // the error when this throws.
  TrialHosts(train_internal::JobBoot& boot, const std::string& experiment_uri,
             const std::string& experiment_path);
  ~TrialHosts();
  TrialHosts(const TrialHosts&) = delete;
  TrialHosts& operator=(const TrialHosts&) = delete;

  std::size_t size() const { return agents_.size(); }
  const PlaceOffer& offer(std::size_t i) const { return offers_.at(i); }
  std::string name(std::size_t i) const { return agents_.at(i).name(); }
  const std::string& host(std::size_t i) const { return agents_.at(i).host; }
  bool gone(std::size_t i) const { return agents_.at(i).gone; }

  void start(std::size_t i, const std::string& trial, const nlohmann::json& spec);
  void send(std::size_t i, const std::string& trial, const nlohmann::json& message);
  void kill(std::size_t i, const std::string& trial);

  // Takes in, without waiting, processes started again for lost hosts
  // (with their rank): each passes the storage probe first (one that fails
  // is told why and stays out) and offers its cores and GPUs again.
  // Returns the hosts taken in.
  std::vector<std::size_t> admit_returning();

  // The connections to wait on (those not gone).
  std::vector<int> fds() const;

  struct Event {
    enum Type { kMessage, kExited, kLost, kPreempted } type = kMessage;
    std::size_t host = 0;
    std::string trial;       // kMessage, kExited
    nlohmann::json message;  // kMessage
    int wait_status = 0;     // kExited
    std::string why;         // kLost
  };
  // What arrived, without blocking; a host whose connection closed (or that
  // sent a malformed message) is lost, once.
  std::vector<Event> read();

  // The experiment's end, to every host not gone: {"t":"end","grid":...}
  // or {"t":"end","error":...}. Idempotent.
  void end(const nlohmann::json& message);

 private:
  // Asks the hosts `which` for their offers (kUnavailable naming one that
  // gives none; kCorruption for a malformed one).
  void take_offers(const std::vector<std::size_t>& which);

  train_internal::JobBoot& boot_;
  train_internal::DriverSpec probe_;  // the experiment, for the storage probe
  std::vector<train_internal::Agent> agents_;
  std::vector<PlaceOffer> offers_;
  std::vector<bool> lost_told_;  // read() reported the host lost (once)
  bool ended_ = false;
};

// When the driver fails before it knows its hosts: accepts them (as
// TrialHosts does, bounded) and tells each the error `e`, which they throw.
void refuse_hosts(train_internal::JobBoot& boot, const Error& e);

// A trial host's side: connects to process 0, offers this process's cores
// and GPUs, runs the trials it is sent (each a runner forked as the driver
// forks its own, `local` giving the code and the settings the messages do
// not carry) and relays their messages, until the experiment ends. Returns
// the experiment's ResultGrid; throws the driver's error, or kUnavailable
// when the driver is gone (its runners killed first).
ResultGrid serve_trials(const train_internal::JobBoot& boot, const TuneConfig& tune,
                        const tune_internal::RunnerSpec& local);

}  // namespace cairn::tune::tuner_internal
