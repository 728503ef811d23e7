// The S3 backend's locks: a lease object naming its holder, taken with
// conditional writes where the server has them (or by listing where it does
// not), renewed by a heartbeat, and fencing the writes made in its folder
// (docs/s3.md). The pure decisions are in lease.h.
#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include <signal.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cairn/error.h"
#include "storage/s3/client.h"
#include "storage/s3/lease.h"
#include "storage/s3/s3_context.h"
#include "storage/s3/sigv4.h"
#include "storage/s3/xml.h"
#include "util/fork_safe.h"
#include "util/hash.h"
#include "util/json.h"
#include "util/log.h"

namespace cairn {
namespace s3 {
void count_lease_renewal();  // one more for lease_renewals()
}  // namespace s3

namespace s3_impl {
namespace {

// Who holds a lease: enough to tell, on the holder's own machine, that the
// holding process is gone.
struct Holder {
  std::string host;
  std::string boot_id;
  long pid = 0;
  std::string start_time;  // the process's start time in clock ticks since boot
  std::string token;       // unique per lease taken

  nlohmann::json to_json(long long ttl) const {
    return {{"host", host},   {"boot_id", boot_id}, {"pid", pid}, {"start_time", start_time},
            {"token", token}, {"ttl_seconds", ttl}};
  }
};

std::string read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// Field 22 of /proc/<pid>/stat, or "" when the process does not exist.
std::string process_start_time(long pid) {
  std::string stat = read_first_line(fmt::format("/proc/{}/stat", pid));
  size_t close = stat.rfind(')');
  if (close == std::string::npos) return "";
  std::istringstream rest(stat.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i) {
  }
  return field;
}

Holder this_process() {
  // Computed per process: a forked child must not claim its parent's pid.
  static ForkSafeMutex mu(30);
  static Holder self;
  std::lock_guard<ForkSafeMutex> g(mu);
  if (self.pid != static_cast<long>(::getpid())) {
    char name[256] = {};
    gethostname(name, sizeof(name) - 1);
    self.host = name;
    self.boot_id = read_first_line("/proc/sys/kernel/random/boot_id");
    self.pid = static_cast<long>(::getpid());
    self.start_time = process_start_time(self.pid);
  }
  return self;
}

std::string random_token() {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t seed = std::random_device{}() ^ (uint64_t{std::random_device{}()} << 32);
  return fmt::format("{:016x}-{}", seed, counter.fetch_add(1));
}

// The lease as read from the store, and whether it is still in force.
struct LeaseState {
  bool exists = false;
  bool live = false;
  bool readable = false;  // a lease with a holder's token; not empty or torn
  std::string etag;
  std::string token;        // empty when the lease could not be read
  std::string description;  // for kLocked messages
};

// An empty or torn lease (a PUT cut short by a kill: some servers store what
// arrived, even nothing) names no holder who could renew it: it is stale,
// not "held by pid 0" until its default term ends.
LeaseState read_lease(Context& ctx, const std::string& key) {
  S3Request r;
  r.key = key;
  r.accept = {404};
  HttpResponse resp = ctx.call(r);
  LeaseState s;
  if (resp.status == 404) return s;
  s.exists = true;
  s.etag = resp.header("etag").value_or("");
  double modified = last_modified(resp);
  double server_now = s3::parse_http_date(resp.header("date").value_or("")).value_or(0.0);
  if (server_now == 0.0) {
    server_now =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  }
  nlohmann::json body;
  try {
    body = parse_json(resp.body, ctx.uri(key));
  } catch (const Error&) {  // ignore-error: an unreadable lease is stale (see above)
    body = nlohmann::json::object();
  }
  auto str = [&](const char* k) {
    return body.is_object() && body.contains(k) && body[k].is_string() ? body[k].get<std::string>()
                                                                       : std::string();
  };
  long long ttl =
      body.is_object() && body.contains("ttl_seconds") && body["ttl_seconds"].is_number_integer()
          ? body["ttl_seconds"].get<long long>()
          : ctx.client->options().lock_ttl.count();
  long pid = body.is_object() && body.contains("pid") && body["pid"].is_number_integer()
                 ? body["pid"].get<long>()
                 : 0;
  s.token = str("token");
  s.readable = !s.token.empty();
  double age = server_now - modified;
  s.live = s.readable && age < static_cast<double>(ttl);
  // On the holder's own machine a dead holder is known at once.
  Holder self = this_process();
  bool same_machine =
      !self.boot_id.empty() && str("host") == self.host && str("boot_id") == self.boot_id;
  if (s.live && same_machine && pid > 0 && process_start_time(pid) != str("start_time")) {
    s.live = false;
  }
  if (!s.readable) {
    s.description =
        fmt::format("an unreadable lease ({} bytes, written {:.0f} s ago)", resp.body.size(), age);
  } else {
    s.description =
        fmt::format("held by pid {} on {} (lease renewed {:.0f} s ago, expires after {} s)", pid,
                    str("host").empty() ? "an unknown host" : str("host"), age, ttl);
  }
  return s;
}

// What a conditional write of a lease came to.
struct LeaseWrite {
  enum class Outcome {
    kWritten,             // `etag` is the new lease's
    kPreconditionFailed,  // another writer got there first
    kUnsupported,         // the server cannot do conditional writes; nothing written
  };
  Outcome outcome = Outcome::kWritten;
  std::string etag;
};

// Writes a lease over `key` without a condition; returns its ETag.
std::string put_lease_plainly(Context& ctx, const std::string& key, const std::string& body) {
  S3Request r;
  r.method = "PUT";
  r.key = key;
  r.body = bytes_of(body);
  r.headers = {{"content-md5", s3::md5_base64(r.body)}};
  return ctx.call(r).header("etag").value_or("");
}

// Writes a lease over `key` with `If-None-Match: *` when `expected_etag` is
// empty (there is none), else with `If-Match` on that ETag. Servers differ
// in how they take If-Match (lease.h): the form that works is learned on
// first use by trying the other one after a 412. A server that refuses both
// forms while the lease still has the ETag just read, or answers 501,
// cannot do conditional writes: that is remembered in the context, and the
// caller falls back to the protocol that needs none (docs/s3.md).
// A write whose answer was lost is retried, and its retry then fails its own
// condition (the object is no longer missing, or no longer has the ETag it
// was written over): a refusal is read back, and a lease that holds `token`
// is this write's after all.
LeaseWrite put_lease(Context& ctx, const std::string& key, const std::string& body,
                     const std::string& token, const std::string& expected_etag) {
  using Outcome = LeaseWrite::Outcome;
  auto put = [&](std::pair<std::string, std::string> condition) {
    S3Request r;
    r.method = "PUT";
    r.key = key;
    r.body = bytes_of(body);
    r.headers = {{"content-md5", s3::md5_base64(r.body)}, std::move(condition)};
    r.accept = {409, 412, 501};
    return ctx.call(r);
  };
  auto unsupported = [&](std::string_view header) {
    log::warn(
        fmt::format("{}: the server refuses conditional writes ({}); leases are taken by "
                    "listing instead (docs/s3.md, \"The experiment lock\")",
                    ctx.uri(key), header));
    ctx.no_conditional_writes = true;
    return LeaseWrite{Outcome::kUnsupported, ""};
  };
  auto refused = [&]() -> LeaseWrite {
    LeaseState now = read_lease(ctx, key);
    if (now.exists && now.token == token) return {Outcome::kWritten, now.etag};
    return {Outcome::kPreconditionFailed, ""};
  };
  if (expected_etag.empty()) {
    HttpResponse resp = put({"if-none-match", "*"});
    if (resp.status == 409 || resp.status == 412) return refused();
    if (resp.status == 501) return unsupported("If-None-Match");
    return {Outcome::kWritten, resp.header("etag").value_or("")};
  }
  using s3::IfMatchForm;
  IfMatchForm known = ctx.if_match_form.load();
  std::vector<IfMatchForm> forms = {known};
  if (known == IfMatchForm::kUnknown) forms = {IfMatchForm::kQuoted, IfMatchForm::kBare};
  for (IfMatchForm form : forms) {
    HttpResponse resp =
        put({"if-match", s3::if_match_value(expected_etag, form == IfMatchForm::kQuoted)});
    if (resp.status < 300) {
      ctx.if_match_form = form;
      return {Outcome::kWritten, resp.header("etag").value_or("")};
    }
    if (resp.status == 501) return unsupported("If-Match");
  }
  // Every form refused: a real change by another writer (or this one's own
  // write, answered too late), or a server that cannot compare (then the
  // lease still has the ETag just read).
  std::optional<Context::Head> now = ctx.head(key);
  if (!now || !s3::same_etag(now->etag, expected_etag)) return refused();
  return unsupported("If-Match");
}

// Takes the lease at `key` (read as lapsed or missing) on a server without
// conditional writes, where a plain PUT lets the last of several takers
// win unseen. Each taker writes an object of its own beside the lease,
// waits until it can see it, then lists the takers: of takers that all do
// so, at most one sees no other (whichever wrote last sees the first), and
// only that one goes on, reads the lease again and writes it. The others
// withdraw theirs, wait a random while and try again, up to a few times. A
// taker killed midway leaves an object that counts as a rival for one
// lease lifetime (the server's clock), then is ignored and deleted; so a
// taker that has not sent the lease within half a lifetime of starting, or
// whose write is answered more than half a lifetime after it was sent,
// gives up, as a holder renews within half of one (LeaseGuard::renew).
// Returns the lease's ETag; throws kLocked (retryable) when it is held or
// contended.
std::string take_lease_by_listing(Context& ctx, const std::string& key, const std::string& body,
                                  const std::string& token, std::string replaced_token,
                                  std::chrono::steady_clock::time_point& confirmed) {
  const std::chrono::seconds ttl = ctx.client->options().lock_ttl;
  const std::string prefix = taker_prefix(key);
  const std::string mine = prefix + token;
  auto locked = [&](const std::string& why) {
    return Error(ErrorCode::kLocked, fmt::format("{}: locked, {}", ctx.uri(key), why),
                 /*retryable=*/true);
  };
  // Best effort: a takers' object that cannot be deleted (the store
  // failing) is left as a killed taker's would be, ignored after a lifetime.
  auto remove = [&](const std::string& k) noexcept {
    try {
      ctx.remove(k);
    } catch (const Error& e) {  // ignore-error: see above
      log::warn(e.what());
    }
  };
  // This taker's object is withdrawn on every way out of an attempt.
  struct Withdrawal {
    std::function<void()> run;
    ~Withdrawal() { run(); }
  };
  std::mt19937_64 rng(std::hash<std::string>{}(token));
  constexpr int kAttempts = 6;
  for (int attempt = 0;; ++attempt) {
    const auto started = s3::lease_now();
    int rivals = 0;
    std::vector<std::string> stale;
    {
      put_lease_plainly(ctx, mine, body);
      Withdrawal withdrawal{[&] { remove(mine); }};
      std::optional<Context::Head> own = ctx.head(mine);
      for (int i = 0; i < 5 && !own; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10 << i));
        own = ctx.head(mine);
      }
      if (!own) {
        throw locked(fmt::format("the server does not show {} after writing it", ctx.uri(mine)));
      }
      for (const s3::ListedObject& o : ctx.list_objects(prefix)) {
        if (o.key == mine) continue;
        // Last-Modified has whole seconds: one more for the rounding.
        if (own->info.modified - o.modified >= static_cast<double>(ttl.count() + 1)) {
          stale.push_back(o.key);
        } else {
          ++rivals;
        }
      }
      if (rivals == 0) {
        LeaseState s = read_lease(ctx, key);
        if (s.exists && s.live) throw locked(s.description);
        if (s3::lease_needs_confirming(started, s3::lease_now(), ttl)) {
          throw locked(fmt::format("taking it over took longer than half its lifetime ({} s)",
                                   ttl.count() / 2));
        }
        if (s.exists) replaced_token = s.token;
        confirmed = s3::lease_now();
        std::string etag = put_lease_plainly(ctx, key, body);
        // Answered so late that the lease must be confirmed before its
        // first use, which a plain write cannot do (LeaseGuard::renew): it
        // may have landed after a later taker saw this one's object as a
        // dead taker's and took the lease. Not handed out; left to lapse.
        if (s3::lease_needs_confirming(confirmed, s3::lease_now(), ttl)) {
          throw locked(
              fmt::format("taking it over took longer than half its lifetime ({} s): the lease was "
                          "written only after that and is left to lapse",
                          ttl.count() / 2));
        }
        // Shown to the next taker before this one withdraws (some servers
        // answer a PUT before the object is readable).
        LeaseState after = read_lease(ctx, key);
        auto seen = s3::classify_lease_read_back(after.exists, after.token, token, replaced_token);
        for (int i = 0; i < 5 && seen == s3::LeaseReadBack::kNotYetVisible; ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10 << i));
          after = read_lease(ctx, key);
          seen = s3::classify_lease_read_back(after.exists, after.token, token, replaced_token);
        }
        if (seen != s3::LeaseReadBack::kOurs) throw locked("taken by another process just now");
        for (const auto& k : stale) remove(k);
        return etag;
      }
    }
    if (attempt + 1 == kAttempts) {
      throw locked(fmt::format("{} other processes are taking it over right now", rivals));
    }
    std::uniform_int_distribution<int> wait_ms(10, 40 << attempt);
    std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms(rng)));
    LeaseState s = read_lease(ctx, key);
    if (s.exists && s.live) throw locked(s.description);
    if (s.exists) replaced_token = s.token;
  }
}
}  // namespace

