// The storage backends, reached only through open_storage(uri). Tests include
// this header for the in-memory backend's fault injection.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "cairn/storage.h"

namespace cairn {

std::shared_ptr<Storage> open_file_storage(const std::filesystem::path& root);
// An S3 bucket (or a prefix in it), configured from the AWS environment.
std::shared_ptr<Storage> open_s3_storage(std::string_view bucket, std::string_view prefix);
// `bucket` names a process-wide store created on first use; `prefix` is a key.
std::shared_ptr<Storage> open_memory_storage(std::string_view bucket, std::string_view prefix);

// A memory bucket of its own, in no registry: reachable only through the
// returned storage (and its children), freed with the last of them. Its URI,
// "memory://private-<n>", is for messages; open_storage() of it is another
// bucket.
std::shared_ptr<Storage> open_private_memory_storage();

// Faults for a memory bucket, so failure paths are testable without a real
// device. Operations are "write" (each append/write_at), "commit", "read",
// "list", "remove" and "lock"; `key` is relative to the bucket.
struct MemoryFaults {
  // Total bytes the bucket may hold (committed plus being written); writes
  // past it fail with kNoSpace, as a full disk would.
  std::optional<uint64_t> capacity;
  // Called before each operation; throw from it to inject a failure.
  std::function<void(std::string_view op, std::string_view key)> before;
};
// For a memory storage: a private bucket holding its objects as they are now
// (under the same relative keys), sharing their bytes, which are immutable:
// an O(objects) snapshot that later writes to `storage` do not change. Null
// for any other storage.
std::shared_ptr<Storage> freeze_memory_storage(const Storage& storage);

// Stores `data` as object `key` of a memory storage without copying it; the
// bytes must not change while anything holds them. kInvalidArgument for any
// other storage.
void put_shared_object(Storage& storage, std::string_view key,
                       std::shared_ptr<const std::string> data);

void set_memory_faults(std::string_view bucket, MemoryFaults faults);
// Bytes read from the bucket's objects so far, by every reader (tests of
// reads that must fetch only part of an object).
uint64_t memory_bytes_read(std::string_view bucket);
// Forgets everything in the bucket (tests call it to start clean).
void clear_memory_bucket(std::string_view bucket);

}  // namespace cairn
