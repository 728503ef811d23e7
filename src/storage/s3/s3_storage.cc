// The S3 backend: Storage over an S3-compatible object store.
//
//   objects        one S3 object per key, under "<prefix>/" in the bucket.
//   writes         one PUT when the object fits in a part; otherwise a
//                  multipart upload with parts sent in parallel as they fill,
//                  completed by commit(). Every body carries Content-MD5.
//   incomplete     a multipart upload in progress is announced by a marker
//                  object next to its key, ".<name>.cairn-upload-<h>" (h: the
//                  XXH3 of the upload id), holding the key and upload id. It
//                  is written before the first part and removed after the
//                  upload completes or is aborted, so a crash leaves the marker
//                  behind: list_incomplete() reports it (and, where the server
//                  has ListMultipartUploads, uploads that have none), and
//                  discard_incomplete() aborts the upload and removes it.
//                  list() never shows markers.
//   reads          ranged GETs of up to part_size bytes, in parallel for large
//                  reads, each pinned to the ETag seen when the reader opened.
//   locks          a lease object; see S3Lock below and docs/s3.md.
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
#include "storage/backends.h"
#include "storage/s3/client.h"
#include "storage/s3/lease.h"
#include "storage/s3/sigv4.h"
#include "storage/s3/xml.h"
#include "util/hash.h"
#include "util/json.h"
#include "util/log.h"