// A lease held through a context, shared by its S3Lock (heartbeat, release)
// and the context's fence(). `mu` serializes renewals and fence checks.
struct LeaseGuard {
  std::string key;  // the lease object
  std::string dir;  // the folder it guards: every key below it
  std::string body;
  std::string token;
  std::mutex mu;
  std::string etag;                                 // of the lease as last written by us
  std::chrono::steady_clock::time_point confirmed;  // when that write was sent
  bool lost = false;
  std::string lost_to;  // who holds it now, for messages

  bool guards(const std::string& k) const {
    return k != key &&
           (dir.empty() || (k.size() > dir.size() && k.starts_with(dir) && k[dir.size()] == '/'));
  }

  // Renews the lease if it is still ours: read it, then write it again on
  // the ETag read. Call with `mu` held. Returns false (and marks it lost)
  // when another holder has it.
  bool renew(Context& ctx) {
    if (lost) return false;
    auto sent = s3::lease_now();
    LeaseState s = read_lease(ctx, key);
    // A lease read mid-write (some servers let that happen) has no token:
    // only another holder's token means the lease was lost.
    if (s.exists && s.readable && s.token != token) {
      lost = true;
      lost_to = s.description;
      return false;
    }
    // Gone: another process took it over and released it, or it was
    // deleted by hand. Writing it again could hide a successor's work.
    if (!s.exists) {
      lost = true;
      lost_to = "deleted by another process";
      return false;
    }
    LeaseWrite w = ctx.conditional() ? put_lease(ctx, key, body, token, s.etag)
                                     : LeaseWrite{LeaseWrite::Outcome::kUnsupported, ""};
    if (w.outcome == LeaseWrite::Outcome::kUnsupported) {
      // A plain write is safe only while no taker can have seen the lease
      // lapse: sent within half its lifetime of the last renewal, with the
      // other half for the write to land (the margin fencing uses too).
      if (s3::lease_needs_confirming(confirmed, sent, ctx.client->options().lock_ttl)) {
        lost = true;
        lost_to = fmt::format(
            "not renewed within half its lifetime ({} s), which a server without conditional "
            "writes needs to rule out a takeover",
            ctx.client->options().lock_ttl.count() / 2);
        return false;
      }
      w = {LeaseWrite::Outcome::kWritten, put_lease_plainly(ctx, key, body)};
    }
    if (w.outcome == LeaseWrite::Outcome::kPreconditionFailed) {
      LeaseState now = read_lease(ctx, key);
      lost = true;
      lost_to = now.description;
      return false;
    }
    etag = w.etag;
    confirmed = sent;
    return true;
  }
};

