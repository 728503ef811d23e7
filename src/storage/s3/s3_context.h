// The S3 backend's shared internals: what its storage handles, readers,
// writers and leases share (one Context per open_storage() call), the
// naming of its marker objects, and the small helpers they all use. Internal
// to src/storage/s3/; nothing outside the backend includes it.
//
// Thread-safety: a Context is shared by every handle, reader, writer and
// lock of one open_storage() call and may be used from many threads; its
// learned flags are atomics and its lease list has its own mutex. TaskPool
// is used by one owner thread (submit/wait) with workers of its own.
// Failure: every request throws cairn::Error naming the object's URI.
#pragma once

#include <algorithm>
#include <atomic>
#include <charconv>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cairn/error.h"
#include "cairn/storage.h"
#include "storage/s3/client.h"
#include "storage/s3/key_spread.h"
#include "storage/s3/lease.h"
#include "storage/s3/xml.h"
#include "util/hash.h"

namespace cairn::s3_impl {

using s3::HttpResponse;
using s3::S3Client;
using s3::S3Request;

inline constexpr std::string_view kUploadMarker = ".cairn-upload-";
// Beside a lease, on servers without conditional writes: one object per
// process taking the lease over (take_lease_by_listing).
inline constexpr std::string_view kTakerMarker = ".cairn-taker-";

inline std::span<const std::byte> bytes_of(std::string_view s) { return as_bytes(s); }

inline std::pair<std::string_view, std::string_view> split_dir(std::string_view key) {
  size_t slash = key.rfind('/');
  if (slash == std::string_view::npos) return {"", key};
  return {key.substr(0, slash), key.substr(slash + 1)};
}

inline bool is_marker_name(std::string_view name) {
  return name.size() > 1 && name.front() == '.' &&
         name.find(kUploadMarker) != std::string_view::npos;
}

inline bool is_marker_key(std::string_view key) { return is_marker_name(split_dir(key).second); }

inline bool is_taker_key(std::string_view key) {
  std::string_view name = split_dir(key).second;
  return name.size() > 1 && name.front() == '.' &&
         name.find(kTakerMarker) != std::string_view::npos;
}

// The prefix of the takers' objects of the lease at `lease_key`.
inline std::string taker_prefix(std::string_view lease_key) {
  auto [dir, name] = split_dir(lease_key);
  return join_key(dir, fmt::format(".{}{}", name, kTakerMarker));
}

// The marker key for an upload of `key` with `upload_id`.
inline std::string marker_key(std::string_view key, std::string_view upload_id) {
  auto [dir, name] = split_dir(key);
  return join_key(dir,
                  fmt::format(".{}{}{}", name, kUploadMarker, hash_to_hex(xxh3_64(upload_id))));
}

// The key a marker stands for.
inline std::string key_of_marker(std::string_view marker) {
  auto [dir, name] = split_dir(marker);
  std::string_view target = name.substr(1, name.find(kUploadMarker) - 1);
  return join_key(dir, target);
}

inline std::string etag_of(const HttpResponse& r, std::string_view what) {
  std::optional<std::string> etag = r.header("etag");
  if (!etag || etag->empty()) {
    throw Error(ErrorCode::kCorruption, fmt::format("{}: the server sent no ETag", what));
  }
  return *etag;
}

inline uint64_t content_length(const HttpResponse& r, std::string_view what) {
  std::optional<std::string> v = r.header("content-length");
  uint64_t n = 0;
  if (!v || std::from_chars(v->data(), v->data() + v->size(), n).ec != std::errc()) {
    throw Error(ErrorCode::kCorruption, fmt::format("{}: no valid Content-Length", what));
  }
  return n;
}

inline double last_modified(const HttpResponse& r) {
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
//
// Keys: every key a Context takes or returns is the key callers know; where
// objects are spread over prefixes (key_spread.h) call(), list_objects() and
// list_uploads() translate to and from the stored names, and nothing else in
// the backend sees them.
struct Context {
  std::shared_ptr<S3Client> client;
  std::string bucket;
  s3::KeySpread spread;
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
  // Sends `r`, its key translated to the stored name.
  HttpResponse call(const S3Request& r) {
    if (!spread.spread() || r.key.empty()) return client->call(bucket, r);
    S3Request stored = r;
    stored.key = spread.stored(r.key);
    stored.shown_key = r.key;
    return client->call(bucket, stored);
  }

  // Every object whose key starts with `prefix` (ListObjectsV2, one series of
  // pages per spread prefix, in parallel), sorted by key.
  std::vector<s3::ListedObject> list_objects(const std::string& prefix);
  // Every multipart upload in progress whose key starts with `prefix`, as
  // (key, upload id); empty when the server lacks ListMultipartUploads
  // (no_list_uploads is then set).
  std::vector<std::pair<std::string, std::string>> list_uploads(const std::string& prefix);

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

  // DELETE of `key` (a full key); a missing object is no error. Unfenced:
  // callers that need the fence call fence() first.
  void remove(const std::string& key) {
    S3Request r;
    r.method = "DELETE";
    r.key = key;
    r.accept = {404};
    call(r);
  }

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

inline std::optional<Context::Head> Context::head(const std::string& key) {
  S3Request r;
  r.method = "HEAD";
  r.key = key;
  r.accept = {404};
  HttpResponse resp = call(r);
  if (resp.status == 404) return std::nullopt;
  return Head{ObjectInfo{key, content_length(resp, uri(key)), last_modified(resp)},
              etag_of(resp, uri(key))};
}

// The parts in their own files: objects (s3_objects.cc) and leases
// (s3_lease.cc).
std::unique_ptr<Reader> open_s3_reader(std::shared_ptr<Context> ctx, std::string key, uint64_t size,
                                       std::string etag);
std::unique_ptr<Writer> open_s3_writer(std::shared_ptr<Context> ctx, std::string key);
// One PUT of `size` bytes read from `source` as they are sent, with the
// Content-MD5 of a first pass that ends with `read_through`
// (Storage::put_stream; `key` is a full key in the bucket).
void put_s3_stream(Context& ctx, const std::string& key, uint64_t size, const ObjectSource& source,
                   const std::function<void()>& read_through);
// Takes the lease on `key` (a full key in the bucket) or throws kLocked
// naming it (see S3Lock in s3_lease.cc and docs/s3.md).
std::unique_ptr<Lock> take_lease(const std::shared_ptr<Context>& ctx, const std::string& key);
// Whether a live holder has the lease on `key`; reads, writes nothing.
bool lease_is_live(Context& ctx, const std::string& key);

}  // namespace cairn::s3_impl