namespace cairn {
namespace {

using s3::HttpResponse;
using s3::S3Client;
using s3::S3Request;

constexpr std::string_view kUploadMarker = ".cairn-upload-";
// Beside a lease, on servers without conditional writes: one object per
// process taking the lease over (take_lease_by_listing).
constexpr std::string_view kTakerMarker = ".cairn-taker-";

std::span<const std::byte> bytes_of(std::string_view s) { return as_bytes(s); }

std::pair<std::string_view, std::string_view> split_dir(std::string_view key) {
  size_t slash = key.rfind('/');
  if (slash == std::string_view::npos) return {"", key};
  return {key.substr(0, slash), key.substr(slash + 1)};
}

bool is_marker_name(std::string_view name) {
  return name.size() > 1 && name.front() == '.' &&
         name.find(kUploadMarker) != std::string_view::npos;
}

bool is_marker_key(std::string_view key) { return is_marker_name(split_dir(key).second); }

bool is_taker_key(std::string_view key) {
  std::string_view name = split_dir(key).second;
  return name.size() > 1 && name.front() == '.' &&
         name.find(kTakerMarker) != std::string_view::npos;
}

// The prefix of the takers' objects of the lease at `lease_key`.
std::string taker_prefix(std::string_view lease_key) {
  auto [dir, name] = split_dir(lease_key);
  return join_key(dir, fmt::format(".{}{}", name, kTakerMarker));
}

// The marker key for an upload of `key` with `upload_id`.
std::string marker_key(std::string_view key, std::string_view upload_id) {
  auto [dir, name] = split_dir(key);
  return join_key(dir,
                  fmt::format(".{}{}{}", name, kUploadMarker, hash_to_hex(xxh3_64(upload_id))));
}

// The key a marker stands for.
std::string key_of_marker(std::string_view marker) {
  auto [dir, name] = split_dir(marker);
  std::string_view target = name.substr(1, name.find(kUploadMarker) - 1);
  return join_key(dir, target);
}

std::string etag_of(const HttpResponse& r, std::string_view what) {
  std::optional<std::string> etag = r.header("etag");
  if (!etag || etag->empty()) {
    throw Error(ErrorCode::kCorruption, fmt::format("{}: the server sent no ETag", what));
  }
  return *etag;
}

uint64_t content_length(const HttpResponse& r, std::string_view what) {
  std::optional<std::string> v = r.header("content-length");
  uint64_t n = 0;
  if (!v || std::from_chars(v->data(), v->data() + v->size(), n).ec != std::errc()) {
    throw Error(ErrorCode::kCorruption, fmt::format("{}: no valid Content-Length", what));
  }
  return n;
}

double last_modified(const HttpResponse& r) {
  std::optional<std::string> v = r.header("last-modified");
  return v ? s3::parse_http_date(*v).value_or(0.0) : 0.0;
}

// Runs tasks on up to `workers` threads; submit() blocks while `workers`
// tasks are already waiting, so memory in flight stays bounded. The first
// task failure is kept and rethrown by wait() and later submits.
class TaskPool {
 public:
  explicit TaskPool(int workers) : workers_(std::max(1, workers)) {}
  ~TaskPool() {
    {
      std::unique_lock<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  void submit(std::function<void()> task) {
    std::unique_lock<std::mutex> g(mu_);
    space_.wait(g, [&] { return queue_.size() < static_cast<size_t>(workers_) || failure_; });
    if (failure_) std::rethrow_exception(failure_);
    queue_.push_back(std::move(task));
    if (threads_.size() < static_cast<size_t>(workers_) && idle_ == 0) {
      threads_.emplace_back([this] { run(); });
    }
    cv_.notify_one();
  }

  void wait() {
    std::unique_lock<std::mutex> g(mu_);
    done_.wait(g, [&] { return (queue_.empty() && busy_ == 0) || failure_; });
    if (failure_) {
      done_.wait(g, [&] { return busy_ == 0; });
      std::rethrow_exception(failure_);
    }
  }

 private:
  void run() {
    std::unique_lock<std::mutex> g(mu_);
    for (;;) {
      ++idle_;
      cv_.wait(g, [&] { return stop_ || !queue_.empty(); });
      --idle_;
      if (queue_.empty()) return;
      auto task = std::move(queue_.front());
      queue_.pop_front();
      ++busy_;
      space_.notify_one();
      g.unlock();
      std::exception_ptr error;
      if (!failure_flag_.load()) {
        try {
          task();
        } catch (...) {
          error = std::current_exception();
        }
      }
      g.lock();
      --busy_;
      if (error && !failure_) {
        failure_ = error;
        failure_flag_ = true;
        queue_.clear();
        space_.notify_all();
      }
      done_.notify_all();
    }
  }

  const int workers_;
  std::mutex mu_;
  std::condition_variable cv_, space_, done_;
  std::deque<std::function<void()>> queue_;
  std::vector<std::thread> threads_;
  int idle_ = 0;
  int busy_ = 0;
  bool stop_ = false;
  std::exception_ptr failure_;
  std::atomic<bool> failure_flag_{false};
};

// What every S3 storage handle of one open_storage() call shares.
struct Context {
  std::shared_ptr<S3Client> client;
  std::string bucket;
  // Learned once per process: the server answers ListMultipartUploads /
  // AbortMultipartUpload with "not implemented".
  std::atomic<bool> no_list_uploads{false};
  std::atomic<bool> no_abort{false};
  // How the server takes If-Match on a PUT (lease.h), learned on first use.
  std::atomic<s3::IfMatchForm> if_match_form{s3::IfMatchForm::kUnknown};
  // Learned: the server refuses conditional writes (If-Match or
  // If-None-Match), so leases are taken by listing (take_lease_by_listing).
  std::atomic<bool> no_conditional_writes{false};
  // The leases held through this context, for fencing (fence()).
  std::mutex leases_mu;
  std::vector<std::weak_ptr<struct LeaseGuard>> leases;

  // Throws kLocked naming the lock when `key` lies in the folder of a lease
  // held through this context and that lease is lost (or cannot be confirmed
  // now): a write or delete there depends on holding it. `what` names the
  // operation for the message.
  void fence(const std::string& key, std::string_view what);

  std::string uri(std::string_view key) const { return S3Client::object_uri(bucket, key); }
  HttpResponse call(const S3Request& r) { return client->call(bucket, r); }

  // Leases are written with conditional writes (not turned off by
  // CAIRN_S3_CONDITIONAL_WRITES, not refused by the server).
  bool conditional() const {
    return client->options().conditional_writes && !no_conditional_writes;
  }

  // HEAD of `key`: its size, time and ETag, or nothing when it is missing.
  struct Head {
    ObjectInfo info;
    std::string etag;
  };
  std::optional<Head> head(const std::string& key);

  void abort_upload(const std::string& key, const std::string& upload_id) {
    if (no_abort) return;
    S3Request r;
    r.method = "DELETE";
    r.key = key;
    r.query = {{"uploadId", upload_id}};
    r.accept = {404, 405, 501};
    HttpResponse resp = call(r);
    // A server without AbortMultipartUpload keeps unfinished parts out of
    // sight; nothing more can be done about them from here.
    if (resp.status == 405 || resp.status == 501) no_abort = true;
  }
};

std::optional<Context::Head> Context::head(const std::string& key) {
  S3Request r;
  r.method = "HEAD";
  r.key = key;
  r.accept = {404};
  HttpResponse resp = call(r);
  if (resp.status == 404) return std::nullopt;
  return Head{ObjectInfo{key, content_length(resp, uri(key)), last_modified(resp)},
              etag_of(resp, uri(key))};
}

class S3Reader final : public Reader {
 public:
  S3Reader(std::shared_ptr<Context> ctx, std::string key, uint64_t size, std::string etag)
      : ctx_(std::move(ctx)), key_(std::move(key)), size_(size), etag_(std::move(etag)) {}

  uint64_t size() const override { return size_; }

  void read_at(uint64_t offset, std::span<std::byte> out) override {
    if (offset > size_ || out.size() > size_ - offset) {
      throw Error(ErrorCode::kCorruption,
                  fmt::format("{}: read of {} bytes at byte offset {} is past the end ({} bytes)",
                              ctx_->uri(key_), out.size(), offset, size_));
    }
    if (out.empty()) return;
    const uint64_t part = ctx_->client->options().part_size;
    const size_t ranges = static_cast<size_t>((out.size() + part - 1) / part);
    auto fetch = [&](size_t i) {
      uint64_t begin = i * part;
      uint64_t len = std::min<uint64_t>(part, out.size() - begin);
      get_range(offset + begin, out.subspan(begin, len));
    };
    if (ranges == 1) return fetch(0);
    std::atomic<size_t> next{0};
    std::mutex mu;
    std::exception_ptr failure;
    auto worker = [&] {
      for (size_t i; (i = next.fetch_add(1)) < ranges;) {
        try {
          fetch(i);
        } catch (...) {
          std::lock_guard<std::mutex> g(mu);
          if (!failure) failure = std::current_exception();
          next = ranges;
        }
      }
    };
    size_t n = std::min<size_t>(ranges, ctx_->client->options().concurrency);
    std::vector<std::thread> threads;
    for (size_t t = 1; t < n; ++t) threads.emplace_back(worker);
    worker();
    for (auto& t : threads) t.join();
    if (failure) std::rethrow_exception(failure);
  }

 private:
  void get_range(uint64_t offset, std::span<std::byte> out) {
    if (offset == 0 && out.size() == 1 && size_ > 1) {
      // "bytes=0-0" is read as "bytes=0-" by some servers (s3rver among
      // them), which then send the whole object: ask for two bytes instead.
      std::array<std::byte, 2> two;
      get_range(0, two);
      out[0] = two[0];
      return;
    }
    S3Request r;
    r.key = key_;
    r.headers = {{"range", fmt::format("bytes={}-{}", offset, offset + out.size() - 1)},
                 {"if-match", etag_}};
    r.response_buffer = out;
    r.accept = {412};
    HttpResponse resp = ctx_->call(r);
    if (resp.status == 412) {
      throw Error(ErrorCode::kCorruption,
                  fmt::format("{}: the object was replaced while being read (ETag {} is gone)",
                              ctx_->uri(key_), etag_));
    }
    if (resp.body_bytes != out.size()) {
      throw Error(ErrorCode::kCorruption,
                  fmt::format("{}: asked for {} bytes at byte offset {}, the server sent {}",
                              ctx_->uri(key_), out.size(), offset, resp.body_bytes));
    }
  }

  std::shared_ptr<Context> ctx_;
  std::string key_;
  uint64_t size_;
  std::string etag_;
};

class S3Writer final : public Writer {
 public:
  S3Writer(std::shared_ptr<Context> ctx, std::string key)
      : ctx_(std::move(ctx)),
        key_(std::move(key)),
        part_size_(ctx_->client->options().part_size),
        pool_(ctx_->client->options().concurrency) {}

  ~S3Writer() override {
    if (committed_) return;
    try {
      pool_.wait();
    } catch (const std::exception&) {  // ignore-error: the write is being discarded
    }
    if (!upload_id_.empty()) discard_upload();
  }

  void append(std::span<const std::byte> data) override { write_at(size_, data); }

  void write_at(uint64_t offset, std::span<const std::byte> data) override {
    if (committed_) {
      throw Error(ErrorCode::kFailedPrecondition,
                  fmt::format("{}: write after commit", ctx_->uri(key_)));
    }
    if (!data.empty()) check_plan(offset + data.size());
    std::vector<std::pair<int, std::vector<std::byte>>> full;
    {
      std::lock_guard<std::mutex> g(mu_);
      size_ = std::max<uint64_t>(size_, offset + data.size());
      uint64_t at = offset;
      while (!data.empty()) {
        uint64_t index = at / part_size_;
        uint64_t in_part = at % part_size_;
        size_t n = static_cast<size_t>(std::min<uint64_t>(data.size(), part_size_ - in_part));
        if (sent_.count(index)) {
          throw Error(ErrorCode::kInvalidArgument,
                      fmt::format("{}: write of byte offset {} overlaps a part already uploaded",
                                  ctx_->uri(key_), at));
        }
        Slot& slot = slots_[index];
        if (slot.data.empty()) slot.data.resize(static_cast<size_t>(part_size_));
        std::copy(data.begin(), data.begin() + static_cast<std::ptrdiff_t>(n),
                  slot.data.begin() + static_cast<std::ptrdiff_t>(in_part));
        slot.filled += n;
        if (slot.filled >= part_size_) {
          full.emplace_back(static_cast<int>(index) + 1, std::move(slot.data));
          slots_.erase(index);
          sent_.insert(index);
        }
        data = data.subspan(n);
        at += n;
      }
    }
    for (auto& [number, bytes] : full) send_part(number, std::move(bytes));
  }

  void commit() override {
    if (committed_) return;
    std::unique_lock<std::mutex> g(mu_);
    if (upload_id_.empty() && sent_.empty() && size_ <= part_size_) {
      // Small object: one PUT.
      std::vector<std::byte> bytes;
      if (auto it = slots_.find(0); it != slots_.end()) bytes = std::move(it->second.data);
      bytes.resize(static_cast<size_t>(size_));
      g.unlock();
      ctx_->fence(key_, "PUT");
      put_whole(bytes);
      committed_ = true;
      return;
    }
    // The rest of the parts: partly written ones, and holes (zeros).
    uint64_t last = (size_ + part_size_ - 1) / part_size_;
    std::vector<uint64_t> rest;
    for (uint64_t i = 0; i < last; ++i) {
      if (!sent_.count(i)) rest.push_back(i);
    }
    std::map<uint64_t, Slot> slots = std::move(slots_);
    slots_.clear();
    for (uint64_t i : rest) sent_.insert(i);
    g.unlock();
    for (uint64_t i : rest) {
      std::vector<std::byte> bytes;
      if (auto it = slots.find(i); it != slots.end()) bytes = std::move(it->second.data);
      bytes.resize(static_cast<size_t>(std::min(part_size_, size_ - i * part_size_)));
      send_part(static_cast<int>(i) + 1, std::move(bytes));
    }
    pool_.wait();
    ctx_->fence(key_, "completing the multipart upload");
    complete();
    committed_ = true;
  }

  uint64_t bytes_written() const override { return size_; }

  void preallocate(uint64_t size) override { check_plan(size); }

 private:
  struct Slot {
    std::vector<std::byte> data;
    uint64_t filled = 0;
  };

  // An object of `size` bytes must fit in S3's 10,000 parts: refused before
  // anything of it is sent.
  void check_plan(uint64_t size) const {
    if (size <= part_size_ || (size - 1) / part_size_ < s3::kMaxParts) return;
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: an object of {} bytes needs more than {} parts of "
                            "CAIRN_S3_PART_SIZE={} bytes, S3's limit; raise CAIRN_S3_PART_SIZE to "
                            "at least {}",
                            ctx_->uri(key_), size, s3::kMaxParts, part_size_,
                            (size + s3::kMaxParts - 1) / s3::kMaxParts));
  }

