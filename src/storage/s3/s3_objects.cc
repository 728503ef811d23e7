// The S3 backend's objects: ranged parallel reads pinned to an ETag, and
// writes as one PUT or a parallel multipart upload announced by a marker
// object (the protocol is the comment at the top of s3_storage.cc).
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
#include "util/hash.h"
#include "util/json.h"
#include "util/log.h"

namespace cairn::s3_impl {
namespace {

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

// The block the first pass of put_s3_stream() reads at a time.
constexpr uint64_t kDigestBlock = 4ull << 20;

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
        // The part's buffer grows with what is written into it (doubling,
        // up to the part size): a small object does not cost a whole part
        // of zeroed memory (16 MiB by default; a thousand ranks uploading
        // at once held 16 GiB so). Bytes not written yet read as zeros.
        const size_t need = static_cast<size_t>(in_part) + n;
        if (slot.data.size() < need) {
          if (slot.data.capacity() < need) {
            slot.data.reserve(std::min<size_t>(static_cast<size_t>(part_size_),
                                               std::max(need, 2 * slot.data.capacity())));
          }
          slot.data.resize(need);
        }
        std::copy(data.begin(), data.begin() + static_cast<std::ptrdiff_t>(n),
                  slot.data.begin() + static_cast<std::ptrdiff_t>(in_part));
        slot.filled += n;
        if (slot.filled >= part_size_) {
          slot.data.resize(static_cast<size_t>(part_size_));  // a whole part, as counted
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
    try {
      ctx_->remove(marker_key(key_, upload_id_));
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

}  // namespace

std::unique_ptr<Reader> open_s3_reader(std::shared_ptr<Context> ctx, std::string key, uint64_t size,
                                       std::string etag) {
  return std::make_unique<S3Reader>(std::move(ctx), std::move(key), size, std::move(etag));
}

void put_s3_stream(Context& ctx, const std::string& key, uint64_t size, const ObjectSource& source,
                   const std::function<void()>& read_through) {
  // S3 checks the body against Content-MD5, which a header sent before the
  // body must carry: a first pass computes it (and lets the caller check the
  // bytes) before the PUT reads them again as it sends them.
  s3::Md5 md5;
  Hasher first;
  std::vector<std::byte> block(static_cast<size_t>(std::min<uint64_t>(size, kDigestBlock)));
  for (uint64_t at = 0; at < size;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(block.size(), size - at));
    std::span<std::byte> piece(block.data(), n);
    source(at, piece);
    md5.update(piece);
    first.update(piece);
    at += n;
  }
  if (read_through) read_through();
  // The bytes each try sends, hashed as they leave: servers that do not check
  // Content-MD5 (s3rver) store a changed body, which the check after the PUT
  // then finds.
  Hasher sent;
  uint64_t hashed = 0;
  S3Request r;
  r.method = "PUT";
  r.key = key;
  r.body_source = [&](uint64_t offset, std::span<std::byte> out) {
    source(offset, out);
    if (offset == 0) {
      sent = Hasher();
      hashed = 0;
    }
    if (offset == hashed) {
      sent.update(out);
      hashed += out.size();
    }
  };
  r.body_source_size = size;
  r.headers = {{"content-md5", md5.base64()}};
  ctx.fence(key, "PUT");
  ctx.call(r);
  if (hashed != size || sent.digest() != first.digest()) {
    try {
      ctx.remove(key);
    } catch (const Error& e) {  // ignore-error: the error below says what happened
      log::warn(fmt::format("{}: could not remove an object sent with changed bytes: {}",
                            ctx.uri(key), e.what()));
    }
    throw Error(ErrorCode::kCorruption,
                fmt::format("{}: the bytes changed between the checksum pass and the upload; "
                            "the object was removed",
                            ctx.uri(key)));
  }
}

std::unique_ptr<Writer> open_s3_writer(std::shared_ptr<Context> ctx, std::string key) {
  return std::make_unique<S3Writer>(std::move(ctx), std::move(key));
}

}  // namespace cairn::s3_impl
