// The training runtime: Ray Train's Trainer, report() and fault tolerance as a
// native library. docs/train.md is the user guide; this header is the
// contract.
//
//   cairn::Trainer trainer(train_fn, {{"num_epochs", 5}},
//                          cairn::ScalingConfig{.num_workers = 2},
//                          cairn::RunConfig{.name = "exp", .storage_path = "/shared/results"});
//   cairn::Result result = trainer.fit();
//
// Processes. fit() runs train_fn in `num_workers` worker processes (the
// ranks). With the local launcher the calling process is the driver and forks
// the workers. Under mpirun (docs/train.md, "Multi-node with MPI") every MPI
// process calls fit() and forks one rank's worker; MPI rank 0 is the driver,
// storage must be shared by every node (checked before training), and fit()
// returns the same Result, or throws the same error, on every process.
// Workers are killed when their parent dies (even by SIGKILL), so a dead
// driver never leaves a group running. Each worker leads a process group that
// the processes it starts join; that group is killed with the worker (when it
// exits, when the group stops, and, through a reaper process, when the driver
// or MPI agent dies by SIGKILL). Processes that leave the group (setsid) are
// not followed. Because
// workers are forked, the driver should call fit() from the thread that will
// live for the whole run, and not hold locks in other threads at that time.
//
// report() is collective: every rank calls it the same number of times.
//   - Metrics come from rank 0; the other ranks' metrics are ignored.
//   - Every rank that passes a checkpoint uploads that checkpoint's files
//     itself, in parallel with the others, straight into one reserved
//     checkpoint directory; the driver commits it (manifest last) only after
//     every rank's files are durable. report() returns on every rank after
//     the commit, so a checkpoint reported is durable when report() returns.
//   - Two ranks passing the same file name with different contents fail the
//     run with an error naming both ranks (same contents are fine).
//   - A rank that calls report() a different number of times than the others,
//     or does not arrive within FailureConfig::report_timeout_s of the first
//     rank, fails the group with an error naming it; nothing hangs.
//
// Failures. A worker that throws, exits non-zero or is killed by a signal
// stops the whole group (the other workers are killed). While
// FailureConfig::max_failures allows, the group restarts and get_checkpoint()
// returns the latest committed checkpoint. Unequal report counts,
// conflicting file names and invalid reports (metrics that are not a JSON
// object; with a checkpoint_score_attribute, a round with a checkpoint whose
// rank 0 metrics hold it as a non-number, found before any rank uploads) are
// not retried (a restart would repeat them). When
// the run ends in failure, Result::error names the rank, the cause and the
// tail of that rank's stderr; fit() does not throw for worker failures.
//
// Durability. Every committed checkpoint survives a crash of any process,
// the driver included; an interrupted upload is never visible and is removed
// the next time the experiment is opened. The trainer's own state
// (trainer_state.json in the experiment folder) is replaced atomically.
//
// History. Every report round is added to the experiment folder's
// result.json (one JSON object a line), progress.csv and TensorBoard event
// file before report() returns (docs/train.md, "The run's result files");
// Result::metrics_history holds the rows.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cairn/checkpoint.h"
#include "cairn/manager.h"
#include "cairn/run_config.h"

