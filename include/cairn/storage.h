// The storage layer: one interface to file systems and object stores.
//
// A Storage is a flat namespace of objects named by keys ("a/b/c.bin"), rooted
// at a URI. It has object-store semantics on purpose, so that an S3 backend fits
// behind the same interface: there is no rename, no append to an existing
// object and no directory; listing is by key prefix. Backends are reached by
// URI only (open_storage), never by naming a class:
//
//   /plain/path, file:///abs/path   local or shared file system
//   memory://NAME/prefix            process-wide in-memory store, for tests
//   s3://BUCKET/prefix              Amazon S3 or an S3-compatible server
//                                   (configured as aws-cli is: docs/s3.md)
//
// Keys are relative, '/'-separated and never contain "", ".", ".." or a
// backslash as a component; validate_key() enforces this on every call, so a
// hostile name in a manifest cannot reach outside the root.
//
// Durability: when Writer::commit(), Storage::put() or Storage::remove()
// return, the change survives a process crash and (on the file backend, where
// the file and its directory are fsync'd) power loss. A reader sees an object
// whole or not at all; it never sees a partially written one.
//
// Thread-safety: a Storage may be used from many threads at once. A Reader may
// be shared by threads (read_at is positional); a Writer belongs to one thread.
//
// Failure: every method throws cairn::Error naming the URI of the object at
// fault. Missing objects are kNotFound for open_reader/get; remove() of a
// missing object succeeds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cairn {

struct ObjectInfo {
  std::string key;        // relative to the Storage's root
  uint64_t size = 0;      // bytes
  double modified = 0.0;  // seconds since the Unix epoch
};

class Reader {
 public:
  virtual ~Reader() = default;
  virtual uint64_t size() const = 0;
  // Fills `out` with the bytes at [offset, offset + out.size()). Throws
  // kCorruption naming the object and offset if the object is shorter.
  virtual void read_at(uint64_t offset, std::span<std::byte> out) = 0;
};

// Writes one new object. Nothing is visible under the key until
// commit() returns, and then the whole object is durable. A Writer destroyed
// without commit() discards what it wrote (best effort; a crash can leave an
// incomplete write behind, which list_incomplete() reports).
class Writer {
 public:
  virtual ~Writer() = default;
  // Sequential write after everything written so far.
  virtual void append(std::span<const std::byte> data) = 0;
  // Positional write for parallel writers: several threads may write disjoint
  // ranges at once. Do not mix with append() on one Writer. The object's size
  // is the end of the furthest range written; ranges never written read as
  // zeros.
  virtual void write_at(uint64_t offset, std::span<const std::byte> data) = 0;
  // Makes the object durable and visible, replacing any object with that key.
  virtual void commit() = 0;
  virtual uint64_t bytes_written() const = 0;

  // Direct I/O: writes that bypass the page cache (O_DIRECT on a local file).
  // The alignment write_direct() needs for offsets, addresses and lengths, or
  // 0 when this Writer has no direct path (the default; some file systems
  // refuse O_DIRECT, as tmpfs did before Linux 6.6). May open a second
  // descriptor the first time it is called; never throws for lack of support.
  virtual size_t direct_alignment() { return 0; }
  // Writes `data` at `offset` without the page cache; offset, data.data() and
  // data.size() are multiples of direct_alignment(). Only the first `valid`
  // bytes are content: the object's size becomes at least offset + valid, and
  // the padding after them is cut off by commit(). Thread-safe like
  // write_at(), and may be mixed with it on disjoint ranges. Durability is
  // unchanged: nothing is durable before commit(). kFailedPrecondition when
  // direct_alignment() is 0 or the arguments are not aligned.
  virtual void write_direct(uint64_t offset, std::span<const std::byte> data, size_t valid);
  // A hint before parallel writes that the object will take `size` bytes
  // (the padding of a last direct write included). A local file allocates
  // them now, so that parallel direct writes overwrite allocated blocks
  // instead of extending the file, which file systems serialize. The
  // object's size is still the end of what is written (commit() cuts the
  // rest off). kNoSpace when the space is not there; a file system that
  // cannot preallocate is no error. Other backends ignore it (the default).
  virtual void preallocate(uint64_t size) { (void)size; }
};

