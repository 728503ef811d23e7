// The worker's side of the report protocol (see collective.h):
//
//   worker -> driver  {"t":"report","round":n,"metrics":{...},"checkpoint":bool,
//                      "preempted":bool}                        (SIGTERM seen here)
//   driver -> worker  {"t":"upload","round":n,"dest":URI}      (uploaders only)
//   worker -> driver  {"t":"uploaded","round":n,"files":[...],"metadata":{...}}
//   driver -> worker  {"t":"release","round":n,"checkpoint":URI|null,"preempt":bool}
//   driver -> worker  {"t":"abort","reason":"..."}             (group is stopping)
//   worker -> driver  {"t":"done","count":n} | {"t":"error","message":"..."}
//   worker -> driver  {"t":"invalid_report","message":"..."}  report() refused
//                     its arguments (not retried: a restart would repeat it)
//
// A rank writes its own files straight into the reserved destination with a
// CheckpointWriter (never committing it) and sends their sizes and checksums;
// only the driver writes the manifest.
#include <cxxabi.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <typeinfo>
#include <utility>

#include <fmt/format.h>

#include "cairn/commit.h"
#include "cairn/error.h"
#include "train/channel.h"
#include "train/group.h"
#include "train/sigterm.h"
#include "util/fs.h"
#include "util/json.h"

namespace cairn {

namespace {

struct Session {
  TrainContext context;
  std::optional<std::string> checkpoint_uri;
  std::string scratch_dir;
  train_internal::Channel* channel = nullptr;
  int reports = 0;
  bool preempt_notice = false;  // a release said the run is being preempted
  // SIGTERM to this worker: sent with its next report.
  const train_internal::SigtermNotice* sigterm = nullptr;
};

Session* g_session = nullptr;

Session& session(const char* what) {
  if (g_session == nullptr) {
    throw Error(ErrorCode::kFailedPrecondition,
                fmt::format("cairn::train::{}() called outside a worker; call it inside the "
                            "train_fn run by Trainer::fit()",
                            what));
  }
  return *g_session;
}

nlohmann::json entry_to_json(const ManifestEntry& e) {
  return {{"path", e.path}, {"size", e.size}, {"xxh3", e.xxh3}};
}

// Copies the rank's checkpoint files into `dest_uri`; returns their entries.
// A source that does not exist fails here instead of adding nothing.
std::vector<ManifestEntry> upload(const Checkpoint& source, const std::string& dest_uri) {
  CheckpointWriter writer(Checkpoint::from_directory(dest_uri));
  return writer.copy_from(source);
}

std::string exception_type_name(const std::type_info& type) {
  int status = 0;
  char* name = abi::__cxa_demangle(type.name(), nullptr, nullptr, &status);
  std::string out = status == 0 && name ? name : type.name();
  std::free(name);
  return out;
}

// torchrun's environment (TrainContext::master_addr), for code that reads it
// (c10d's env:// init, scripts the worker starts). The worker is a process of
// its own, so this changes nobody else's environment.
void export_rendezvous_env(const TrainContext& c) {
  const std::pair<const char*, std::string> vars[] = {
      {"MASTER_ADDR", c.master_addr},
      {"MASTER_PORT", std::to_string(c.master_port)},
      {"RANK", std::to_string(c.world_rank)},
      {"WORLD_SIZE", std::to_string(c.world_size)},
      {"LOCAL_RANK", std::to_string(c.local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(c.local_world_size)},
      {"GROUP_RANK", std::to_string(c.node_rank)},
  };
  for (const auto& [name, value] : vars) {
    if (::setenv(name, value.c_str(), 1) != 0) throw errno_error(errno, "setenv", name);
  }
}

[[noreturn]] void throw_aborted(const nlohmann::json& m) {
  throw Error(ErrorCode::kFailedPrecondition,
              fmt::format("the group is stopping: {}", m.value("reason", std::string("aborted"))));
}

}  // namespace

namespace train {

const TrainContext& get_context() { return session("get_context").context; }

std::optional<Checkpoint> get_checkpoint() {
  Session& s = session("get_checkpoint");
  if (!s.checkpoint_uri) return std::nullopt;
  return Checkpoint::from_directory(*s.checkpoint_uri);
}

void report(const nlohmann::json& metrics, const std::optional<Checkpoint>& checkpoint) {
  Session& s = session("report");
  train_internal::Channel& ch = *s.channel;
  try {
    if (!metrics.is_object() && !metrics.is_null()) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("rank {}: report() metrics must be a JSON object, got {}",
                              s.context.world_rank, metrics.type_name()));
    }
    // Metrics go into manifests and trainer_state.json: they must read back.
    check_storable_json(metrics, fmt::format("rank {}: report() metrics", s.context.world_rank));
  } catch (const Error& e) {
    // The driver fails the run once (a restart would repeat this); the
    // exception tells train_fn why.
    ch.send({{"t", "invalid_report"}, {"message", e.what()}});
    throw;
  }
  const int round = ++s.reports;
  ch.send({{"t", "report"},
           {"round", round},
           {"metrics", metrics.is_null() ? nlohmann::json::object() : metrics},
           {"checkpoint", checkpoint.has_value()},
           {"preempted", s.sigterm != nullptr && s.sigterm->received()}});
  for (int step = 0; step < 3; ++step) {  // at most: upload, release
    std::optional<nlohmann::json> m = ch.recv();
    if (!m) {
      throw Error(ErrorCode::kUnavailable,
                  fmt::format("rank {}: the driver went away during report #{}",
                              s.context.world_rank, round));
    }
    const std::string t = m->value("t", "");
    if (t == "abort") throw_aborted(*m);
    if (t == "release") {
      if (m->value("preempt", false)) s.preempt_notice = true;
      return;
    }
    if (t == "upload" && checkpoint) {
      const std::string dest = m->at("dest").get<std::string>();
      std::vector<ManifestEntry> files;
      nlohmann::json metadata;
      try {
        files = upload(*checkpoint, dest);
        metadata = checkpoint->get_metadata();
      } catch (const Error& e) {
        throw with_context(e, fmt::format("rank {}: uploading report #{}'s checkpoint to {}",
                                          s.context.world_rank, round, dest));
      }
      nlohmann::json list = nlohmann::json::array();
      for (const auto& f : files) list.push_back(entry_to_json(f));
      ch.send({{"t", "uploaded"}, {"round", round}, {"files", list}, {"metadata", metadata}});
      continue;
    }
    throw Error(ErrorCode::kInternal, fmt::format("rank {}: unexpected message from the driver: {}",
                                                  s.context.world_rank, m->dump()));
  }
  throw Error(ErrorCode::kInternal,
              fmt::format("rank {}: report #{} did not complete", s.context.world_rank, round));
}

bool should_checkpoint() { return session("should_checkpoint").preempt_notice; }

TemporaryDirectory::TemporaryDirectory() {
  std::string prefix = "cairn-tmp-";
  if (g_session != nullptr && !g_session->scratch_dir.empty()) {
    std::filesystem::path base = std::filesystem::path(g_session->scratch_dir) /
                                 fmt::format("rank-{}", g_session->context.world_rank);
    std::filesystem::create_directories(base);
    std::string templ = (base / "tmpXXXXXX").string();
    if (::mkdtemp(templ.data()) == nullptr) {
      throw errno_error(errno, "mkdtemp", templ);
    }
    path_ = templ;
    return;
  }
  path_ = make_temp_dir(prefix).string();
}

TemporaryDirectory::~TemporaryDirectory() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);  // ignore-error: best effort; the scratch root goes too
}

}  // namespace train