  void put_whole(std::span<const std::byte> bytes) {
    S3Request r;
    r.method = "PUT";
    r.key = key_;
    r.body = bytes;
    r.headers = {{"content-md5", s3::md5_base64(bytes)}};
    ctx_->call(r);
  }

  void start_upload() {
    std::lock_guard<std::mutex> g(start_mu_);
    if (!upload_id_.empty()) return;
    S3Request r;
    r.method = "POST";
    r.key = key_;
    r.query = {{"uploads", ""}};
    HttpResponse created = ctx_->call(r);
    std::string id = s3::parse_initiate_multipart(created.body);
    started_at_ = s3::parse_http_date(created.header("date").value_or("")).value_or(0.0);
    // The marker goes first, so a crash after any part leaves a trace.
    nlohmann::json marker = {{"key", key_}, {"upload_id", id}};
    std::string text = marker.dump();
    S3Request m;
    m.method = "PUT";
    m.key = marker_key(key_, id);
    m.body = bytes_of(text);
    m.headers = {{"content-md5", s3::md5_base64(m.body)}};
    try {
      ctx_->call(m);
    } catch (...) {
      upload_id_ = id;
      throw;
    }
    upload_id_ = id;
  }

  void send_part(int number, std::vector<std::byte> bytes) {
    start_upload();
    pool_.submit([this, number, bytes = std::move(bytes)] {
      S3Request r;
      r.method = "PUT";
      r.key = key_;
      r.query = {{"partNumber", std::to_string(number)}, {"uploadId", upload_id_}};
      r.body = bytes;
      r.headers = {{"content-md5", s3::md5_base64(bytes)}};
      std::string etag = etag_of(ctx_->call(r), ctx_->uri(key_));
      std::lock_guard<std::mutex> g(mu_);
      parts_.push_back({number, etag});
    });
  }