namespace cairn {

enum class Launcher {
  kAuto,   // MPI when started by mpirun/srun (an MPI rank variable is set), else torchrun-style
           // when RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are set or inside a Slurm job
           // step (srun without MPI), else local
  kLocal,  // fork num_workers processes on this machine
  kMpi,    // one worker per MPI process (the program runs under mpirun or srun)
  kEnv,    // one worker per process started by torchrun, a Kubernetes job, a shell loop or
           // Slurm's srun, placed by RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, or by the
           // Slurm step's SLURM_PROCID, SLURM_STEP_NUM_TASKS and SLURM_STEP_NODELIST
           // (docs/train.md)
};

struct ScalingConfig {
  // Ranks. Under MPI or a torchrun-style launcher, 0 means "the launcher's world
  // size"; any other value must equal it (or, with min_workers, hold it).
  int num_workers = 1;
  Launcher launcher = Launcher::kAuto;
  // Elastic training (Ray Train's num_workers=(min, max)): 0 keeps the group
  // at num_workers. Otherwise num_workers is the most ranks and min_workers
  // the fewest a group may restart with. When a launcher's process is lost
  // (a node of a torchrun-style launch, its connection to the driver gone),
  // the next attempt runs with the ranks that remain, renumbered 0..k-1,
  // as long as k >= min_workers; a process started again for a lost rank
  // (same RANK) joins at the next restart. Under mpirun, which ends the whole
  // job when one process dies, the job's world size may be anything in
  // [min_workers, num_workers] (Trainer::restore under a smaller mpirun).
  // Each attempt's world size is in TrainContext::world_size and
  // Result::restores; a rank reads its share of a sharded checkpoint saved
  // by another world size with ShardedReader (cairn/sharded.h). The local
  // launcher forks every rank itself and never loses one: there it only
  // changes what a Trainer::restore may run with.
  int min_workers = 0;