namespace train_internal {

int run_worker(const LaunchSpec& spec, int fd) {
  Channel channel(UniqueFd(fd), "the driver");
  Session s;
  s.context = spec.context;
  s.checkpoint_uri = spec.checkpoint_uri;
  s.scratch_dir = spec.scratch_dir;
  s.channel = &channel;
  g_session = &s;
  // SIGTERM is a preemption notice, not an end: the driver stops the group.
  SigtermNotice sigterm;
  s.sigterm = &sigterm;
  int status = 0;
  std::string error;
  try {
    export_rendezvous_env(spec.context);
    spec.train_fn(spec.train_loop_config);
  } catch (const std::exception& e) {
    error = fmt::format("{}: {}", exception_type_name(typeid(e)), e.what());
  } catch (...) {
    error = "an exception that is not a std::exception";
  }
  try {
    if (error.empty()) {
      channel.send({{"t", "done"}, {"count", s.reports}});
    } else {
      std::fprintf(stderr, "rank %d: train_fn raised %s\n", s.context.world_rank, error.c_str());
      channel.send({{"t", "error"}, {"message", "train_fn raised " + error}});
      status = 1;
    }
  } catch (const Error& e) {
    // ignore-error: the driver is gone or stopping us; the exit status tells it the rest
    std::fprintf(stderr, "rank %d: %s\n", s.context.world_rank, e.what());
    status = status == 0 ? 2 : status;
  }
  g_session = nullptr;
  std::cout.flush();
  std::fflush(nullptr);
  return status;
}

}  // namespace train_internal

}  // namespace cairn