  // Completes the upload. A Complete whose answer was lost has already
  // happened: its retry finds the upload gone (404 NoSuchUpload on S3; some
  // servers answer 500). So each failed try first checks whether the object
  // has landed (the size written, modified since the upload started) before
  // it tries again.
  void complete() {
    std::sort(parts_.begin(), parts_.end(),
              [](const auto& a, const auto& b) { return a.number < b.number; });
    std::string body = s3::complete_multipart_body(parts_);
    S3Request r;
    r.method = "POST";
    r.key = key_;
    r.query = {{"uploadId", upload_id_}};
    r.body = bytes_of(body);
    r.sign_body = true;
    r.headers = {{"content-type", "application/xml"}};
    r.accept = {404};
    r.max_attempts = 1;
    const s3::RetryPolicy& policy = ctx_->client->options().retry;
    for (int attempt = 1;; ++attempt) {
      std::optional<Error> failure;
      try {
        HttpResponse resp = ctx_->call(r);
        if (resp.status == 404) {
          failure = ctx_->client->error_for(ctx_->bucket, r, resp, attempt);
        } else if (auto error = s3::parse_complete_multipart(resp.body)) {
          const bool retryable = s3::is_retryable_status(500, error->code);
          failure =
              Error(retryable ? ErrorCode::kUnavailable : ErrorCode::kIO,
                    fmt::format("{}: completing the multipart upload failed: {}: {} "
                                "(request id {})",
                                ctx_->uri(key_), error->code, error->message, error->request_id),
                    retryable);
        } else {
          break;
        }
      } catch (const Error& e) {
        if (!e.retryable()) throw;
        failure = e;
      }
      if (attempt > 1 || failure->code() == ErrorCode::kNotFound) {
        std::optional<ObjectInfo> info = stat_object();
        if (info && info->size == size_ && info->modified + 1.0 >= started_at_) break;
      }
      if (failure->code() == ErrorCode::kNotFound || !failure->retryable() ||
          attempt >= policy.max_attempts) {
        throw *failure;
      }
      std::this_thread::sleep_for(s3::backoff_delay(policy, attempt, 0.5));
    }
    remove_marker();
  }

