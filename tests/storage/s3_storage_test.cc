// What the S3 backend adds to the conformance suite: multipart uploads,
// pagination, bulk deletes, crash leftovers, the lease lock, and errors that
// name what is at fault. Against a real s3rver on 127.0.0.1.
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cairn/error.h"
#include "cairn/storage.h"
#include "support/env.h"
#include "support/errors.h"
#include "support/s3_server.h"

namespace cairn::testing {
namespace {

// Sets an environment variable for one scope.

std::string random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

class S3Storage : public ::testing::Test {
 protected:
  std::string uri = S3Server::instance().fresh_uri("s3test");
  std::shared_ptr<Storage> s = open_storage(uri);
};

TEST_F(S3Storage, KeysWithSpacesUnicodeAndPercentRoundTrip) {
  for (std::string key : {"a b/c+d", "ü/ñ €", "p%41q", "tilde~/x=y&z", "semi;colon,comma"}) {
    s->put(key, key);
    EXPECT_EQ(s->get(key), key);
  }
  std::vector<std::string> keys;
  for (const auto& o : s->list("")) keys.push_back(o.key);
  EXPECT_EQ(keys.size(), 5u);
  EXPECT_NE(std::find(keys.begin(), keys.end(), "p%41q"), keys.end());
  EXPECT_NE(std::find(keys.begin(), keys.end(), "ü/ñ €"), keys.end());
}

TEST_F(S3Storage, ListingPagesPastAThousandKeysAndBulkDeleteRemovesThemAll) {
  std::vector<std::string> keys;
  for (int i = 0; i < 1100; ++i) keys.push_back(fmt::format("many/{:05d}", i));
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < keys.size(); i += 8) s->put(keys[i], "x");
    });
  }
  for (auto& t : threads) t.join();
  auto listed = s->list("many");
  ASSERT_EQ(listed.size(), 1100u);
  for (size_t i = 0; i < keys.size(); ++i) ASSERT_EQ(listed[i].key, keys[i]);
  s->remove_prefix("many");
  EXPECT_TRUE(s->list("many").empty());
}

TEST_F(S3Storage, MultipartObjectsAreWholeAndRangedReadsSpanParts) {
  // 256 KiB parts (set by the test server): 3.3 MiB is 14 parts.
  std::string data = random_bytes(3'300'000, 7);
  auto w = s->open_writer("big.bin");
  for (size_t at = 0; at < data.size(); at += 77'777) {
    w->append(as_bytes(std::string_view(data).substr(at, 77'777)));
  }
  w->commit();
  EXPECT_EQ(s->stat("big.bin")->size, data.size());
  EXPECT_EQ(s->get("big.bin"), data);
  auto r = s->open_reader("big.bin");
  for (auto [offset, len] : std::vector<std::pair<size_t, size_t>>{
           {0, 1}, {262'143, 2}, {100'000, 1'500'000}, {data.size() - 5, 5}}) {
    std::string got(len, '\0');
    r->read_at(offset, std::as_writable_bytes(std::span(got.data(), got.size())));
    EXPECT_EQ(got, data.substr(offset, len)) << offset;
  }
  EXPECT_TRUE(s->list_incomplete("").empty());
}

TEST_F(S3Storage, ParallelPositionalWritesAcrossManyPartsLandWhereAimed) {
  constexpr size_t kChunk = 100'000;  // not a divisor of the part size
  constexpr int kChunks = 40;
  std::string data = random_bytes(kChunk * kChunks, 11);
  auto w = s->open_writer("par.bin");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int c = t; c < kChunks; c += 4) {
        w->write_at(c * kChunk, as_bytes(std::string_view(data).substr(c * kChunk, kChunk)));
      }
    });
  }
  for (auto& t : threads) t.join();
  w->commit();
  EXPECT_EQ(s->get("par.bin"), data);
}

