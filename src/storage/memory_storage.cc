// The in-memory backend: a process-wide map from key to immutable bytes, with
// object-store semantics (whole-object replace, prefix listing) and injectable
// faults. Objects live until the process ends or the bucket is cleared.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>

#include <fmt/format.h>

#include "cairn/error.h"
#include "storage/backends.h"
#include "util/fork_safe.h"

namespace cairn {
namespace {

struct Object {
  std::shared_ptr<const std::string> data;
  double modified = 0.0;
};

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

struct Bucket {
  std::string name;
  std::mutex mu;
  std::map<std::string, Object> objects;
  std::set<std::string> locks;
  uint64_t used = 0;  // committed bytes plus bytes in open writers
  MemoryFaults faults;
  std::atomic<uint64_t> bytes_read{0};  // by every reader, for tests of partial reads

  void before(std::string_view op, std::string_view key) {
    std::function<void(std::string_view, std::string_view)> hook;
    {
      std::lock_guard<std::mutex> g(mu);
      hook = faults.before;
    }
    if (hook) hook(op, key);
  }

  // Reserves `n` more bytes or throws kNoSpace naming `key`.
  void reserve(uint64_t n, std::string_view key) {
    std::lock_guard<std::mutex> g(mu);
    if (faults.capacity && used + n > *faults.capacity) {
      throw Error(ErrorCode::kNoSpace,
                  fmt::format("memory://{}/{}: no space left ({} of {} bytes used)", name, key,
                              used, *faults.capacity));
    }
    used += n;
  }
  void release(uint64_t n) {
    std::lock_guard<std::mutex> g(mu);
    used -= std::min(used, n);
  }
};

ForkSafeMutex registry_mu(20);
std::unordered_map<std::string, std::shared_ptr<Bucket>>& registry() {
  static std::unordered_map<std::string, std::shared_ptr<Bucket>> r;
  return r;
}

std::shared_ptr<Bucket> bucket_named(std::string_view name) {
  std::lock_guard<ForkSafeMutex> g(registry_mu);
  auto& slot = registry()[std::string(name)];
  if (!slot) {
    slot = std::make_shared<Bucket>();
    slot->name = std::string(name);
  }
  return slot;
}

class MemoryReader final : public Reader {
 public:
  MemoryReader(std::shared_ptr<const std::string> data, std::string name,
               std::shared_ptr<Bucket> bucket)
      : data_(std::move(data)), name_(std::move(name)), bucket_(std::move(bucket)) {}
  uint64_t size() const override { return data_->size(); }
  void read_at(uint64_t offset, std::span<std::byte> out) override {
    if (offset + out.size() > data_->size()) {
      throw Error(ErrorCode::kCorruption,
                  fmt::format("{}: read of {} bytes at byte offset {} is past the end ({} bytes)",
                              name_, out.size(), offset, data_->size()));
    }
    std::copy_n(reinterpret_cast<const std::byte*>(data_->data()) + offset, out.size(), out.data());
    bucket_->bytes_read += out.size();
  }

 private:
  std::shared_ptr<const std::string> data_;
  std::string name_;
  std::shared_ptr<Bucket> bucket_;
};

class MemoryWriter final : public Writer {
 public:
  MemoryWriter(std::shared_ptr<Bucket> bucket, std::string key)
      : bucket_(std::move(bucket)), key_(std::move(key)) {}
  ~MemoryWriter() override { bucket_->release(reserved_); }

  void append(std::span<const std::byte> data) override { write_at(data_.size(), data); }

  void write_at(uint64_t offset, std::span<const std::byte> data) override {
    bucket_->before("write", key_);
    std::lock_guard<std::mutex> g(mu_);
    uint64_t end = offset + data.size();
    if (end > data_.size()) {
      bucket_->reserve(end - data_.size(), key_);
      reserved_ += end - data_.size();
      data_.resize(end);
    }
    std::copy(data.begin(), data.end(), reinterpret_cast<std::byte*>(data_.data()) + offset);
  }

  void commit() override {
    bucket_->before("commit", key_);
    auto bytes = std::make_shared<const std::string>(std::move(data_));
    std::lock_guard<std::mutex> g(bucket_->mu);
    auto it = bucket_->objects.find(key_);
    if (it != bucket_->objects.end()) bucket_->used -= it->second.data->size();
    bucket_->objects[key_] = Object{bytes, now_seconds()};
    reserved_ = 0;  // now accounted as committed
  }

  uint64_t bytes_written() const override { return data_.size(); }

 private:
  std::shared_ptr<Bucket> bucket_;
  std::string key_;
  std::mutex mu_;
  std::string data_;
  uint64_t reserved_ = 0;
};

class MemoryLock final : public Lock {
 public:
  MemoryLock(std::shared_ptr<Bucket> bucket, std::string key)
      : bucket_(std::move(bucket)), key_(std::move(key)) {}
  ~MemoryLock() override {
    std::lock_guard<std::mutex> g(bucket_->mu);
    bucket_->locks.erase(key_);
  }