  std::optional<ObjectInfo> stat_object() {
    auto h = ctx_->head(key_);
    if (!h) return std::nullopt;
    return h->info;
  }

  void remove_marker() {
    S3Request r;
    r.method = "DELETE";
    r.key = marker_key(key_, upload_id_);
    r.accept = {404};
    try {
      ctx_->call(r);
    } catch (const Error& e) {  // ignore-error: a stale marker is cleaned up by gc
      log::warn(
          fmt::format("{}: could not remove the upload marker: {}", ctx_->uri(key_), e.what()));
    }
  }

  void discard_upload() {
    try {
      ctx_->abort_upload(key_, upload_id_);
    } catch (const Error& e) {  // ignore-error: the marker still names the upload for gc
      log::warn(
          fmt::format("{}: could not abort the multipart upload: {}", ctx_->uri(key_), e.what()));
      return;
    }
    remove_marker();
  }

  std::shared_ptr<Context> ctx_;
  std::string key_;
  const uint64_t part_size_;
  std::mutex mu_;
  std::mutex start_mu_;
  uint64_t size_ = 0;
  std::map<uint64_t, Slot> slots_;  // parts being filled, by index
  std::set<uint64_t> sent_;         // parts handed to the uploader
  std::string upload_id_;
  double started_at_ = 0.0;  // the server's time when the upload was created
  std::vector<s3::CompletedPart> parts_;
  bool committed_ = false;
  TaskPool pool_;  // last: its workers use the members above until joined
};

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
  static std::mutex mu;
  static Holder self;
  std::lock_guard<std::mutex> g(mu);
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
LeaseWrite put_lease(Context& ctx, const std::string& key, const std::string& body,
                     const std::string& expected_etag) {
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
  if (expected_etag.empty()) {
    HttpResponse resp = put({"if-none-match", "*"});
    if (resp.status == 409 || resp.status == 412) return {Outcome::kPreconditionFailed, ""};
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
  // Every form refused: a real change by another writer, or a server that
  // cannot compare (then the lease still has the ETag just read).
  std::optional<Context::Head> now = ctx.head(key);
  if (!now || !s3::same_etag(now->etag, expected_etag)) return {Outcome::kPreconditionFailed, ""};
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
// taker that has not written the lease within half a lifetime of starting
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
      S3Request r;
      r.method = "DELETE";
      r.key = k;
      r.accept = {404};
      ctx.call(r);
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
      std::string continuation;
      do {
        S3Request r;
        r.query = {{"list-type", "2"}, {"prefix", prefix}, {"encoding-type", "url"}};
        if (!continuation.empty()) r.query.emplace_back("continuation-token", continuation);
        s3::ListPage page = s3::parse_list_objects_v2(ctx.call(r).body);
        for (const auto& o : page.objects) {
          if (o.key == mine) continue;
          // Last-Modified has whole seconds: one more for the rounding.
          if (own->info.modified - o.modified >= static_cast<double>(ttl.count() + 1)) {
            stale.push_back(o.key);
          } else {
            ++rivals;
          }
        }
        continuation = page.truncated ? page.next_token : "";
      } while (!continuation.empty());
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
    LeaseWrite w = ctx.conditional() ? put_lease(ctx, key, body, s.etag)
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
      if (s.exists && s.token == guard_->token) {
        S3Request r;
        r.method = "DELETE";
        r.key = guard_->key;
        r.accept = {404};
        ctx_->call(r);
      }
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
    auto period = [&] { return ctx_->client->options().lock_ttl / (ctx_->conditional() ? 3 : 4); };
    while (!cv_.wait_for(g, period(), [&] { return stop_; })) {
      g.unlock();
      try {
        std::lock_guard<std::mutex> lease(guard_->mu);
        if (!guard_->renew(*ctx_)) {
          log::error(fmt::format("{}: the lock was taken over by another process ({})",
                                 ctx_->uri(guard_->key), guard_->lost_to));
          g.lock();
          return;
        }
      } catch (const Error& e) {  // ignore-error: the next beat tries again
        log::warn(
            fmt::format("{}: renewing the lock failed: {}", ctx_->uri(guard_->key), e.what()));
      }
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

class S3Storage final : public Storage {
 public:
  S3Storage(std::shared_ptr<Context> ctx, std::string prefix)
      : ctx_(std::move(ctx)), prefix_(std::move(prefix)) {}

  std::string uri() const override { return ctx_->uri(prefix_); }

  std::shared_ptr<Storage> child(std::string_view prefix) const override {
    if (!prefix.empty()) validate_key(prefix);
    return std::make_shared<S3Storage>(ctx_, join_key(prefix_, prefix));
  }

  // An upload is durable when it completes, and S3 has no file to size:
  // WriteOptions change nothing here.
  std::unique_ptr<Writer> open_writer(std::string_view key, const WriteOptions&) override {
    return std::make_unique<S3Writer>(ctx_, full(key));
  }

  std::unique_ptr<Reader> open_reader(std::string_view key) override {
    std::string k = full(key);
    auto h = ctx_->head(k);
    if (!h) throw Error(ErrorCode::kNotFound, fmt::format("{}: no such object", ctx_->uri(k)));
    return std::make_unique<S3Reader>(ctx_, k, h->info.size, h->etag);
  }

  std::optional<ObjectInfo> stat(std::string_view key) override {
    auto h = ctx_->head(full(key));
    if (!h) return std::nullopt;
    h->info.key = std::string(key);
    return h->info;
  }

  std::vector<ObjectInfo> list(std::string_view prefix) override {
    std::vector<ObjectInfo> out;
    for (ObjectInfo& o : list_raw(prefix)) {
      if (!is_marker_key(o.key) && !is_taker_key(o.key)) out.push_back(std::move(o));
    }
    return out;
  }

  void remove(std::string_view key) override {
    S3Request r;
    r.method = "DELETE";
    r.key = full(key);
    ctx_->fence(r.key, "DELETE");
    r.accept = {404};
    ctx_->call(r);
  }

  void remove_many(const std::vector<std::string>& keys) override {
    constexpr size_t kBatch = 1000;  // S3's limit per DeleteObjects
    for (size_t at = 0; at < keys.size(); at += kBatch) {
      std::vector<std::string> batch;
      for (size_t i = at; i < std::min(keys.size(), at + kBatch); ++i)
        batch.push_back(full(keys[i]));
      for (const std::string& k : batch) ctx_->fence(k, "DeleteObjects");
      std::string body = s3::delete_objects_body(batch);
      S3Request r;
      r.method = "POST";
      r.query = {{"delete", ""}};
      r.body = bytes_of(body);
      r.sign_body = true;
      r.headers = {{"content-md5", s3::md5_base64(r.body)}, {"content-type", "application/xml"}};
      auto failures = s3::parse_delete_result(ctx_->call(r).body);
      if (!failures.empty()) {
        const auto& f = failures.front();
        throw Error(
            ErrorCode::kIO,
            fmt::format("{}: delete failed: {}: {} ({} of {} keys not deleted)", ctx_->uri(f.key),
                        f.code, f.message, failures.size(), batch.size()));
      }
    }
  }

  std::unique_ptr<Lock> try_lock(std::string_view key) override {
    std::string k = full(key);
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
      LeaseWrite w = put_lease(*ctx_, k, guard->body, s.exists ? s.etag : "");
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

  bool is_locked(std::string_view key) override {
    LeaseState s = read_lease(*ctx_, full(key));
    return s.exists && s.live;
  }

  std::vector<std::string> list_incomplete(std::string_view prefix) override {
    std::set<std::string> ids;
    for (const ObjectInfo& o : list_raw(prefix)) {
      if (is_marker_key(o.key)) ids.insert(o.key);
    }
    if (!ctx_->no_list_uploads) {
      std::string p = prefix.empty() ? prefix_ : full(prefix);
      for (const auto& [key, upload_id] : list_uploads(p.empty() ? "" : p + "/")) {
        if (!prefix_.empty() && !key.starts_with(prefix_ + "/")) continue;
        ids.insert(marker_key(relative(key), upload_id));
      }
    }
    return {ids.begin(), ids.end()};
  }

  void discard_incomplete(std::string_view id) override {
    validate_key(id);
    if (!is_marker_key(id)) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}: not an incomplete write", uri_of(id)));
    }
    std::string marker = full(id);
    std::string key = key_of_marker(marker);
    std::string hash = std::string(split_dir(marker).second.substr(
        split_dir(marker).second.find(kUploadMarker) + kUploadMarker.size()));
    std::vector<std::string> uploads;
    S3Request get;
    get.key = marker;
    get.accept = {404};
    HttpResponse resp = ctx_->call(get);
    if (resp.status != 404) {
      try {
        nlohmann::json m = parse_json(resp.body, ctx_->uri(marker));
        if (m.is_object() && m.contains("upload_id") && m["upload_id"].is_string()) {
          uploads.push_back(m["upload_id"].get<std::string>());
        }
      } catch (const Error& e) {  // ignore-error: the listing below finds the upload
        log::warn(e.what());
      }
    }
    if (uploads.empty() && !ctx_->no_list_uploads) {
      for (const auto& [k, upload_id] : list_uploads(key)) {
        if (k == key && hash_to_hex(xxh3_64(upload_id)) == hash) uploads.push_back(upload_id);
      }
    }
    for (const std::string& upload_id : uploads) ctx_->abort_upload(key, upload_id);
    S3Request del;
    del.method = "DELETE";
    del.key = marker;
    del.accept = {404};
    ctx_->call(del);
  }

  // Content-MD5 on every upload; reads sized to keep every parallel ranged
  // request busy.
  StorageCapabilities capabilities() const override {
    const auto& o = ctx_->client->options();
    StorageCapabilities caps;
    caps.verifies_uploads = true;
    caps.preferred_read_size =
        std::min<uint64_t>(o.part_size * static_cast<uint64_t>(o.concurrency), 256ull << 20);
    return caps;
  }

 private:
  std::string full(std::string_view key) const {
    validate_key(key);
    return join_key(prefix_, key);
  }

  std::string relative(std::string_view key) const {
    return prefix_.empty() ? std::string(key) : std::string(key.substr(prefix_.size() + 1));
  }

  // Every object under `prefix` (markers included), keys relative to the root.
  std::vector<ObjectInfo> list_raw(std::string_view prefix) {
    std::string p = prefix.empty() ? prefix_ : full(prefix);
    std::string dir = p.empty() ? "" : p + "/";
    std::vector<ObjectInfo> out;
    std::string token;
    do {
      S3Request r;
      r.query = {{"list-type", "2"}, {"prefix", dir}, {"encoding-type", "url"}};
      if (!token.empty()) r.query.emplace_back("continuation-token", token);
      s3::ListPage page = s3::parse_list_objects_v2(ctx_->call(r).body);
      for (auto& o : page.objects) {
        if (!o.key.starts_with(dir)) {
          throw Error(ErrorCode::kCorruption,
                      fmt::format("{}: the listing returned key \"{}\" outside the prefix",
                                  ctx_->uri(p), o.key));
        }
        std::string rel = relative(o.key);
        try {
          validate_key(rel, /*is_stored=*/true);
        } catch (const Error&) {  // ignore-error: not a key Cairn wrote; never reachable
          continue;
        }
        out.push_back({std::move(rel), o.size, o.modified});
      }
      token = page.truncated ? page.next_token : "";
    } while (!token.empty());
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.key < b.key; });
    return out;
  }

  std::vector<std::pair<std::string, std::string>> list_uploads(const std::string& prefix) {
    std::vector<std::pair<std::string, std::string>> out;
    std::string key_marker, id_marker;
    for (;;) {
      S3Request r;
      r.query = {{"uploads", ""}, {"prefix", prefix}, {"encoding-type", "url"}};
      if (!key_marker.empty()) r.query.emplace_back("key-marker", key_marker);
      if (!id_marker.empty()) r.query.emplace_back("upload-id-marker", id_marker);
      r.accept = {405, 501};
      HttpResponse resp = ctx_->call(r);
      if (resp.status == 405 || resp.status == 501) {
        ctx_->no_list_uploads = true;
        return out;
      }
      s3::UploadsPage page = s3::parse_list_multipart_uploads(resp.body);
      for (auto& u : page.uploads) out.emplace_back(std::move(u.key), std::move(u.upload_id));
      if (!page.truncated) return out;
      key_marker = page.next_key_marker;
      id_marker = page.next_upload_id_marker;
    }
  }

  std::shared_ptr<Context> ctx_;
  std::string prefix_;
};

bool valid_bucket_name(std::string_view b) {
  if (b.size() < 3 || b.size() > 63) return false;
  for (char c : b) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_')) {
      return false;
    }
  }
  return true;
}

}  // namespace