TEST_F(S3Storage, AnUploadCutShortByAKillIsAnIncompleteWriteThatDiscardRemoves) {
  pid_t pid = ::fork();
  if (pid == 0) {
    auto child = open_storage(uri);
    auto w = child->open_writer("ck/model.bin");
    w->append(as_bytes(random_bytes(700'000, 3)));  // two full parts sent, one pending
    ::raise(SIGKILL);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_FALSE(s->exists("ck/model.bin"));
  EXPECT_TRUE(s->list("").empty()) << "markers must not be listed";
  auto incomplete = s->list_incomplete("");
  ASSERT_EQ(incomplete.size(), 1u);
  EXPECT_EQ(incomplete[0].rfind("ck/", 0), 0u) << incomplete[0];
  EXPECT_EQ(s->list_incomplete("ck").size(), 1u);
  EXPECT_TRUE(s->list_incomplete("other").empty());
  s->discard_incomplete(incomplete[0]);
  EXPECT_TRUE(s->list_incomplete("").empty());
  std::string message =
      error_message_of([&] { s->discard_incomplete("ck/model.bin"); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("not an incomplete write"), std::string::npos) << message;
}

TEST_F(S3Storage, AnObjectNeedingMoreThanTenThousandPartsIsRefusedBeforeAnyPartIsSent) {
  const uint64_t part = 262144;  // the test server's part size (support/s3_server.cc)
  auto w = s->open_writer("huge.bin");
  std::string message =
      error_message_of([&] { w->preallocate(part * 10000 + 1); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("CAIRN_S3_PART_SIZE"), std::string::npos) << message;
  EXPECT_NE(message.find("huge.bin"), std::string::npos) << message;
  w->preallocate(part * 10000);  // exactly 10,000 parts is fine
  error_message_of([&] { w->write_at(part * 10000, as_bytes("x")); }, ErrorCode::kInvalidArgument);
  w.reset();
  EXPECT_TRUE(s->list_incomplete("").empty()) << "no upload may have been started";
}

TEST_F(S3Storage, TheLockOfAKilledHolderOnThisMachineIsFreeAtOnce) {
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    auto child = open_storage(uri);
    auto lock = child->try_lock("exp/.cairn.lock");
    char c = 'y';
    (void)!::write(ready[1], &c, 1);
    ::pause();
    ::_exit(0);
  }
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  EXPECT_TRUE(s->is_locked("exp/.cairn.lock"));
  EXPECT_EQ(code_of([&] { s->try_lock("exp/.cairn.lock"); }), ErrorCode::kLocked);
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  ::close(ready[0]);
  ::close(ready[1]);
  EXPECT_FALSE(s->is_locked("exp/.cairn.lock"));
  EXPECT_NO_THROW(s->try_lock("exp/.cairn.lock"));
}

TEST_F(S3Storage, ALeaseFromAnotherMachineHoldsUntilItLapses) {
  s->put("exp/.cairn.lock",
         R"({"host":"elsewhere","boot_id":"b","pid":42,"start_time":"1","token":"t",)"
         R"("ttl_seconds":3})");
  std::string message =
      error_message_of([&] { s->try_lock("exp/.cairn.lock"); }, ErrorCode::kLocked);
  EXPECT_NE(message.find("pid 42 on elsewhere"), std::string::npos) << message;
  EXPECT_NE(message.find("exp/.cairn.lock"), std::string::npos) << message;
  EXPECT_TRUE(s->is_locked("exp/.cairn.lock"));
  std::this_thread::sleep_for(std::chrono::seconds(4));
  EXPECT_FALSE(s->is_locked("exp/.cairn.lock"));
  auto lock = s->try_lock("exp/.cairn.lock");
  EXPECT_TRUE(s->is_locked("exp/.cairn.lock"));
  lock.reset();
  EXPECT_FALSE(s->exists("exp/.cairn.lock"));
}

TEST_F(S3Storage, AHeldLeaseIsRenewedPastItsLifetime) {
  ScopedEnv ttl("CAIRN_S3_LOCK_TTL", "2");
  auto short_lived = open_storage(uri);
  auto lock = short_lived->try_lock("exp/.cairn.lock");
  std::this_thread::sleep_for(std::chrono::seconds(5));
  // Five seconds on, a lease of two is live only because it was renewed.
  EXPECT_TRUE(short_lived->is_locked("exp/.cairn.lock"));
  EXPECT_EQ(code_of([&] { short_lived->try_lock("exp/.cairn.lock"); }), ErrorCode::kLocked);
}

TEST_F(S3Storage, AMissingBucketIsNotFoundNamingIt) {
  auto missing = open_storage("s3://no-such-bucket-here/p");
  std::string message = error_message_of([&] { missing->put("k", "v"); }, ErrorCode::kNotFound);
  EXPECT_NE(message.find("s3://no-such-bucket-here"), std::string::npos) << message;
  EXPECT_NE(message.find("does not exist"), std::string::npos) << message;
  EXPECT_EQ(code_of([&] { missing->list(""); }), ErrorCode::kNotFound);
  EXPECT_EQ(code_of([&] { check_root_exists(*missing); }), ErrorCode::kNotFound);
}

TEST_F(S3Storage, WrongCredentialsArePermissionDeniedNamingTheObject) {
  ScopedEnv key("AWS_ACCESS_KEY_ID", "NOT-A-KEY");
  auto denied = open_storage(uri);
  std::string message =
      error_message_of([&] { denied->put("k", "v"); }, ErrorCode::kPermissionDenied);
  EXPECT_NE(message.find(uri + "/k"), std::string::npos) << message;
  EXPECT_NE(message.find("403"), std::string::npos) << message;
  EXPECT_EQ(code_of([&] { denied->get("k"); }), ErrorCode::kPermissionDenied);
}

TEST_F(S3Storage, AServerThatIsDownIsARetryableErrorNamingTheEndpoint) {
  std::string endpoint = fmt::format("http://127.0.0.1:{}", free_port());
  ScopedEnv down("AWS_ENDPOINT_URL_S3", endpoint);
  ScopedEnv attempts("CAIRN_S3_MAX_ATTEMPTS", "2");
  auto unreachable = open_storage(uri);
  try {
    unreachable->get("k");
    FAIL();
  } catch (const Error& e) {
    EXPECT_TRUE(e.retryable());
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable);
    EXPECT_NE(std::string(e.what()).find(endpoint), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("2 attempts"), std::string::npos) << e.what();
  }
}

TEST_F(S3Storage, BadUrisAreRefusedBeforeAnyRequest) {
  EXPECT_EQ(code_of([] { open_storage("s3://"); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([] { open_storage("s3://Bad_Bucket!/x"); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([] { open_storage("s3://bucket/../x"); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([] { open_storage("s3://bucket/a//b"); }), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace cairn::testing
