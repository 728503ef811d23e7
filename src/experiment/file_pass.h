// The passes over a list of files that a copy makes (cairn/transfer.h):
// hashing a source, probing a destination, copying, reading back. Each runs
// on `jobs` threads, large files in ranged chunks hashed in order. Chunks
// live in buffers aligned for direct I/O: to and from a local disk they are
// written and read back with O_DIRECT, bypassing the page cache.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "cairn/checkpoint.h"
#include "cairn/storage.h"
#include "cairn/transfer.h"

namespace cairn::experiment {

// Counts for TransferProgress and calls the callback, one call at a time.
class ProgressSink {
 public:
  explicit ProgressSink(const TransferOptions& options) : callback_(options.progress) {}

  void add_total(uint64_t bytes, uint64_t files) {
    std::lock_guard<std::mutex> g(mu_);
    state_.bytes_total += bytes;
    state_.files_total += files;
  }
  void chunk_done(uint64_t bytes) {
    std::lock_guard<std::mutex> g(mu_);
    state_.bytes_done += bytes;
    state_.file.clear();
    state_.skipped = false;
    emit();
  }
  // `skipped`: found in place, its bytes were not counted by chunk_done().
  void file_done(std::string uri, uint64_t size, bool skipped) {
    std::lock_guard<std::mutex> g(mu_);
    if (skipped) {
      state_.bytes_done += size;
      state_.bytes_skipped += size;
    }
    ++state_.files_done;
    state_.file = std::move(uri);
    state_.skipped = skipped;
    emit();
  }
  // A planned file that will not be copied after all (its checkpoint left
  // the source during the copy).
  void drop(uint64_t bytes, uint64_t files) {
    std::lock_guard<std::mutex> g(mu_);
    state_.bytes_total -= std::min(bytes, state_.bytes_total);
    state_.files_total -= std::min(files, state_.files_total);
  }

 private:
  void emit() {
    if (callback_) callback_(state_);
  }
  std::function<void(const TransferProgress&)> callback_;
  std::mutex mu_;
  TransferProgress state_;
};

// What one pass over a list of files does with each.
enum class Pass {
  kHash,    // read from `from` and record the size and checksum in `want`
  kProbe,   // read from `from` (the destination): does it match `want`?
  kCopy,    // read from `from`, write to `to`; must match `want`
  kVerify,  // read back from `from` (the destination); must match `want`
};

struct Item {
  ManifestEntry want;
  bool matched = false;  // kProbe: found in place with the expected size and checksum
};

// Runs one pass over `items` (`to` only for kCopy). Throws the first
// failure, naming the file; the others stop at their next chunk.
void run_pass(Pass pass, Storage& from, Storage* to, std::vector<Item>& items,
              const TransferOptions& options, ProgressSink* progress);

std::vector<Item> items_of(const std::vector<ManifestEntry>& entries);

}  // namespace cairn::experiment