// An exclusive lock on a key, held until destroyed. It is released by the
// system when the holding process dies (including by SIGKILL), so a crashed
// writer never locks its successor out. Where the lock is a lease that a
// paused holder can lose (S3), writes and deletes made through the same
// Storage in the lock's folder are fenced: once another process took the
// lease over they throw kLocked naming the lock (docs/s3.md).
class Lock {
 public:
  virtual ~Lock() = default;
};

// Per-call options of Storage::open_writer.
struct WriteOptions {
  // Whether commit() makes the object survive power loss: on a file system
  // the data and then the folder are fsync'd (steps 3 and 5 of the file
  // backend's protocol). false is only for files the caller may lose to a
  // power cut (SaveOptions::durable = false): the object still appears
  // whole or not at all, and survives a process crash. Object stores ignore
  // it (an upload is durable when it completes).
  bool durable = true;
  // The object's size when known in advance, or 0. The file backend gives the
  // temp file that length at once, so that parallel positional writes fill
  // it instead of extending it; the object's size is still the end of what is
  // written. Other backends ignore it.
  uint64_t size = 0;
};

// What a backend can do beyond the interface, so that callers ask one
// question instead of each backend growing methods only it implements.
struct StorageCapabilities {
  // Whether the store checks every upload's bytes against a digest Cairn
  // computed from them (S3: Content-MD5), so that reading an object back right
  // after writing it proves nothing more.
  bool verifies_uploads = false;
  // How many bytes one read_at should ask for to run at full speed: 8 MiB for
  // local files; on S3 enough ranges to keep every parallel request busy.
  uint64_t preferred_read_size = 8ull << 20;
  // The local folder holding the objects as plain files, key K at
  // local_root / K (the file backend); std::nullopt elsewhere. Only for what
  // needs a path to read (mmap, hard links to a scratch folder). Durable
  // objects are written through open_writer() only, which holds the
  // durable-write protocol; the one writer there today is experiment/results.cc,
  // which appends result rows to its CSV log in place (a log whose tail a
  // crash may cut, rewritten whole when an append fails).
  std::optional<std::filesystem::path> local_root;
  // Whether rename() moves an object without copying its bytes (file
  // systems, memory); object stores cannot.
  bool renames = false;
  // The largest object put_stream() sends in one request, its bytes read from
  // the source as they leave (S3: one PUT instead of a multipart upload, up to
  // CAIRN_S3_UPLOAD_CUTOFF); 0 where put_stream() writes through open_writer()
  // as any write does.
  uint64_t streamed_put_limit = 0;
  // Whether a write cut short by a crash can leave a partial object readable
  // at its key. False for every backend Cairn ships: local files are written
  // to a temporary name, fsynced and renamed; memory stores whole objects; an
  // S3 PUT or multipart completion is atomic on the server. A manifest that
  // cannot be read is then damage after its commit, never the remains of an
  // interrupted one: readers report it and nothing removes its checkpoint
  // (docs/ARCHITECTURE.md, "Error model"). A backend that can tear writes
  // sets it, and an unreadable manifest that no history lists is then a
  // leftover that the manager's open and `cairn gc` remove.
  bool torn_writes = false;
};

// The bytes of an object for Storage::put_stream(): fills `out` with the
// object's bytes at `offset`.
using ObjectSource = std::function<void(uint64_t offset, std::span<std::byte> out)>;

class Storage {
 public:
  virtual ~Storage() = default;

  // The URI of the root, normalized ("file:///abs/path", "memory://name/p").
  virtual std::string uri() const = 0;
  // The URI of one key under the root, for messages and for opening it again.
  std::string uri_of(std::string_view key) const;

  // A Storage rooted at `prefix` below this one; keys of the child are
  // relative to it. On the file backend reads in the child never leave it, even
  // through symbolic links.
  virtual std::shared_ptr<Storage> child(std::string_view prefix) const = 0;