void Context::fence(const std::string& key, std::string_view what) {
  std::vector<std::shared_ptr<LeaseGuard>> held;
  {
    std::lock_guard<std::mutex> g(leases_mu);
    for (const auto& w : leases) {
      if (auto guard = w.lock(); guard && guard->guards(key)) held.push_back(std::move(guard));
    }
  }
  for (const auto& guard : held) {
    std::lock_guard<std::mutex> g(guard->mu);
    if (!guard->lost && !s3::lease_needs_confirming(guard->confirmed, s3::lease_now(),
                                                    client->options().lock_ttl)) {
      continue;
    }
    if (!guard->lost) guard->renew(*this);
    if (guard->lost) {
      throw Error(ErrorCode::kLocked,
                  fmt::format("{}: the lock was lost ({}); {} of {} refused (the lease lapsed "
                              "while this process held it: paused or cut off for longer than "
                              "CAIRN_S3_LOCK_TTL)",
                              uri(guard->key), guard->lost_to, what, uri(key)));
    }
  }
}

namespace {

// A lease on a key: an object naming its holder, renewed by a heartbeat
// thread every third of its lifetime and deleted on release. A holder that
// dies stops renewing, so the lease lapses after lock_ttl (at once when the
// next taker runs on the same machine and sees the holder's process gone).
// Writes and deletes through the same context below the lease's folder are
// fenced by it (Context::fence).
class S3Lock final : public Lock {
 public:
  S3Lock(std::shared_ptr<Context> ctx, std::shared_ptr<LeaseGuard> guard)
      : ctx_(std::move(ctx)), guard_(std::move(guard)) {
    {
      std::lock_guard<std::mutex> g(ctx_->leases_mu);
      ctx_->leases.push_back(guard_);
    }
    heartbeat_ = std::thread([this] { beat(); });
  }
  ~S3Lock() override {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    heartbeat_.join();
    {
      std::lock_guard<std::mutex> g(ctx_->leases_mu);
      std::erase_if(ctx_->leases, [&](const auto& w) {
        auto p = w.lock();
        return !p || p == guard_;
      });
    }
    try {
      std::lock_guard<std::mutex> lease(guard_->mu);
      // Deleting what is read as ours is safe only while no taker can have
      // seen it lapse; past half its lifetime it is confirmed first.
      if (!guard_->lost && s3::lease_needs_confirming(guard_->confirmed, s3::lease_now(),
                                                      ctx_->client->options().lock_ttl)) {
        guard_->renew(*ctx_);
      }
      LeaseState s = guard_->lost ? LeaseState{} : read_lease(*ctx_, guard_->key);
      if (s.exists && s.token == guard_->token) ctx_->remove(guard_->key);
    } catch (const Error& e) {  // ignore-error: an unreleased lease lapses after its TTL
      log::warn(
          fmt::format("{}: could not release the lock: {}", ctx_->uri(guard_->key), e.what()));
    }
  }

