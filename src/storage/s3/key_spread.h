// Spreading keys across S3 prefixes. S3 scales its request rate per key
// prefix (3,500 PUT/COPY/POST/DELETE and 5,500 GET/HEAD per second each) and
// answers 503 SlowDown above it until it has partitioned the prefix. A
// checkpoint of many ranks writes one object per rank under one folder at
// once, so past a few thousand ranks that one prefix is the limit
// (docs/scale.md). With n > 1 prefixes, the object of key K is stored as
//
//   "<i>-of-<n>/K"   i = XXH3-64(K) mod n, in lowercase hex, zero-padded to
//                    the digits of n - 1
//
// so a folder's objects spread evenly over n prefixes that do not change
// from one checkpoint to the next, and S3's partitions of them keep serving
// later checkpoints. Callers keep using K: only the stored name changes, and
// a listing of a folder asks each of the n prefixes.
//
// Pure and immutable: thread-safe, no I/O.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cairn::s3 {

class KeySpread {
 public:
  static constexpr uint32_t kMaxPrefixes = 4096;

  // `prefixes` in 1..kMaxPrefixes (1: keys are stored as they are); throws
  // kInvalidArgument otherwise.
  explicit KeySpread(uint32_t prefixes = 1);

  uint32_t prefixes() const { return n_; }
  bool spread() const { return n_ > 1; }

  // The stored name of `key`.
  std::string stored(std::string_view key) const;
  // The key a stored name stands for, or nothing when `stored` lies under
  // none of this spread's prefixes.
  std::optional<std::string> key_of(std::string_view stored) const;
  // The stored prefixes that together hold every key starting with
  // `key_prefix`: one per spread prefix, in order.
  std::vector<std::string> listing_prefixes(std::string_view key_prefix) const;
  // Spread prefix number `i` (< prefixes()), with its trailing '/'; empty
  // when nothing is spread.
  std::string prefix(uint32_t i) const;

 private:
  uint32_t n_;
  int digits_;
};

}  // namespace cairn::s3