 private:
  std::shared_ptr<Bucket> bucket_;
  std::string key_;
};

class MemoryStorage final : public Storage {
 public:
  MemoryStorage(std::shared_ptr<Bucket> bucket, std::string prefix)
      : bucket_(std::move(bucket)), prefix_(std::move(prefix)) {}

  // Stores `data` as `key` without copying it (atomic replace).
  void put_shared(std::string_view key, std::shared_ptr<const std::string> data) {
    const std::string k = full(key);
    bucket_->before("commit", k);
    bucket_->reserve(data->size(), k);
    std::lock_guard<std::mutex> g(bucket_->mu);
    Object& o = bucket_->objects[k];
    if (o.data) bucket_->used -= std::min<uint64_t>(bucket_->used, o.data->size());
    o.data = std::move(data);
    o.modified = now_seconds();
  }

  // A private bucket holding this storage's objects as they are now, under
  // the same keys relative to it: objects are immutable and shared, so
  // nothing is copied.
  std::shared_ptr<Storage> freeze() const {
    static std::atomic<uint64_t> next{0};
    auto frozen = std::make_shared<Bucket>();
    frozen->name = "frozen-" + std::to_string(next.fetch_add(1));
    const std::string start = prefix_.empty() ? std::string() : prefix_ + "/";
    std::lock_guard<std::mutex> g(bucket_->mu);
    for (auto it = bucket_->objects.lower_bound(start);
         it != bucket_->objects.end() && it->first.compare(0, start.size(), start) == 0; ++it) {
      frozen->objects.emplace(it->first.substr(start.size()), it->second);
      frozen->used += it->second.data->size();
    }
    return std::make_shared<MemoryStorage>(std::move(frozen), std::string());
  }

  std::string uri() const override { return join_key("memory://" + bucket_->name, prefix_); }

  std::shared_ptr<Storage> child(std::string_view prefix) const override {
    if (!prefix.empty()) validate_key(prefix);
    return std::make_shared<MemoryStorage>(bucket_, join_key(prefix_, prefix));
  }

  // WriteOptions mean nothing here: memory has no power loss and no file to size.
  std::unique_ptr<Writer> open_writer(std::string_view key, const WriteOptions&) override {
    return std::make_unique<MemoryWriter>(bucket_, full(key));
  }

  std::unique_ptr<Reader> open_reader(std::string_view key) override {
    std::string k = full(key);
    bucket_->before("read", k);
    std::lock_guard<std::mutex> g(bucket_->mu);
    auto it = bucket_->objects.find(k);
    if (it == bucket_->objects.end()) {
      throw Error(ErrorCode::kNotFound, fmt::format("{}: no such object", uri_of(key)));
    }
    return std::make_unique<MemoryReader>(it->second.data, uri_of(key), bucket_);
  }

  std::optional<ObjectInfo> stat(std::string_view key) override {
    std::string k = full(key);
    bucket_->before("read", k);
    std::lock_guard<std::mutex> g(bucket_->mu);
    auto it = bucket_->objects.find(k);
    if (it == bucket_->objects.end()) return std::nullopt;
    return ObjectInfo{std::string(key), it->second.data->size(), it->second.modified};
  }

  std::vector<ObjectInfo> list(std::string_view prefix) override {
    std::string p = prefix.empty() ? prefix_ : full(prefix);
    bucket_->before("list", p);
    std::string dir = p.empty() ? "" : p + "/";
    std::vector<ObjectInfo> out;
    std::lock_guard<std::mutex> g(bucket_->mu);
    for (auto it = bucket_->objects.lower_bound(dir);
         it != bucket_->objects.end() && it->first.compare(0, dir.size(), dir) == 0; ++it) {
      std::string rel = prefix_.empty() ? it->first : it->first.substr(prefix_.size() + 1);
      out.push_back({rel, it->second.data->size(), it->second.modified});
    }
    return out;
  }