 private:
  void beat() {
    std::unique_lock<std::mutex> g(mu_);
    // A fourth of the lifetime where a renewal must be sent within half of
    // it (LeaseGuard::renew without conditional writes).
    auto period = [&] {
      return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          ctx_->client->options().lock_ttl / (ctx_->conditional() ? 3 : 4));
    };
    auto due = s3::lease_now() + period();
    for (;;) {
      // Due on the lease clock (s3::lease_now), looked at at least once a
      // second of real time: a test moves that clock by hand.
      const auto left = std::clamp(due - s3::lease_now(), std::chrono::steady_clock::duration(0),
                                   std::chrono::steady_clock::duration(std::chrono::seconds(1)));
      if (cv_.wait_for(g, left, [&] { return stop_; })) return;
      if (s3::lease_now() < due) continue;
      g.unlock();
      try {
        std::lock_guard<std::mutex> lease(guard_->mu);
        if (!guard_->renew(*ctx_)) {
          log::error(fmt::format("{}: the lock was taken over by another process ({})",
                                 ctx_->uri(guard_->key), guard_->lost_to));
          g.lock();
          return;
        }
        s3::count_lease_renewal();
      } catch (const Error& e) {  // ignore-error: the next beat tries again
        log::warn(
            fmt::format("{}: renewing the lock failed: {}", ctx_->uri(guard_->key), e.what()));
      }
      due = s3::lease_now() + period();
      g.lock();
    }
  }