namespace s3 {
namespace {
std::mutex lease_clock_mu;
LeaseClock lease_clock;
}  // namespace

void set_lease_clock_for_testing(LeaseClock clock) {
  std::lock_guard<std::mutex> g(lease_clock_mu);
  lease_clock = std::move(clock);
}

std::chrono::steady_clock::time_point lease_now() {
  std::lock_guard<std::mutex> g(lease_clock_mu);
  return lease_clock ? lease_clock() : std::chrono::steady_clock::now();
}
}  // namespace s3

std::shared_ptr<Storage> open_s3_storage(std::string_view bucket, std::string_view prefix) {
  if (!valid_bucket_name(bucket)) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("s3://{}: not a valid bucket name (3 to 63 characters: lowercase "
                            "letters, digits, '.', '-')",
                            bucket));
  }
  if (!prefix.empty()) validate_key(prefix);
  s3::AwsEnvironment env = s3::AwsEnvironment::process();
  auto ctx = std::make_shared<Context>();
  ctx->bucket = std::string(bucket);
  s3::S3Options options = s3::S3Options::from_environment(env);
  static std::shared_ptr<s3::HttpClient> http = s3::make_http_client();
  ctx->client = std::make_shared<S3Client>(s3::resolve_s3_settings(env),
                                           s3::default_credentials(env), http, options);
  return std::make_shared<S3Storage>(ctx, std::string(prefix));
}

}  // namespace cairn
