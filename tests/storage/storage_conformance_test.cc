// One suite, every backend: the behaviour callers rely on, whatever the URI.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "cairn/error.h"
#include "storage/backends.h"
#include "storage/conformance.h"
#include "support/errors.h"
#include "support/s3_server.h"
#include "support/temp_dir.h"

namespace cairn::testing {
namespace {

// A storage root whose backing store lives as long as the storage.
struct FileRoot {
  TempDir dir;
  std::shared_ptr<Storage> storage = open_storage(dir.str());
};

std::vector<BackendUnderTest> backends() {
  static std::atomic<int> counter{0};
  return {
      {"file",
       [] {
         auto root = std::make_shared<FileRoot>();
         return std::shared_ptr<Storage>(root, root->storage.get());
       },
       true},
      {"memory",
       [] {
         std::string bucket = "conformance-" + std::to_string(counter++);
         clear_memory_bucket(bucket);
         return open_storage("memory://" + bucket + "/root");
       },
       false},
      // A real S3-compatible server on 127.0.0.1, with 256 KiB parts so
      // that objects of a few hundred KiB take the multipart path.
      {"s3", [] { return open_storage(S3Server::instance().fresh_uri("conformance")); }, false},
  };
}

class StorageConformance : public ::testing::TestWithParam<BackendUnderTest> {
 protected:
  std::shared_ptr<Storage> s = GetParam().make();
};

TEST_P(StorageConformance, PutThenGetReturnsTheBytes) {
  s->put("a/b.bin", std::string("hello\0world", 11));
  EXPECT_EQ(s->get("a/b.bin"), std::string("hello\0world", 11));
  auto info = s->stat("a/b.bin");
  ASSERT_TRUE(info);
  EXPECT_EQ(info->size, 11u);
  EXPECT_EQ(info->key, "a/b.bin");
}

TEST_P(StorageConformance, PutReplacesTheWholeObject) {
  s->put("k", "a long first version");
  s->put("k", "short");
  EXPECT_EQ(s->get("k"), "short");
}

TEST_P(StorageConformance, MissingObjectsAreNotFoundAndRemoveIsIdempotent) {
  EXPECT_EQ(code_of([&] { s->get("nope"); }), ErrorCode::kNotFound);
  EXPECT_FALSE(s->stat("nope"));
  EXPECT_FALSE(s->exists("dir/nope"));
  s->remove("nope");
  s->put("x", "1");
  s->remove("x");
  s->remove("x");
  EXPECT_FALSE(s->exists("x"));
}

TEST_P(StorageConformance, ListIsByDirectoryPrefixAndSorted) {
  for (const char* k : {"b/2", "a/1", "a/sub/3", "ab/4", "top"}) s->put(k, k);
  std::vector<std::string> keys;
  for (const auto& o : s->list("a")) keys.push_back(o.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"a/1", "a/sub/3"}));
  keys.clear();
  for (const auto& o : s->list("")) keys.push_back(o.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"a/1", "a/sub/3", "ab/4", "b/2", "top"}));
  EXPECT_TRUE(s->list("missing").empty());
}

TEST_P(StorageConformance, ListNamesShowsOneLevelWithFoldersEndingInASlash) {
  for (const char* k : {"b/2", "a/1", "a/sub/3", "a/sub/deeper/4", "ab/5", "top"}) s->put(k, k);
  EXPECT_EQ(s->list_names(""), (std::vector<std::string>{"a/", "ab/", "b/", "top"}));
  EXPECT_EQ(s->list_names("a"), (std::vector<std::string>{"1", "sub/"}));
  EXPECT_EQ(s->list_names("a/sub"), (std::vector<std::string>{"3", "deeper/"}));
  EXPECT_EQ(s->child("a")->list_names("sub"), (std::vector<std::string>{"3", "deeper/"}));
  EXPECT_TRUE(s->list_names("missing").empty());
  EXPECT_TRUE(s->list_names("top").empty()) << "an object is no folder";
}

TEST_P(StorageConformance, AnUncommittedWriteIsInvisibleAndDiscarded) {
  {
    auto w = s->open_writer("pending/obj");
    w->append(as_bytes("partial"));
    EXPECT_FALSE(s->exists("pending/obj"));
    EXPECT_TRUE(s->list("pending").empty());
  }
  EXPECT_FALSE(s->exists("pending/obj"));
  EXPECT_TRUE(s->list_incomplete("pending").empty());
}