  // Starts writing the object `key` (see Writer). `options` are per call;
  // a backend ignores those that mean nothing to it.
  virtual std::unique_ptr<Writer> open_writer(std::string_view key,
                                              const WriteOptions& options = {}) = 0;
  virtual std::unique_ptr<Reader> open_reader(std::string_view key) = 0;
  virtual std::optional<ObjectInfo> stat(std::string_view key) = 0;

  // Every committed object whose key lies under `prefix` (a directory-like
  // prefix: "a" matches "a/x" but not "ab"), sorted by key. An empty prefix
  // lists everything.
  virtual std::vector<ObjectInfo> list(std::string_view prefix) = 0;

  // Removes the object durably. Removing a missing object is not an error.
  virtual void remove(std::string_view key) = 0;
  // Removes every key in `keys`, as remove() would, in as few requests as the
  // backend allows (S3: DeleteObjects, 1,000 keys a request). On failure some
  // of the keys may be gone and the others not.
  virtual void remove_many(const std::vector<std::string>& keys);

  // Moves the object `from` to `to` (replacing an object there), making the
  // folders `to` needs, where capabilities().renames; elsewhere throws
  // kFailedPrecondition and changes nothing. Atomic but not durable by
  // itself: after a crash the object lies under one name or the other.
  // kNotFound if `from` does not exist. The manager's retention uses it to
  // take a retired checkpoint's files out of the experiment at once and free
  // their space later (manager.h, ManagerOptions::background_delete).
  virtual void rename(std::string_view from, std::string_view to);

  // Takes an exclusive lock on `key` or throws kLocked naming it.
  virtual std::unique_ptr<Lock> try_lock(std::string_view key) = 0;
  // Whether a live holder has the lock on `key` (try_lock would throw
  // kLocked). Creates and changes nothing, for read-only tools such as a
  // dry run; the answer may be stale by the time it is used.
  virtual bool is_locked(std::string_view key) = 0;

  // Writes that were started under `prefix` and never committed or discarded
  // (left by a crash): temp files and empty directories on a file system,
  // unfinished multipart uploads on an object store. Each entry is an opaque
  // id whose first component is the top-level folder it lies in.
  virtual std::vector<std::string> list_incomplete(std::string_view prefix) = 0;
  virtual void discard_incomplete(std::string_view id) = 0;
  // Removes the folder `prefix` names ("": the folder this storage is rooted
  // at) and then its parents, each only while it is empty, never going above
  // the storage first opened: what a crash between making a folder and
  // writing into it leaves, which no object removal would touch. A folder
  // that is not empty, or missing, is left as it is, silently. A no-op where
  // folders do not exist apart from objects (object stores, memory).
  virtual void remove_empty_folder(std::string_view /*prefix*/) {}
  // list(prefix) and, into `incomplete`, list_incomplete(prefix), in one go:
  // on a file system one walk of the tree instead of two. Same results and
  // failures as the two calls.
  virtual std::vector<ObjectInfo> list_with_incomplete(std::string_view prefix,
                                                       std::vector<std::string>& incomplete);

  // What lies directly in the folder `prefix` ("": the root), sorted: the
  // name of each object there, and the name of each folder there followed by
  // '/', for folders that hold objects or incomplete writes and (file
  // systems) empty ones. Incomplete writes directly in the folder are not
  // names. The default derives this from list_with_incomplete(); the file
  // backend reads the one directory, so finding the experiments under a root
  // does not walk every checkpoint.
  virtual std::vector<std::string> list_names(std::string_view prefix);
  // The incomplete writes directly in the folder `prefix` ("": the root),
  // not those in its subfolders: list_incomplete(prefix) without what lies
  // deeper, as ids list_incomplete() would give. The default filters
  // list_incomplete(); the file backend reads the one directory, so that a
  // manager's open cleans its history's own temporaries without walking
  // every checkpoint.
  virtual std::vector<std::string> list_incomplete_at(std::string_view prefix);