  // One folder's names, the way an object store's delimiter listing gives
  // them; fault hooks see it as "list_names", not as a "list" of the folder
  // (so tests can tell a listing of one folder from a walk of everything
  // below it).
  std::vector<std::string> list_names(std::string_view prefix) override {
    std::string p = prefix.empty() ? prefix_ : full(prefix);
    bucket_->before("list_names", p);
    std::string dir = p.empty() ? "" : p + "/";
    std::vector<std::string> out;
    std::lock_guard<std::mutex> g(bucket_->mu);
    for (auto it = bucket_->objects.lower_bound(dir);
         it != bucket_->objects.end() && it->first.compare(0, dir.size(), dir) == 0;) {
      std::string_view rest = std::string_view(it->first).substr(dir.size());
      const size_t slash = rest.find('/');
      if (slash == std::string_view::npos) {
        out.emplace_back(rest);
        ++it;
        continue;
      }
      // A folder: its name once, then skip past everything in it.
      std::string folder = dir + std::string(rest.substr(0, slash)) + '/';
      out.push_back(std::string(rest.substr(0, slash + 1)));
      folder.back() = '/' + 1;  // the first key after the folder's contents
      it = bucket_->objects.lower_bound(folder);
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  void remove(std::string_view key) override {
    std::string k = full(key);
    bucket_->before("remove", k);
    std::lock_guard<std::mutex> g(bucket_->mu);
    auto it = bucket_->objects.find(k);
    if (it == bucket_->objects.end()) return;
    bucket_->used -= std::min<uint64_t>(bucket_->used, it->second.data->size());
    bucket_->objects.erase(it);
  }

  void rename(std::string_view from, std::string_view to) override {
    const std::string f = full(from);
    const std::string t = full(to);
    bucket_->before("rename", f);
    std::lock_guard<std::mutex> g(bucket_->mu);
    auto it = bucket_->objects.find(f);
    if (it == bucket_->objects.end()) {
      throw Error(ErrorCode::kNotFound, fmt::format("{}: no such object to rename", uri_of(from)));
    }
    if (f == t) return;
    Object moved = std::move(it->second);
    bucket_->objects.erase(it);
    auto [at, fresh] = bucket_->objects.try_emplace(t);
    if (!fresh) bucket_->used -= std::min<uint64_t>(bucket_->used, at->second.data->size());
    at->second = std::move(moved);
  }

  StorageCapabilities capabilities() const override {
    StorageCapabilities caps;
    caps.renames = true;
    return caps;
  }

  std::unique_ptr<Lock> try_lock(std::string_view key) override {
    std::string k = full(key);
    bucket_->before("lock", k);
    std::lock_guard<std::mutex> g(bucket_->mu);
    if (!bucket_->locks.insert(k).second) {
      throw Error(ErrorCode::kLocked, fmt::format("{}: locked by another writer", uri_of(key)),
                  true);
    }
    return std::make_unique<MemoryLock>(bucket_, k);
  }

  bool is_locked(std::string_view key) override {
    std::string k = full(key);
    std::lock_guard<std::mutex> g(bucket_->mu);
    return bucket_->locks.count(k) > 0;
  }

  // An in-memory write cannot outlive the process that was making it.
  std::vector<std::string> list_incomplete(std::string_view) override { return {}; }
  void discard_incomplete(std::string_view id) override {
    throw Error(ErrorCode::kNotFound, fmt::format("{}: no such incomplete write", uri_of(id)));
  }

 private:
  std::string full(std::string_view key) const {
    validate_key(key);
    return join_key(prefix_, key);
  }

  std::shared_ptr<Bucket> bucket_;
  std::string prefix_;
};

}  // namespace

void put_shared_object(Storage& storage, std::string_view key,
                       std::shared_ptr<const std::string> data) {
  auto* memory = dynamic_cast<MemoryStorage*>(&storage);
  if (memory == nullptr) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: not an in-memory storage", storage.uri()));
  }
  memory->put_shared(key, std::move(data));
}

std::shared_ptr<Storage> freeze_memory_storage(const Storage& storage) {
  const auto* memory = dynamic_cast<const MemoryStorage*>(&storage);
  return memory ? memory->freeze() : nullptr;
}

std::shared_ptr<Storage> open_memory_storage(std::string_view bucket, std::string_view prefix) {
  if (bucket.empty()) throw Error(ErrorCode::kInvalidArgument, "memory:// URI needs a bucket name");
  if (!prefix.empty()) validate_key(prefix);
  return std::make_shared<MemoryStorage>(bucket_named(bucket), std::string(prefix));
}

std::shared_ptr<Storage> open_private_memory_storage() {
  static std::atomic<uint64_t> next{0};
  auto bucket = std::make_shared<Bucket>();
  bucket->name = "private-" + std::to_string(next.fetch_add(1));
  return std::make_shared<MemoryStorage>(std::move(bucket), std::string());
}

uint64_t memory_bytes_read(std::string_view bucket) {
  return bucket_named(bucket)->bytes_read.load();
}

void set_memory_faults(std::string_view bucket, MemoryFaults faults) {
  auto b = bucket_named(bucket);
  std::lock_guard<std::mutex> g(b->mu);
  b->faults = std::move(faults);
}

void clear_memory_bucket(std::string_view bucket) {
  auto b = bucket_named(bucket);
  std::lock_guard<std::mutex> g(b->mu);
  b->objects.clear();
  b->locks.clear();
  b->used = 0;
  b->faults = {};
}

}  // namespace cairn