TEST_P(StorageConformance, WriterAppendsInOrderAndCommitMakesVisible) {
  auto w = s->open_writer("big");
  std::string expect;
  for (int i = 0; i < 100; ++i) {
    std::string chunk(1000 + i, static_cast<char>('a' + i % 26));
    w->append(as_bytes(chunk));
    expect += chunk;
  }
  EXPECT_EQ(w->bytes_written(), expect.size());
  w->commit();
  EXPECT_EQ(s->get("big"), expect);
}

TEST_P(StorageConformance, ParallelPositionalWritesLandWhereAimedAndHolesAreZero) {
  auto w = s->open_writer("par");
  constexpr int kThreads = 4;
  constexpr size_t kChunk = 64 * 1024;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::string chunk(kChunk, static_cast<char>('0' + t));
      w->write_at(kChunk * (t + 1), as_bytes(chunk));  // chunk 0 stays a hole
    });
  }
  for (auto& t : threads) t.join();
  w->commit();
  std::string got = s->get("par");
  ASSERT_EQ(got.size(), kChunk * (kThreads + 1));
  EXPECT_EQ(got.substr(0, kChunk), std::string(kChunk, '\0'));
  for (int t = 0; t < kThreads; ++t)
    EXPECT_EQ(got.substr(kChunk * (t + 1), kChunk), std::string(kChunk, '0' + t));
}

