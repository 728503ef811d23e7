// The S3 backend: Storage over an S3-compatible object store.
//
//   objects        one S3 object per key, under "<prefix>/" in the bucket.
//   writes         one PUT when the object fits in a part; otherwise a
//                  multipart upload with parts sent in parallel as they fill,
//                  completed by commit(). put_stream() sends an object up to
//                  CAIRN_S3_UPLOAD_CUTOFF in one PUT read from its source as
//                  it leaves. Every body carries Content-MD5.
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
//   locks          a lease object; see S3Lock in s3_lease.cc and docs/s3.md.
//
// Files: s3_context.h (what the parts share), s3_objects.cc (readers and
// writers), s3_lease.cc (locks and fencing), this file (the Storage).
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
#include "storage/s3/s3_context.h"
#include "storage/s3/sigv4.h"
#include "storage/s3/xml.h"
#include "util/hash.h"
#include "util/json.h"
#include "util/log.h"

namespace cairn {
namespace s3_impl {

std::vector<s3::ListedObject> Context::list_objects(const std::string& prefix) {
  const std::vector<std::string> stored = spread.listing_prefixes(prefix);
  std::vector<std::vector<s3::ListedObject>> found(stored.size());
  auto list_one = [&](size_t i) {
    std::string token;
    do {
      S3Request r;
      r.query = {{"list-type", "2"}, {"prefix", stored[i]}, {"encoding-type", "url"}};
      if (!token.empty()) r.query.emplace_back("continuation-token", token);
      s3::ListPage page = s3::parse_list_objects_v2(client->call(bucket, r).body);
      for (auto& o : page.objects) {
        if (!o.key.starts_with(stored[i])) {
          throw Error(ErrorCode::kCorruption,
                      fmt::format("{}: the listing returned key \"{}\" outside the prefix",
                                  uri(prefix), o.key));
        }
        // An object placed under a spread prefix its key's hash does not
        // give (by hand, or by another count) is not one of ours.
        std::optional<std::string> key = spread.key_of(o.key);
        if (!key) continue;
        o.key = std::move(*key);
        found[i].push_back(std::move(o));
      }
      token = page.truncated ? page.next_token : "";
    } while (!token.empty());
  };
  if (stored.size() == 1) {
    list_one(0);
  } else {
    TaskPool pool(std::min<int>(client->options().concurrency, static_cast<int>(stored.size())));
    for (size_t i = 0; i < stored.size(); ++i) pool.submit([&list_one, i] { list_one(i); });
    pool.wait();
  }
  std::vector<s3::ListedObject> out;
  for (auto& part : found) {
    for (auto& o : part) out.push_back(std::move(o));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.key < b.key; });
  return out;
}

std::vector<std::pair<std::string, std::string>> Context::list_uploads(const std::string& prefix) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& stored : spread.listing_prefixes(prefix)) {
    std::string key_marker, id_marker;
    for (;;) {
      S3Request r;
      r.query = {{"uploads", ""}, {"prefix", stored}, {"encoding-type", "url"}};
      if (!key_marker.empty()) r.query.emplace_back("key-marker", key_marker);
      if (!id_marker.empty()) r.query.emplace_back("upload-id-marker", id_marker);
      r.accept = {405, 501};
      HttpResponse resp = client->call(bucket, r);
      if (resp.status == 405 || resp.status == 501) {
        no_list_uploads = true;
        return {};
      }
      s3::UploadsPage page = s3::parse_list_multipart_uploads(resp.body);
      for (auto& u : page.uploads) {
        // An upload under another spread prefix (or none) is not one of ours.
        if (std::optional<std::string> key = spread.key_of(u.key)) {
          out.emplace_back(std::move(*key), std::move(u.upload_id));
        }
      }
      if (!page.truncated) break;
      key_marker = page.next_key_marker;
      id_marker = page.next_upload_id_marker;
    }
  }
  return out;
}