  std::shared_ptr<Context> ctx_;
  std::shared_ptr<LeaseGuard> guard_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread heartbeat_;
};

}  // namespace

std::unique_ptr<Lock> take_lease(const std::shared_ptr<Context>& ctx_, const std::string& k) {
  LeaseState s = read_lease(*ctx_, k);
  // An unreadable lease may be one being written right now (s3rver shows
  // an object while its body arrives): it is stale only if it stays so
  // over a few reads (bounded, ~0.3 s in all).
  for (int i = 0; i < 5 && s.exists && !s.readable; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10 << i));
    s = read_lease(*ctx_, k);
  }
  if (s.exists && s.live) {
    throw Error(ErrorCode::kLocked, fmt::format("{}: locked, {}", ctx_->uri(k), s.description),
                /*retryable=*/true);
  }
  auto guard = std::make_shared<LeaseGuard>();
  Holder h = this_process();
  h.token = random_token();
  guard->key = k;
  guard->dir = std::string(split_dir(k).first);
  guard->token = h.token;
  guard->body = h.to_json(ctx_->client->options().lock_ttl.count()).dump();
  guard->confirmed = s3::lease_now();
  // Where the server has conditional writes (AWS S3 and radosgw do) taking
  // the lease is atomic: only one of several racing takers succeeds.
  if (ctx_->conditional()) {
    LeaseWrite w = put_lease(*ctx_, k, guard->body, h.token, s.exists ? s.etag : "");
    if (w.outcome == LeaseWrite::Outcome::kPreconditionFailed) {
      throw Error(ErrorCode::kLocked,
                  fmt::format("{}: locked, taken by another process just now", ctx_->uri(k)),
                  /*retryable=*/true);
    }
    if (w.outcome == LeaseWrite::Outcome::kWritten) {
      guard->etag = w.etag;
      // Servers that accept the headers and ignore them (s3rver) let the
      // last writer win: read back to see who did, again (bounded, ~0.3 s
      // in all) while the server does not show the write yet.
      LeaseState after = read_lease(*ctx_, k);
      s3::LeaseReadBack seen =
          s3::classify_lease_read_back(after.exists, after.token, h.token, s.token);
      for (int i = 0; i < 5 && seen == s3::LeaseReadBack::kNotYetVisible; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10 << i));
        after = read_lease(*ctx_, k);
        seen = s3::classify_lease_read_back(after.exists, after.token, h.token, s.token);
      }
      if (seen != s3::LeaseReadBack::kOurs) {
        throw Error(ErrorCode::kLocked,
                    fmt::format("{}: locked, taken by another process just now", ctx_->uri(k)),
                    /*retryable=*/true);
      }
      return std::make_unique<S3Lock>(ctx_, std::move(guard));
    }
  }
  guard->etag = take_lease_by_listing(*ctx_, k, guard->body, h.token, s.token, guard->confirmed);
  return std::make_unique<S3Lock>(ctx_, std::move(guard));
}

bool lease_is_live(Context& ctx, const std::string& key) {
  LeaseState s = read_lease(ctx, key);
  return s.exists && s.live;
}

}  // namespace s3_impl

namespace s3 {
namespace {
ForkSafeMutex lease_clock_mu(40);
LeaseClock lease_clock;
std::atomic<uint64_t> renewals{0};
}  // namespace

void count_lease_renewal() { renewals.fetch_add(1, std::memory_order_relaxed); }
uint64_t lease_renewals() { return renewals.load(std::memory_order_relaxed); }

void set_lease_clock_for_testing(LeaseClock clock) {
  std::lock_guard<ForkSafeMutex> g(lease_clock_mu);
  lease_clock = std::move(clock);
}

std::chrono::steady_clock::time_point lease_now() {
  std::lock_guard<ForkSafeMutex> g(lease_clock_mu);
  return lease_clock ? lease_clock() : std::chrono::steady_clock::now();
}
}  // namespace s3

}  // namespace cairn