TEST_P(StorageConformance, ReadPastTheEndIsCorruptionNamingTheOffset) {
  s->put("short", "12345");
  auto r = s->open_reader("short");
  std::vector<std::byte> buf(10);
  try {
    r->read_at(2, buf);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruption);
    EXPECT_NE(std::string(e.what()).find("offset 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("short"), std::string::npos) << e.what();
  }
}

TEST_P(StorageConformance, UnsafeKeysAreRefused) {
  for (const char* bad : {"", "/abs", "../up", "a/../b", "a//b", "./a", "a\\b"}) {
    EXPECT_EQ(code_of([&] { s->put(bad, "x"); }), ErrorCode::kInvalidArgument) << bad;
    EXPECT_EQ(code_of([&] { s->get(bad); }), ErrorCode::kInvalidArgument) << bad;
  }
}

TEST_P(StorageConformance, ChildSeesItsSubtreeWithRelativeKeys) {
  s->put("exp/ck/file", "data");
  s->put("exp/other", "x");
  auto child = s->child("exp/ck");
  EXPECT_EQ(child->get("file"), "data");
  ASSERT_EQ(child->list("").size(), 1u);
  EXPECT_EQ(child->list("")[0].key, "file");
  EXPECT_EQ(child->uri(), s->uri() + "/exp/ck");
  EXPECT_EQ(s->uri_of("exp/ck/file"), child->uri_of("file"));
  child->put("new", "n");
  EXPECT_EQ(s->get("exp/ck/new"), "n");
}

TEST_P(StorageConformance, OpeningTheUriAgainSeesTheSameObjects) {
  s->put("dir/obj", "same");
  auto again = open_storage(s->uri());
  EXPECT_EQ(again->get("dir/obj"), "same");
}

TEST_P(StorageConformance, LockIsExclusiveUntilReleased) {
  auto lock = s->try_lock("exp/.lock");
  try {
    s->try_lock("exp/.lock");
    FAIL() << "second lock succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kLocked);
    EXPECT_TRUE(e.retryable());
    EXPECT_NE(std::string(e.what()).find("exp/.lock"), std::string::npos);
  }
  lock.reset();
  EXPECT_NO_THROW(s->try_lock("exp/.lock"));
}

TEST_P(StorageConformance, RemovePrefixRemovesOnlyThatSubtree) {
  for (const char* k : {"a/1", "a/b/2", "ab/3"}) s->put(k, k);
  s->remove_prefix("a");
  EXPECT_TRUE(s->list("a").empty());
  EXPECT_TRUE(s->exists("ab/3"));
}

TEST_P(StorageConformance, RemovingAnEmptyFolderNeverTouchesObjects) {
  for (const char* k : {"a/1", "a/b/2", "ab/3"}) s->put(k, k);
  for (const char* f : {"a", "a/b", "ab", "", "missing"}) s->remove_empty_folder(f);
  s->child("a")->remove_empty_folder("");
  for (const char* k : {"a/1", "a/b/2", "ab/3"}) EXPECT_EQ(s->get(k), k);
}

TEST_P(StorageConformance, RenameMovesAnObjectAtOnceWhereTheBackendCanAndNowhereElse) {
  s->put("a/1", "one");
  s->put("t/x/1", "old");
  if (!s->capabilities().renames) {
    // An object store would have to copy the bytes: refused, nothing changed.
    EXPECT_EQ(code_of([&] { s->rename("a/1", "t/x/1"); }), ErrorCode::kFailedPrecondition);
    EXPECT_EQ(s->get("a/1"), "one");
    EXPECT_EQ(s->get("t/x/1"), "old");
    return;
  }
  s->rename("a/1", "t/x/1");  // replaces
  EXPECT_FALSE(s->exists("a/1"));
  EXPECT_EQ(s->get("t/x/1"), "one");
  s->put("b/2", "two");
  s->rename("b/2", "deep/er/folder/2");  // makes the folders it needs
  EXPECT_EQ(s->get("deep/er/folder/2"), "two");
  EXPECT_EQ(s->list("b").size(), 0u);
  EXPECT_EQ(code_of([&] { s->rename("missing", "t/y"); }), ErrorCode::kNotFound);
  EXPECT_FALSE(s->exists("t/y"));
  EXPECT_EQ(code_of([&] { s->rename("../outside", "t/z"); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { s->rename("t/x/1", "../outside"); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s->get("t/x/1"), "one");
  // Within a child, keys stay relative to it.
  auto c = s->child("deep");
  c->rename("er/folder/2", "moved");
  EXPECT_EQ(s->get("deep/moved"), "two");
}

// The bytes of a streamed object: a pattern of `size` bytes, read by offset.
std::string pattern(size_t size) {
  std::string s(size, '\0');
  for (size_t i = 0; i < size; ++i) s[i] = static_cast<char>((i * 131 + i / 4099) & 0xff);
  return s;
}

TEST_P(StorageConformance, PutStreamReadsTheSourceFrontToBackAndChecksBeforeShowingIt) {
  // Sizes around the S3 server's 256 KiB parts and put_stream's blocks.
  for (size_t size : {size_t{0}, size_t{5}, size_t{256 * 1024}, size_t{1'300'007}}) {
    SCOPED_TRACE(size);
    const std::string bytes = pattern(size);
    const std::string key = "streamed/" + std::to_string(size);
    uint64_t next = 0;  // where the current pass has got to
    int passes = 0;
    int checks = 0;
    auto source = [&](uint64_t offset, std::span<std::byte> out) {
      if (offset == 0) ++passes;
      ASSERT_EQ(offset, offset == 0 ? 0 : next) << "read out of order";
      ASSERT_LE(offset + out.size(), size);
      std::memcpy(out.data(), bytes.data() + offset, out.size());
      next = offset + out.size();
    };
    auto read_through = [&] {
      ++checks;
      EXPECT_EQ(next, size) << "checked before the first pass ended";
      EXPECT_FALSE(s->exists(key)) << "visible before it was checked";
    };
    s->put_stream(key, size, source, read_through);
    EXPECT_EQ(checks, 1);
    if (size > 0) {
      EXPECT_GE(passes, 1);
    }
    EXPECT_EQ(s->get(key), bytes);
  }
}

TEST_P(StorageConformance, PutStreamCommitsNothingWhenTheCheckOrTheSourceFails) {
  const size_t size = 1'300'007;
  const std::string bytes = pattern(size);
  s->put("kept", "the object before");
  auto source = [&](uint64_t offset, std::span<std::byte> out) {
    std::memcpy(out.data(), bytes.data() + offset, out.size());
  };
  EXPECT_EQ(code_of([&] {
              s->put_stream("kept", size, source,
                            [] { throw Error(ErrorCode::kCorruption, "refused by the check"); });
            }),
            ErrorCode::kCorruption);
  EXPECT_EQ(s->get("kept"), "the object before");

  // A source failing before its first pass ends.
  auto failing = [&](uint64_t offset, std::span<std::byte> out) {
    if (offset + out.size() > size / 2) {
      throw Error(ErrorCode::kIO, "the source broke at byte offset " + std::to_string(offset));
    }
    std::memcpy(out.data(), bytes.data() + offset, out.size());
  };
  EXPECT_EQ(code_of([&] { s->put_stream("kept", size, failing); }), ErrorCode::kIO);
  EXPECT_EQ(s->get("kept"), "the object before");
  EXPECT_TRUE(s->list_incomplete("").empty());
}

TEST_P(StorageConformance, LocalPathsOnlyWhereTheBackendHasThem) {
  s->put("f", "x");
  EXPECT_EQ(s->local_path("f").has_value(), GetParam().has_local_paths);
}

INSTANTIATE_TEST_SUITE_P(Backends, StorageConformance, ::testing::ValuesIn(backends()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace cairn::testing
