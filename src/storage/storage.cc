#include <fmt/format.h>

#include "cairn/error.h"
#include "cairn/storage.h"

#include <algorithm>
#include <set>
#include <vector>
#include "storage/backends.h"
#include "util/fs.h"

namespace cairn {

namespace {

// The block put_stream() moves at a time when the backend does not stream.
constexpr uint64_t kStreamBlock = 8ull << 20;

}  // namespace

void validate_key(std::string_view key, bool is_stored) {
  const ErrorCode code = is_stored ? ErrorCode::kCorruption : ErrorCode::kInvalidArgument;
  auto fail = [&](std::string_view why) {
    throw Error(code, fmt::format("unsafe key \"{}\": {}", key, why));
  };
  if (key.empty()) fail("empty");
  if (key.front() == '/') fail("absolute path");
  if (key.find('\\') != std::string_view::npos) fail("contains a backslash");
  if (key.find('\0') != std::string_view::npos) fail("contains a NUL byte");
  size_t start = 0;
  while (start <= key.size()) {
    size_t end = key.find('/', start);
    if (end == std::string_view::npos) end = key.size();
    std::string_view part = key.substr(start, end - start);
    if (part.empty()) fail("empty path component");
    if (part == ".") fail("\".\" component");
    if (part == "..") fail("\"..\" component leaves the root");
    start = end + 1;
  }
}

std::string join_key(std::string_view a, std::string_view b) {
  while (!a.empty() && a.back() == '/') a.remove_suffix(1);
  while (!b.empty() && b.front() == '/') b.remove_prefix(1);
  if (a.empty()) return std::string(b);
  if (b.empty()) return std::string(a);
  return fmt::format("{}/{}", a, b);
}

std::string Storage::uri_of(std::string_view key) const { return join_key(uri(), key); }

std::optional<std::filesystem::path> Storage::local_path(std::string_view key) const {
  std::optional<std::filesystem::path> root = capabilities().local_root;
  if (!root || key.empty()) return root;
  validate_key(key);
  return *root / std::string(key);
}

void Storage::put(std::string_view key, std::string_view bytes) {
  auto w = open_writer(key);
  w->append(as_bytes(bytes));
  w->commit();
}

void Storage::put_stream(std::string_view key, uint64_t size, const ObjectSource& source,
                         const std::function<void()>& read_through) {
  WriteOptions options;
  options.size = size;
  auto w = open_writer(key, options);
  std::vector<std::byte> block(static_cast<size_t>(std::min<uint64_t>(size, kStreamBlock)));
  for (uint64_t at = 0; at < size;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(block.size(), size - at));
    std::span<std::byte> piece(block.data(), n);
    source(at, piece);
    w->append(piece);
    at += n;
  }
  if (read_through) read_through();
  w->commit();
}

std::string Storage::get(std::string_view key) {
  auto r = open_reader(key);
  std::string out(r->size(), '\0');
  r->read_at(0, std::as_writable_bytes(std::span(out.data(), out.size())));
  return out;
}

void check_root_exists(Storage& storage) {
  if (auto dir = storage.local_path("")) {
    std::error_code ec;
    auto status = std::filesystem::status(*dir, ec);
    if (status.type() == std::filesystem::file_type::not_found) {
      throw Error(ErrorCode::kNotFound, fmt::format("{}: no such directory", storage.uri()));
    }
    if (ec) throw Error(ErrorCode::kIO, fmt::format("{}: {}", storage.uri(), ec.message()));
    if (!std::filesystem::is_directory(status)) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}: is a file, not a directory", storage.uri()));
    }
    return;
  }
  // One folder's names, not a listing of everything below it.
  if (storage.list_names("").empty()) {
    throw Error(ErrorCode::kNotFound, fmt::format("{}: nothing is stored there", storage.uri()));
  }
}

void Writer::write_direct(uint64_t, std::span<const std::byte>, size_t) {
  throw Error(ErrorCode::kFailedPrecondition, "this storage has no direct I/O path");
}

