// The storage backends, reached only through open_storage(uri). Internal to
// storage/ and its tests: production code above storage/ includes
// cairn/storage.h only. Tests include this header for the in-memory backend's
// fault injection.
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
void set_memory_faults(std::string_view bucket, MemoryFaults faults);
// Bytes read from the bucket's objects so far, by every reader (tests of
// reads that must fetch only part of an object).
uint64_t memory_bytes_read(std::string_view bucket);
// Forgets everything in the bucket (tests call it to start clean).
void clear_memory_bucket(std::string_view bucket);

}  // namespace cairn