  void validate() const;
};

// The running worker's place in the group (train::get_context()).
struct TrainContext {
  int world_rank = 0;
  int world_size = 1;
  int local_rank = 0;        // rank among the workers on this node
  int local_world_size = 1;  // workers on this node
  int node_rank = 0;         // index of this node, in order of first rank
  std::string experiment_name;
  std::string storage_path;     // RunConfig::storage_path as resolved
  std::string experiment_path;  // storage_path/experiment_name
  int attempt = 0;              // 0 for the first start, +1 per group restart
  // Rendezvous for collective libraries (cairn/torch_distributed.h, or any
  // torchrun-style code): rank 0's node and a TCP port reserved for this
  // attempt, for rank 0 to listen on (c10d's TCPStore). Every attempt gets a
  // port of its own, held by the driver (bound, not listening) until the
  // attempt's workers are gone, so no other process on that node is given
  // it meanwhile; a listener must set SO_REUSEADDR to bind it. The worker
  // also exports them, with the ranks, as MASTER_ADDR, MASTER_PORT, RANK,
  // WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and GROUP_RANK (node rank)
  // before train_fn runs, as torchrun does.
  std::string master_addr;
  int master_port = 0;
};

using TrainFn = std::function<void(const nlohmann::json& train_loop_config)>;

// Functions for use inside train_fn, in a worker. Outside a worker they throw
// kFailedPrecondition. Not thread-safe: call them from train_fn's thread.
namespace train {

const TrainContext& get_context();

// The checkpoint to resume from: the latest committed checkpoint of this run
// after a restart or Trainer::restore, else resume_from_checkpoint, else none.
std::optional<Checkpoint> get_checkpoint();

struct ReportOptions {
  // Return once this rank's checkpoint files are snapshotted; the upload, and
  // the commit once every rank's files are durable, run in the background
  // while train_fn goes on. The snapshot hard-links the files of a local
  // checkpoint (no data is copied; it copies where a link cannot be made,
  // and copies a checkpoint held elsewhere), so after report() returns the
  // caller may delete its checkpoint directory or write new files into it,
  // but must not rewrite a reported file in place (write a new file, or
  // write to a temporary name and rename). Rounds, synchronous or not, are
  // committed in report order, and every rank must call report() the same
  // number of times, as always; ranks may mix modes. The preemption notice
  // (should_checkpoint()) arrives with a round's release, and an
  // asynchronous report() applies only the releases it has certainly
  // received: those of rounds up to this one minus max_in_flight (see
  // should_checkpoint()), so the notice is seen max_in_flight reports later
  // than in synchronous mode, on every rank alike.
  bool async = false;
  // Asynchronous reports of this rank snapshotted but not yet committed ("in
  // flight") at most; a report beyond that blocks until the oldest commits.
  // Each holds a snapshot in the run's scratch folder until then. >= 1.
  int max_in_flight = 1;
};

// Collective; see the top of this file. `metrics` must be a JSON object (or
// null, meaning none) that can be stored (nesting within 128 levels, valid
// UTF-8), and options.max_in_flight >= 1; otherwise throws kInvalidArgument
// and the run fails without retry. Throws cairn::Error if this rank's upload
// fails or the group is being stopped (let it propagate: the group restarts
// as configured). With options.async, an upload that fails in the background
// stops the group at once (it is retried as configured) and, if this worker
// is still running, is thrown by its next report() or wait_for_reports();
// a snapshot that fails is thrown by this call, before the round starts.
// When train_fn returns, the worker waits for its asynchronous reports to
// commit before it counts as finished.
void report(const nlohmann::json& metrics, const std::optional<Checkpoint>& checkpoint = {},
            const ReportOptions& options = {});

// Blocks until every asynchronous report of this rank is committed; throws
// the error of one that failed. Returns at once when none is pending.
void wait_for_reports();

// True once the run is being preempted: the driver or any worker received
// SIGTERM (spot reclaim, Slurm --signal, Kubernetes). The notice comes with
// the release of one report round, the same for every rank, and the value
// changes only inside report() (and wait_for_reports()), never while
// train_fn runs between them: a synchronous report() of round k applies the
// releases of rounds <= k, an asynchronous one those of rounds
// <= k - max_in_flight (released for sure once it has a slot), and
// wait_for_reports() all of them. So every rank whose k-th report() call
// used the same ReportOptions sees it turn true after that same call and
// can save an emergency checkpoint at its next one; the driver stops the
// group once that checkpoint is committed, or when
// FailureConfig::preemption_grace_s has passed since the signal. Each
// report() tells the driver what should_checkpoint() said before it, and a
// round with a checkpoint whose ranks disagree fails (a mismatch, not
// retried) instead of committing files of different steps. A worker's
// SIGTERM does not kill it.
bool should_checkpoint();

// A variable as this process's C environment holds it now; nullopt when
// unset. For embedders whose own copy of the environment was taken when the
// process started (Python's os.environ): the runtime sets variables for a
// forked worker after that (torchrun's, see TrainContext, and a Tuner
// trial's CUDA_VISIBLE_DEVICES, its GPUs). Works in any process.
std::optional<std::string> environment_value(std::string_view name);

// A local directory removed with everything in it when destroyed, like
// Python's tempfile.TemporaryDirectory. In a worker it lies under the run's
// scratch folder, which the driver also removes after the group stops, so
// nothing is left behind even when a worker is killed.
class TemporaryDirectory {
 public:
  TemporaryDirectory();
  ~TemporaryDirectory();
  TemporaryDirectory(const TemporaryDirectory&) = delete;
  TemporaryDirectory& operator=(const TemporaryDirectory&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace train

struct BestCheckpoint {
  Checkpoint checkpoint;
  nlohmann::json metrics;
};

struct Result {
  nlohmann::json metrics;                        // rank 0's last reported metrics
  std::optional<Checkpoint> checkpoint;          // the latest committed checkpoint
  std::vector<BestCheckpoint> best_checkpoints;  // kept checkpoints, best first
  std::string path;                              // the experiment's URI
  std::optional<std::string> error;              // set when the run failed or was preempted
  // The run was stopped by preemption (train::should_checkpoint()); `error`
  // says so, and Trainer::restore(path) continues it from its latest
  // checkpoint.
  bool preempted = false;
  // Every reported round of the experiment, oldest first, as stored in its
  // result.json (docs/train.md, "The run's result files"): rank 0's metrics
  // plus training_iteration (1, 2, ... across restarts and restores),
  // timestamp (Unix seconds), time_total_s (seconds of running, summed over
  // the drivers that ran the experiment), checkpoint_dir_name (the folder of
  // the checkpoint committed in that round, or null) and attempt
  // (TrainContext::attempt of the group that reported it).
  std::vector<nlohmann::json> metrics_history;
  // What each attempt of this fit() started from, in order: the attempt
  // (TrainContext::attempt), the checkpoint's folder name and the tier that
  // served every rank: "memory" (CheckpointConfig::memory_tier),
  // "persistent", or "external" (resume_from_checkpoint outside the
  // experiment). An attempt that started from nothing is not listed.
  // With the memory tier across hosts, `rank_tiers` says, by rank, where its
  // files came from: "memory" (its own host's memory) or "peer" (a peer
  // host's replica, copied to its host first); empty otherwise (every rank
  // was served by `tier`). `damaged`: the copies in memory that failed their
  // checksums when the attempt looked for its checkpoint, each dropped and
  // described (file and problem); the attempt took the next copy
  // (CheckpointManager::latest_intact).
  struct Restore {
    int attempt = 0;
    std::string checkpoint;
    std::string tier;
    int world_size = 0;  // the ranks this attempt ran with (elastic: ScalingConfig::min_workers)
    std::vector<std::string> rank_tiers;
    std::vector<std::string> damaged;
  };
  std::vector<Restore> restores;

  // The result of the experiment stored at `path` (a finished, failed or
  // crashed run), read without locking or changing anything; a line of
  // result.json torn by a crash is left out of metrics_history. A run with a
  // memory tier (docs/memory-tier.md) that died leaves its newest
  // checkpoints in this host's memory: `checkpoint` and `best_checkpoints`
  // count them (a URI in the tier's folder; the persistent copy where both
  // hold one), as `cairn ls` does; a damaged tier is left out with a
  // warning. kNotFound if there is no experiment there; kCorruption naming
  // the file if its trainer state or result.json (a line before the last)
  // is damaged.
  static Result from_path(std::string_view path);
};

class Trainer {
 public:
  Trainer(TrainFn train_fn, nlohmann::json train_loop_config, ScalingConfig scaling_config,
          RunConfig run_config, std::optional<Checkpoint> resume_from_checkpoint = std::nullopt);

  // Runs the training to its end. Worker failures end up in Result::error;
  // configuration and storage problems on the driver throw cairn::Error: a
  // bad storage path (kInvalidArgument, also when storage_path is itself an
  // experiment folder), an experiment locked by another live driver
  // (kLocked), or, for a new Trainer, a storage_path/name that already holds
  // an experiment (kAlreadyExists, nothing there is changed) unless
  // RunConfig::resume_existing is set. A Trainer from restore() continues
  // its experiment.
  Result fit();

  // True if `path` holds an experiment started by a Trainer
  // (trainer_state.json); false if it holds none. Throws kCorruption naming
  // the file if the state is damaged, and other storage errors as they come.
  static bool can_restore(std::string_view path);
  // A Trainer that continues the experiment at `path` from its latest
  // checkpoint, with its stored configuration, checkpoint history and
  // retention state. The experiment is the one at `path` (a leading "~" is
  // the home directory), even if it was moved or copied there after it ran:
  // RunConfig::storage_path and name are taken from `path`, not from the
  // state. `train_loop_config`, if given, replaces the stored one.
  // kNotFound if there is no trainer state at `path`; kCorruption if it is
  // damaged.
  static Trainer restore(std::string_view path, TrainFn train_fn,
                         std::optional<nlohmann::json> train_loop_config = std::nullopt);

  const RunConfig& run_config() const { return run_config_; }
  const ScalingConfig& scaling_config() const { return scaling_config_; }

 private:
  TrainFn train_fn_;
  nlohmann::json train_loop_config_;
  ScalingConfig scaling_config_;
  RunConfig run_config_;
  std::optional<Checkpoint> resume_from_checkpoint_;
  bool restoring_ = false;
};

}  // namespace cairn