void Storage::rename(std::string_view from, std::string_view) {
  throw Error(ErrorCode::kFailedPrecondition,
              fmt::format("{}: this storage cannot rename objects", uri_of(from)));
}

void Storage::remove_many(const std::vector<std::string>& keys) {
  for (const std::string& k : keys) remove(k);
}

std::vector<ObjectInfo> Storage::list_with_incomplete(std::string_view prefix,
                                                      std::vector<std::string>& incomplete) {
  std::vector<ObjectInfo> out = list(prefix);
  incomplete = list_incomplete(prefix);
  return out;
}

std::vector<std::string> Storage::list_names(std::string_view prefix) {
  std::vector<std::string> incomplete;
  const std::vector<ObjectInfo> objects = list_with_incomplete(prefix, incomplete);
  const size_t cut = prefix.empty() ? 0 : prefix.size() + 1;  // "prefix/"
  std::set<std::string> names;
  auto add = [&](std::string_view key, bool is_object) {
    if (key.size() <= cut) return;
    const std::string_view rest = key.substr(cut);
    const size_t slash = rest.find('/');
    if (slash != std::string_view::npos) {
      names.emplace(rest.substr(0, slash + 1));
    } else if (is_object) {
      names.emplace(rest);
    }
  };
  for (const auto& o : objects) add(o.key, true);
  for (const auto& id : incomplete) add(id, false);
  return {names.begin(), names.end()};
}

std::vector<std::string> Storage::list_incomplete_at(std::string_view prefix) {
  const size_t cut = prefix.empty() ? 0 : prefix.size() + 1;  // "prefix/"
  std::vector<std::string> out;
  for (auto& id : list_incomplete(prefix)) {
    if (id.size() > cut && id.find('/', cut) == std::string::npos) out.push_back(std::move(id));
  }
  return out;
}

void Storage::remove_prefix(std::string_view prefix) {
  std::vector<std::string> keys;
  for (ObjectInfo& o : list(prefix)) keys.push_back(std::move(o.key));
  remove_many(keys);
}

}  // namespace cairn

namespace cairn {

std::shared_ptr<Storage> open_storage(std::string_view uri) {
  if (uri.empty()) throw Error(ErrorCode::kInvalidArgument, "empty storage URI");
  size_t scheme_end = uri.find("://");
  if (scheme_end == std::string_view::npos) {
    std::filesystem::path p = std::filesystem::absolute(expand_home(uri)).lexically_normal();
    std::string s = p.string();
    while (s.size() > 1 && s.back() == '/') s.pop_back();
    return open_file_storage(s);
  }
  std::string_view scheme = uri.substr(0, scheme_end);
  std::string_view rest = uri.substr(scheme_end + 3);
  if (scheme == "file") {
    if (rest.empty() || rest.front() != '/') {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}: a file:// URI needs an absolute path (file:///dir)", uri));
    }
    return open_storage(rest);
  }
  if (scheme == "memory") {
    while (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
    size_t slash = rest.find('/');
    std::string_view bucket = rest.substr(0, slash);
    std::string_view prefix = slash == std::string_view::npos ? "" : rest.substr(slash + 1);
    return open_memory_storage(bucket, prefix);
  }
  if (scheme == "s3") {
    while (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
    size_t slash = rest.find('/');
    std::string_view bucket = rest.substr(0, slash);
    std::string_view prefix = slash == std::string_view::npos ? "" : rest.substr(slash + 1);
    if (bucket.empty()) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}: an s3:// URI needs a bucket (s3://bucket/prefix)", uri));
    }
#ifdef CAIRN_HAVE_S3
    return open_s3_storage(bucket, prefix);
#else
    (void)prefix;
    throw Error(
        ErrorCode::kFailedPrecondition,
        fmt::format("{}: this build of Cairn has no S3 backend (built with CAIRN_S3=OFF)", uri));
#endif
  }
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("{}: unsupported storage scheme \"{}\" (supported: a path, file://, "
                          "s3://, memory://)",
                          uri, scheme));
}

}  // namespace cairn