namespace {

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
    return open_s3_writer(ctx_, full(key));
  }

  // Objects above a part and up to the upload cutoff go in one streamed PUT
  // (fewer requests than a multipart upload, and no server-side assembly of
  // parts); the rest as open_writer() sends them.
  void put_stream(std::string_view key, uint64_t size, const ObjectSource& source,
                  const std::function<void()>& read_through) override {
    const auto& o = ctx_->client->options();
    if (size <= o.part_size || size > o.upload_cutoff) {
      Storage::put_stream(key, size, source, read_through);
      return;
    }
    put_s3_stream(*ctx_, full(key), size, source, read_through);
  }

  std::unique_ptr<Reader> open_reader(std::string_view key) override {
    std::string k = full(key);
    auto h = ctx_->head(k);
    if (!h) throw Error(ErrorCode::kNotFound, fmt::format("{}: no such object", ctx_->uri(k)));
    return open_s3_reader(ctx_, k, h->info.size, h->etag);
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
    const std::string k = full(key);
    ctx_->fence(k, "DELETE");
    ctx_->remove(k);
  }

  void remove_many(const std::vector<std::string>& keys) override {
    constexpr size_t kBatch = 1000;  // S3's limit per DeleteObjects
    for (size_t at = 0; at < keys.size(); at += kBatch) {
      std::vector<std::string> batch;
      for (size_t i = at; i < std::min(keys.size(), at + kBatch); ++i)
        batch.push_back(full(keys[i]));
      for (const std::string& k : batch) ctx_->fence(k, "DeleteObjects");
      std::vector<std::string> stored;
      for (const std::string& k : batch) stored.push_back(ctx_->spread.stored(k));
      std::string body = s3::delete_objects_body(stored);
      S3Request r;
      r.method = "POST";
      r.query = {{"delete", ""}};
      r.body = bytes_of(body);
      r.sign_body = true;
      r.headers = {{"content-md5", s3::md5_base64(r.body)}, {"content-type", "application/xml"}};
      auto failures = s3::parse_delete_result(ctx_->call(r).body);
      if (!failures.empty()) {
        const auto& f = failures.front();
        const std::string key = ctx_->spread.key_of(f.key).value_or(f.key);
        throw Error(ErrorCode::kIO,
                    fmt::format("{}: delete failed: {}: {} ({} of {} keys not deleted)",
                                ctx_->uri(key), f.code, f.message, failures.size(), batch.size()));
      }
    }
  }

  std::unique_ptr<Lock> try_lock(std::string_view key) override {
    return take_lease(ctx_, full(key));
  }

  bool is_locked(std::string_view key) override { return lease_is_live(*ctx_, full(key)); }

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
    // A marker cut short by a kill during its own PUT (empty, or not JSON)
    // names no upload: an expected remains of a killed upload, not an error.
    // The listing below finds its upload, if it was ever started.
    if (resp.status != 404) {
      const auto m = nlohmann::json::parse(resp.body, nullptr, /*allow_exceptions=*/false);
      if (m.is_object() && m.contains("upload_id") && m["upload_id"].is_string()) {
        uploads.push_back(m["upload_id"].get<std::string>());
      } else {
        log::debug(
            fmt::format("{}: upload marker names no upload ({} bytes); finding it by "
                        "listing",
                        ctx_->uri(marker), resp.body.size()));
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
    caps.torn_writes = o.torn_writes;
    caps.streamed_put_limit = std::max(o.upload_cutoff, o.part_size);
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
    std::vector<ObjectInfo> out;
    for (s3::ListedObject& o : ctx_->list_objects(p.empty() ? "" : p + "/")) {
      std::string rel = relative(o.key);
      try {
        validate_key(rel, /*is_stored=*/true);
      } catch (const Error&) {  // ignore-error: not a key Cairn wrote; never reachable
        continue;
      }
      out.push_back({std::move(rel), o.size, o.modified});
    }
    return out;
  }

  std::vector<std::pair<std::string, std::string>> list_uploads(const std::string& prefix) {
    return ctx_->list_uploads(prefix);
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
}  // namespace s3_impl

S3Endpoint s3_endpoint() {
  const s3::S3Settings settings = s3::resolve_s3_settings(s3::AwsEnvironment::process());
  return {settings.endpoint, settings.region, settings.custom_endpoint};
}

std::shared_ptr<Storage> open_s3_storage(std::string_view bucket, std::string_view prefix) {
  if (!s3_impl::valid_bucket_name(bucket)) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("s3://{}: not a valid bucket name (3 to 63 characters: lowercase "
                            "letters, digits, '.', '-')",
                            bucket));
  }
  if (!prefix.empty()) validate_key(prefix);
  s3::AwsEnvironment env = s3::AwsEnvironment::process();
  auto ctx = std::make_shared<s3_impl::Context>();
  ctx->bucket = std::string(bucket);
  s3::S3Options options = s3::S3Options::from_environment(env);
  static std::shared_ptr<s3::HttpClient> http = s3::make_http_client();
  ctx->spread = s3::KeySpread(options.prefixes);
  ctx->client = std::make_shared<s3::S3Client>(s3::resolve_s3_settings(env),
                                               s3::default_credentials(env), http, options);
  return std::make_shared<s3_impl::S3Storage>(ctx, std::string(prefix));
}

}  // namespace cairn