  // Writes the object `key` of `size` bytes read from `source` and commits it,
  // replacing any object with that key, durable as a Writer's commit() with
  // the default WriteOptions. For a caller whose bytes lie elsewhere (a local
  // file being uploaded): memory stays at one block, not the object.
  // `source` is called front to back from offset 0 to `size`, in one pass or
  // more: the first pass ends with `read_through` (when set), before anything
  // becomes visible, so a caller checking a checksum of the bytes can refuse
  // them there; where the object goes in one request (size at most
  // capabilities().streamed_put_limit) each try of that request reads it
  // again. Every pass must give the same bytes: S3 checks them against the
  // first pass's MD5 and keeps the object it had; where the server does not,
  // Cairn compares what it sent and removes the changed object (kCorruption).
  // What `source` throws in its first pass or `read_through` throws is
  // rethrown, nothing committed; a source failing in a later pass fails the
  // request, and what the server keeps of a request cut short is the
  // server's (S3 keeps the object it had).
  // Thread-safety: as open_writer().
  virtual void put_stream(std::string_view key, uint64_t size, const ObjectSource& source,
                          const std::function<void()>& read_through = {});

  // What this backend can do beyond the interface (see StorageCapabilities).
  // Constant for the life of the Storage; cheap to call.
  virtual StorageCapabilities capabilities() const { return {}; }

  // Shorthands for capabilities().
  bool verifies_uploads() const { return capabilities().verifies_uploads; }
  uint64_t preferred_read_size() const { return capabilities().preferred_read_size; }
  // The local file holding `key` ("": the root folder) when the backend keeps
  // objects as plain local files (capabilities().local_root); std::nullopt
  // otherwise. For reading only (mapping a file, linking it): writes go
  // through open_writer(), which holds the durable-write protocol.
  // kInvalidArgument for an unsafe key.
  std::optional<std::filesystem::path> local_path(std::string_view key) const;

  // Conveniences built on the primitives above.
  void put(std::string_view key, std::string_view bytes);  // atomic replace
  std::string get(std::string_view key);                   // whole object
  bool exists(std::string_view key) { return stat(key).has_value(); }
  void remove_prefix(std::string_view prefix);  // every object under prefix
};

// Opens the storage rooted at `uri`. Throws kInvalidArgument for an unknown
// scheme or a malformed URI. Opening sends no request: an s3:// root that
// cannot be reached fails on first use.
std::shared_ptr<Storage> open_storage(std::string_view uri);

// Where s3:// URIs go, resolved as open_storage() resolves it for an s3://
// root (as the AWS CLI does: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the
// profile's configuration, else AWS's regional endpoint; docs/s3.md), for
// tools that must reach the same server (a pyarrow filesystem for Ray).
struct S3Endpoint {
  std::string url;      // never a trailing slash
  std::string region;   // the signing region
  bool custom = false;  // whether `url` came from configuration
};
// Throws kInvalidArgument as open_storage() would for unusable configuration.
S3Endpoint s3_endpoint();

// A memory storage of its own, in no registry: reachable only through the
// returned storage (and its children), freed with the last of them (the
// storage behind Checkpoint::in_memory()). Its URI, "memory://private-<n>",
// is for messages; open_storage() of it is another bucket.
std::shared_ptr<Storage> open_private_memory_storage();

// A frozen copy of `storage` where the backend can make one without copying
// bytes (memory storages: an O(objects) snapshot sharing their immutable
// bytes, which later writes to `storage` do not change); null for any other
// backend.
std::shared_ptr<Storage> freeze_memory_storage(const Storage& storage);

// Stores `data` as object `key` of a memory storage without copying it; the
// bytes must not change while anything holds them. kInvalidArgument for any
// other backend.
void put_shared_object(Storage& storage, std::string_view key,
                       std::shared_ptr<const std::string> data);

// Throws kNotFound naming the URI when nothing is stored at `storage`'s root:
// a local directory that does not exist, or on other backends a prefix with
// no object and no incomplete write under it (as on an object store, where
// an empty "folder" does not exist). A local root that exists but is not a
// directory is kInvalidArgument.
void check_root_exists(Storage& storage);

// Throws kInvalidArgument (or kCorruption when `is_stored` says the key came
// from stored data) naming the key if it is not a safe relative key.
void validate_key(std::string_view key, bool is_stored = false);

// Joins two key fragments with '/', ignoring empty ones.
std::string join_key(std::string_view a, std::string_view b);

// Bytes of a string, for Writer::append.
inline std::span<const std::byte> as_bytes(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

}  // namespace cairn
