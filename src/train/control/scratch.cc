#include "train/control/scratch.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "cairn/error.h"
#include "util/fs.h"
#include "util/log.h"
#include "util/settings.h"

namespace cairn::train_internal {

namespace {

constexpr std::string_view kPrefix = "cairn-train-";
constexpr std::string_view kOwnerFile = "owner";

std::optional<std::string> read_small(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string pid_namespace_of(const std::string& pid) {
  std::error_code ec;
  auto target = std::filesystem::read_symlink("/proc/" + pid + "/ns/pid", ec);
  return ec ? std::string() : target.string();
}

std::optional<ScratchOwner> owner_of(int64_t pid) {
  const std::string p = std::to_string(pid);
  auto stat = read_small("/proc/" + p + "/stat");
  if (!stat) return std::nullopt;
  auto start = stat_start_time(*stat);
  if (!start) return std::nullopt;
  return ScratchOwner{pid_namespace_of(p), pid, *start};
}

std::filesystem::path temp_root() { return Settings::from(Environment::process()).temp_dir; }

// Removes a scratch folder with its `owner` file last, so that a process
// killed in the middle leaves a folder the sweep still recognises. Calls
// only the file system (BackgroundRemover's child runs it).
void remove_scratch(const std::filesystem::path& folder, std::error_code& ec) {
  ec.clear();
  std::error_code listing;
  std::vector<std::filesystem::path> entries;
  for (std::filesystem::directory_iterator it(folder, listing), end; !listing && it != end;
       it.increment(listing)) {
    if (it->path().filename() != kOwnerFile) entries.push_back(it->path());
  }
  if (listing && listing != std::errc::no_such_file_or_directory) ec = listing;
  for (const auto& entry : entries) {
    std::error_code one;
    std::filesystem::remove_all(entry, one);
    if (one && !ec) ec = one;
  }
  if (ec) return;  // the owner stays: the folder is still its
  std::filesystem::remove_all(folder, ec);
}

}  // namespace

std::string format_owner(const ScratchOwner& o) {
  return fmt::format("{} {} {}\n", o.pid_namespace, o.pid, o.start_time);
}

std::optional<ScratchOwner> parse_owner(std::string_view text) {
  std::istringstream in{std::string(text)};
  ScratchOwner o;
  if (!(in >> o.pid_namespace >> o.pid >> o.start_time) || o.pid <= 0) return std::nullopt;
  return o;
}

std::optional<uint64_t> stat_start_time(std::string_view stat_text) {
  const size_t close = stat_text.rfind(')');
  if (close == std::string_view::npos) return std::nullopt;
  std::string_view rest = stat_text.substr(close + 1);
  // Fields after the command name start at 3 (state); the start time is 22.
  int field = 2;
  size_t i = 0;
  while (i < rest.size()) {
    while (i < rest.size() && rest[i] == ' ') ++i;
    size_t j = i;
    while (j < rest.size() && rest[j] != ' ' && rest[j] != '\n') ++j;
    if (j == i) break;
    if (++field == 22) {
      uint64_t v = 0;
      auto [ptr, ec] = std::from_chars(rest.data() + i, rest.data() + j, v);
      if (ec != std::errc() || ptr != rest.data() + j) return std::nullopt;
      return v;
    }
    i = j;
  }
  return std::nullopt;
}

ScratchDir::ScratchDir(BackgroundRemover* remover)
    : path_(make_temp_dir(kPrefix)), remover_(remover) {
  auto me = owner_of(::getpid());
  if (!me) return;  // no /proc: the folder is still removed by this object
  const auto owner = path_ / kOwnerFile;
  std::ofstream out(owner, std::ios::binary | std::ios::trunc);
  out << format_owner(*me);
  if (!out.flush()) {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);  // ignore-error: reporting the write failure below
    throw Error(ErrorCode::kIO,
                fmt::format("{}: could not write the scratch owner", owner.string()));
  }
}

ScratchDir::~ScratchDir() {
  if (remover_ != nullptr) {
    remover_->remove(path_);
    return;
  }
  std::error_code ec;
  remove_scratch(path_, ec);  // ignore-error: a temp dir; best effort (a later sweep retries)
}

void BackgroundRemover::remove(std::filesystem::path folder) {
  queued_.push_back(std::move(folder));
}

void BackgroundRemover::start() {
  reap();
  if (queued_.empty()) return;
  const pid_t pid = ::fork();
  if (pid == 0) {
    int failed = 0;
    for (const auto& folder : queued_) {
      std::error_code ec;
      remove_scratch(folder, ec);
      failed |= ec ? 1 : 0;
    }
    ::_exit(failed);
  }
  if (pid < 0) return;  // ignore-error: no process to spare; the destructor removes them
  running_.push_back({std::move(queued_), pid});
  queued_.clear();
}

void BackgroundRemover::reap() {
  for (const Removal& r : running_) {
    int status = 0;
    pid_t got;
    do {
      got = ::waitpid(r.pid, &status, 0);
    } while (got < 0 && errno == EINTR);
    if (got == r.pid && WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
    for (const auto& folder : r.folders) {
      std::error_code exists;
      if (!std::filesystem::exists(folder, exists)) continue;
      log::warn(fmt::format("could not remove the scratch folder {} (the next sweep retries)",
                            folder.string()));
    }
  }
  running_.clear();
}

BackgroundRemover::~BackgroundRemover() {
  reap();
  for (const auto& folder : queued_) {
    std::error_code ec;
    remove_scratch(folder, ec);
    if (ec) {
      log::warn(
          fmt::format("could not remove the scratch folder {}: {}", folder.string(), ec.message()));
    }
  }
}

std::vector<std::filesystem::path> sweep_dead_scratch_dirs() {
  std::vector<std::filesystem::path> removed;
  auto me = owner_of(::getpid());
  if (!me || me->pid_namespace.empty()) return removed;
  std::error_code ec;
  std::filesystem::directory_iterator it(temp_root(), ec);
  if (ec) return removed;  // ignore-error: nothing to sweep where nothing can be listed
  for (const auto& entry : it) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kPrefix, 0) != 0 || !entry.is_directory(ec)) continue;
    auto text = read_small(entry.path() / kOwnerFile);
    if (!text) continue;  // being created, or not ours to judge
    auto owner = parse_owner(*text);
    if (!owner || owner->pid_namespace != me->pid_namespace) continue;
    auto now = owner_of(owner->pid);
    if (now && now->start_time == owner->start_time) continue;  // alive
    remove_scratch(entry.path(), ec);
    if (ec) {
      log::warn(fmt::format("could not remove {}, left by a process that is gone: {}",
                            entry.path().string(), ec.message()));
      continue;
    }
    removed.push_back(entry.path());
  }
  return removed;
}

}  // namespace cairn::train_internal
