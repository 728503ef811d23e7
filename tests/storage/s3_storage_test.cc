// What the S3 backend adds to the conformance suite: multipart uploads,
// pagination, bulk deletes, crash leftovers, the lease lock, and errors that
// name what is at fault. Against real S3 servers on 127.0.0.1 (moto, and
// radosgw in the radosgw.* runs: tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cairn/error.h"
#include "cairn/manager.h"
#include "cairn/storage.h"
#include "storage/s3/client.h"
#include "storage/s3/key_spread.h"
#include "storage/s3/lease.h"
#include "storage/s3/xml.h"
#include "support/env.h"
#include "support/errors.h"
#include "support/lease_race.h"
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
  void TearDown() override { s3::set_lease_clock_for_testing(nullptr); }
  std::string uri = S3Server::instance().fresh_uri("s3test");
  std::shared_ptr<Storage> s = open_storage(uri);
};

// The keys as this process stores them: spread over prefixes when
// CAIRN_S3_PREFIXES says so (the "spread." run of these tests).
s3::KeySpread spread() {
  return s3::KeySpread(s3::S3Options::from_environment(s3::AwsEnvironment::process()).prefixes);
}

// The key of `key` under the test's root `uri`, as Cairn names it.
std::string key_under(const std::string& uri, const std::string& key) {
  std::string prefix = uri.substr(uri.find('/', 5) + 1);
  return prefix + "/" + key;
}

// The stored name in the bucket of `key` under the test's root `uri`.
std::string bucket_key(const std::string& uri, const std::string& key) {
  return spread().stored(key_under(uri, key));
}

// Raw S3 requests to the test server, for what Storage does not expose.
s3::S3Client raw_client() {
  s3::AwsEnvironment env = s3::AwsEnvironment::process();
  return s3::S3Client(s3::resolve_s3_settings(env), s3::default_credentials(env),
                      s3::make_http_client(), s3::S3Options::from_environment(env));
}

// The stored name of every object whose key starts with `prefix` (a key
// prefix under the test's root `uri`), hidden ones too.
std::vector<std::string> raw_keys(const std::string& uri, const std::string& prefix) {
  std::vector<std::string> keys;
  for (const std::string& stored : spread().listing_prefixes(key_under(uri, prefix))) {
    s3::S3Request r;
    r.query = {{"list-type", "2"}, {"prefix", stored}};
    s3::ListPage page =
        s3::parse_list_objects_v2(raw_client().call(S3Server::instance().bucket(), r).body);
    for (const auto& o : page.objects) keys.push_back(o.key);
  }
  return keys;
}

// ListMultipartUploads of the keys starting with `prefix` under `uri`.
std::vector<std::string> multipart_uploads(const std::string& uri, const std::string& prefix) {
  std::vector<std::string> keys;
  for (const std::string& stored : spread().listing_prefixes(key_under(uri, prefix))) {
    s3::S3Request r;
    r.query = {{"uploads", ""}, {"prefix", stored}};
    s3::UploadsPage page =
        s3::parse_list_multipart_uploads(raw_client().call(S3Server::instance().bucket(), r).body);
    for (const auto& u : page.uploads) keys.push_back(u.key);
  }
  return keys;
}

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

// put_stream() of `data` to `key` on `storage`, reading it from memory.
void put_streamed(Storage& storage, const std::string& key, const std::string& data) {
  storage.put_stream(key, data.size(), [&](uint64_t offset, std::span<std::byte> out) {
    std::memcpy(out.data(), data.data() + offset, out.size());
  });
}

TEST_F(S3Storage, AStreamedObjectUpToTheUploadCutoffIsOnePutAndLargerOnesMultipart) {
  // 256 KiB parts (set by the test server), the default cutoff of 200 MiB.
  std::string data = random_bytes(3'300'000, 5);
  EXPECT_GE(s->capabilities().streamed_put_limit, data.size());
  const uint64_t before = s3::requests_sent();
  put_streamed(*s, "one.bin", data);
  EXPECT_EQ(s3::requests_sent() - before, 1u);
  EXPECT_EQ(s->get("one.bin"), data);

  // A cutoff below the object: a multipart upload of 13 parts (plus its
  // start, marker, completion and the marker's removal), the same bytes.
  ScopedEnv cutoff("CAIRN_S3_UPLOAD_CUTOFF", "1000000");
  auto small_cutoff = open_storage(uri);
  EXPECT_EQ(small_cutoff->capabilities().streamed_put_limit, 1'000'000u);
  const uint64_t start = s3::requests_sent();
  put_streamed(*small_cutoff, "parts.bin", data);
  EXPECT_EQ(s3::requests_sent() - start, 13u + 4u);
  EXPECT_EQ(s->get("parts.bin"), data);
  EXPECT_TRUE(s->list_incomplete("").empty());
}

TEST_F(S3Storage, AStreamedObjectWhoseBytesChangeAfterTheFirstPassIsRefusedByTheServer) {
  // The first pass gives the Content-MD5; the PUT's pass differs in one
  // byte. S3 refuses the body and keeps the object it had; a server that
  // does not check Content-MD5 stores it, and Cairn, which hashed
  // what it sent, removes it. Either way the changed bytes are not left.
  std::string data = random_bytes(1'000'000, 9);
  s->put("changing.bin", "before");
  int pass = 0;
  auto source = [&](uint64_t offset, std::span<std::byte> out) {
    if (offset == 0) ++pass;
    std::memcpy(out.data(), data.data() + offset, out.size());
    if (pass > 1 && offset <= 500'000 && 500'000 < offset + out.size()) {
      out[500'000 - offset] = static_cast<std::byte>(~data[500'000]);
    }
  };
  EXPECT_THROW(s->put_stream("changing.bin", data.size(), source), Error);
  std::optional<ObjectInfo> left = s->stat("changing.bin");
  if (left) {
    EXPECT_EQ(s->get("changing.bin"), "before");
  }
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

// The writer's part buffers grow with what is written (a small object does
// not hold a whole part): bytes never written, before, between or inside
// parts, still read back as zeros.
// CAIRN_S3_PREFIXES: a folder's objects spread evenly over the prefixes,
// each under the stored name key_spread.h gives it, and read, listed and
// deleted by their keys; a process with another count sees none of them.
TEST_F(S3Storage, SpreadKeysLandUnderEveryPrefixAndAreReadListedAndDeletedByTheirKeys) {
  std::shared_ptr<Storage> spread_storage, plain, other;
  {
    ScopedEnv e("CAIRN_S3_PREFIXES", "16");
    spread_storage = open_storage(uri + "/spread");
  }
  {
    ScopedEnv e("CAIRN_S3_PREFIXES", "1");
    plain = open_storage(uri + "/spread");
  }
  {
    ScopedEnv e("CAIRN_S3_PREFIXES", "8");
    other = open_storage(uri + "/spread");
  }
  std::vector<std::string> keys;
  for (int i = 0; i < 256; ++i) keys.push_back(fmt::format("ckpt/rank_{:05}.safetensors", i));
  for (const std::string& k : keys) spread_storage->put(k, k);
  std::vector<std::string> listed;
  for (const ObjectInfo& o : spread_storage->list("ckpt")) listed.push_back(o.key);
  EXPECT_EQ(listed, keys);
  EXPECT_EQ(spread_storage->get(keys[7]), keys[7]);
  ASSERT_TRUE(spread_storage->stat(keys[9]));
  EXPECT_EQ(spread_storage->stat(keys[9])->size, keys[9].size());
  EXPECT_TRUE(plain->list("").empty());
  EXPECT_TRUE(other->list("").empty());
  EXPECT_FALSE(plain->exists(keys[0]));

  const s3::KeySpread sixteen(16);
  std::set<std::string> stored_names;
  std::vector<size_t> per_prefix(16);
  for (uint32_t i = 0; i < 16; ++i) {
    s3::S3Request r;
    r.query = {{"list-type", "2"}, {"prefix", sixteen.prefix(i) + key_under(uri, "spread/")}};
    for (const auto& o :
         s3::parse_list_objects_v2(raw_client().call(S3Server::instance().bucket(), r).body)
             .objects) {
      stored_names.insert(o.key);
      ++per_prefix[i];
    }
  }
  std::set<std::string> expected;
  for (const std::string& k : keys) expected.insert(sixteen.stored(key_under(uri, "spread/" + k)));
  EXPECT_EQ(stored_names, expected);
  for (uint32_t i = 0; i < 16; ++i) EXPECT_GT(per_prefix[i], 0u) << sixteen.prefix(i);

  spread_storage->remove_many(keys);
  EXPECT_TRUE(spread_storage->list("").empty());
  for (uint32_t i = 0; i < 16; ++i) {
    s3::S3Request r;
    r.query = {{"list-type", "2"}, {"prefix", sixteen.prefix(i) + key_under(uri, "spread/")}};
    EXPECT_TRUE(s3::parse_list_objects_v2(raw_client().call(S3Server::instance().bucket(), r).body)
                    .objects.empty());
  }
}

TEST_F(S3Storage, BytesNeverWrittenReadAsZerosWhereverTheyAre) {
  auto w = s->open_writer("holes.bin");
  w->write_at(300'000, as_bytes("tail"));  // part 1 of 256 KiB parts, after a hole
  w->write_at(10, as_bytes("head"));       // part 0, after 10 bytes never written
  w->commit();
  std::string want(300'004, '\0');
  want.replace(10, 4, "head");
  want.replace(300'000, 4, "tail");
  EXPECT_EQ(s->get("holes.bin"), want);

  auto small = s->open_writer("small.bin");
  small->write_at(5, as_bytes("x"));
  small->write_at(0, as_bytes("ab"));
  small->commit();
  EXPECT_EQ(s->get("small.bin"), std::string("ab\0\0\0x", 6));
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

// The lease's own lifetime counts, not the reader's: one of ten minutes is
// held however slow the test runs, one of a second has lapsed two seconds on
// (server times in whole seconds: at least two apart).
TEST_F(S3Storage, ALeaseFromAnotherMachineHoldsUntilItLapses) {
  auto foreign = [](int ttl) {
    return fmt::format(R"({{"host":"elsewhere","boot_id":"b","pid":42,"start_time":"1",)"
                       R"("token":"t","ttl_seconds":{}}})",
                       ttl);
  };
  s->put("exp/.cairn.lock", foreign(600));
  std::string message =
      error_message_of([&] { s->try_lock("exp/.cairn.lock"); }, ErrorCode::kLocked);
  EXPECT_NE(message.find("pid 42 on elsewhere"), std::string::npos) << message;
  EXPECT_NE(message.find("exp/.cairn.lock"), std::string::npos) << message;
  EXPECT_TRUE(s->is_locked("exp/.cairn.lock"));
  s->put("exp/.cairn.lock", foreign(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  EXPECT_FALSE(s->is_locked("exp/.cairn.lock"));
  auto lock = s->try_lock("exp/.cairn.lock");
  EXPECT_TRUE(s->is_locked("exp/.cairn.lock"));
  lock.reset();
  EXPECT_FALSE(s->exists("exp/.cairn.lock"));
}

// Radosgw answers 412 to `If-Match: "<etag>"` on a PUT: the takeover of a
// lapsed lease used to fail there forever ("taken by another process just
// now"), and the experiment stayed locked after one kill.
TEST_F(S3Storage, ALapsedLeaseIsTakenOverWhateverIfMatchSpellingTheServerWants) {
  s->put("exp/.cairn.lock", foreign_lease(0));
  EXPECT_FALSE(s->is_locked("exp/.cairn.lock"));
  auto lock = s->try_lock("exp/.cairn.lock");
  EXPECT_TRUE(s->is_locked("exp/.cairn.lock"));
  lock.reset();
  EXPECT_FALSE(s->exists("exp/.cairn.lock"));
  // Again from a fresh handle, which learns the server's spelling anew.
  s->put("exp/.cairn.lock", foreign_lease(0));
  EXPECT_NO_THROW(open_storage(uri)->try_lock("exp/.cairn.lock"));
}

// A PUT cut short by a kill can leave an empty or torn lease; it names no
// holder who could renew it, so it is free, not "held by pid 0" for a TTL.
TEST_F(S3Storage, AnEmptyOrTornLeaseIsStaleAndTakenAtOnce) {
  for (std::string body : {std::string(), std::string(R"({"host":"elsewhere","pi)")}) {
    s->put("exp/.cairn.lock", body);
    EXPECT_FALSE(s->is_locked("exp/.cairn.lock")) << body;
    auto lock = s->try_lock("exp/.cairn.lock");
    EXPECT_TRUE(s->is_locked("exp/.cairn.lock")) << body;
  }
}

// A holder paused past its lease's lifetime (here: its clock jumps ahead)
// while another process takes the lease over must not write or delete
// anything of the experiment when it wakes up.
TEST_F(S3Storage, AHolderPausedPastItsLeaseIsFencedOutAndTheNewHolderLosesNothing) {
  auto now = std::make_shared<std::atomic<int64_t>>(0);
  s3::set_lease_clock_for_testing(
      [now] { return std::chrono::steady_clock::time_point(std::chrono::seconds(now->load())); });
  auto first = open_storage(uri);
  auto first_lock = first->try_lock("exp/.cairn.lock");
  first->put("exp/ck/a.bin", "written while holding the lease");
  // The first holder stops for longer than its lease (6 s in the tests)...
  *now += 60;
  // ...and a second process finds the lease lapsed and takes it over (acted
  // out by rewriting the lease as lapsed, which is what the server's clock
  // would show by then).
  s->put("exp/.cairn.lock", foreign_lease(0));
  auto second = open_storage(uri);
  auto second_lock = second->try_lock("exp/.cairn.lock");
  second->put("exp/ck/b.bin", "the new holder's");
  second->put("exp/manifest.json", "the new holder's manifest");
  // The first holder wakes up: its commits and deletes are refused, naming
  // the lock.
  for (auto attempt : std::vector<std::function<void()>>{
           [&] { first->put("exp/manifest.json", "stale"); },
           [&] { first->remove("exp/ck/b.bin"); },
           [&] {
             first->remove_many({"exp/ck/b.bin", "exp/manifest.json"});
           },
           [&] {
             auto w = first->open_writer("exp/ck/big.bin");
             w->append(as_bytes(random_bytes(700'000, 5)));  // multipart
             w->commit();
           }}) {
    std::string message = error_message_of(attempt, ErrorCode::kLocked);
    EXPECT_NE(message.find(uri + "/exp/.cairn.lock"), std::string::npos) << message;
    EXPECT_NE(message.find("lost"), std::string::npos) << message;
  }
  EXPECT_EQ(s->get("exp/manifest.json"), "the new holder's manifest");
  EXPECT_EQ(s->get("exp/ck/b.bin"), "the new holder's");
  EXPECT_FALSE(s->exists("exp/ck/big.bin"));
  // Outside the lock's folder nothing is fenced; the new holder writes on.
  first->put("elsewhere.bin", "x");
  second->put("exp/ck/c.bin", "more");
  first_lock.reset();  // releasing a lost lease leaves the new holder's alone
  EXPECT_TRUE(s->is_locked("exp/.cairn.lock"));
}

// A holder whose clock shows the lease near its end confirms it before a
// write, and goes on writing when it still holds it.
TEST_F(S3Storage, AHolderThatStillHoldsItsLeaseConfirmsItAndWritesOn) {
  auto now = std::make_shared<std::atomic<int64_t>>(0);
  s3::set_lease_clock_for_testing(
      [now] { return std::chrono::steady_clock::time_point(std::chrono::seconds(now->load())); });
  auto lock = s->try_lock("exp/.cairn.lock");
  *now += 60;
  EXPECT_NO_THROW(s->put("exp/manifest.json", "ok"));
  EXPECT_NO_THROW(s->remove("exp/manifest.json"));
  EXPECT_TRUE(s->is_locked("exp/.cairn.lock"));
}

// What a server that checks signatures refuses (radosgw does; moto accepts
// any credentials).
TEST_F(S3Storage, AWrongSecretIsRefusedByTheServer) {
  if (S3Server::instance().kind() == S3Server::Kind::kMoto) {
    GTEST_SKIP() << "moto checks no signatures; the radosgw run checks this";
  }
  ScopedEnv secret("AWS_SECRET_ACCESS_KEY", "not-the-secret");
  auto denied = open_storage(uri);
  std::string message =
      error_message_of([&] { denied->put("k", "v"); }, ErrorCode::kPermissionDenied);
  EXPECT_NE(message.find(uri + "/k"), std::string::npos) << message;
  EXPECT_NE(message.find("SignatureDoesNotMatch"), std::string::npos) << message;
}

TEST_F(S3Storage, ConditionalWritesAreHonouredByTheServer) {
  s->put("cond", "one");
  s3::S3Client client = raw_client();
  auto put = [&](std::string header, std::string value) {
    s3::S3Request r;
    r.method = "PUT";
    r.key = bucket_key(uri, "cond");
    r.body = as_bytes("two");
    r.headers = {{header, value}};
    r.accept = {412};
    return client.call(S3Server::instance().bucket(), r).status;
  };
  s3::S3Request head;
  head.method = "HEAD";
  head.key = bucket_key(uri, "cond");
  std::string etag = client.call(S3Server::instance().bucket(), head).header("etag").value_or("");
  EXPECT_EQ(put("if-none-match", "*"), 412);
  EXPECT_EQ(put("if-match", "\"0123456789abcdef0123456789abcdef\""), 412);
  EXPECT_EQ(put("if-match", "0123456789abcdef0123456789abcdef"), 412);
  // Radosgw 16.2 wants the bare ETag (the quoted one is refused, the reason
  // for the lease's fallback); either way one spelling works.
  int quoted = put("if-match", s3::if_match_value(etag, true));
  if (quoted == 412) {
    EXPECT_EQ(put("if-match", s3::if_match_value(etag, false)), 200);
  }
  EXPECT_EQ(s->get("cond"), "two");
  EXPECT_EQ(put("if-none-match", "*"), 412);
}

TEST_F(S3Storage, GcAndTheNextOpenLeaveNoMultipartUploadEvenUnderALapsedLease) {
  // A writer killed mid-upload under a lease that then lapsed.
  pid_t pid = ::fork();
  if (pid == 0) {
    auto child = open_storage(uri);
    auto w = child->open_writer("exp/checkpoint_000000/model.bin");
    w->append(as_bytes(random_bytes(700'000, 3)));
    ::raise(SIGKILL);
  }
  ::waitpid(pid, nullptr, 0);
  s->put("exp/.cairn.lock", foreign_lease(0));
  ASSERT_EQ(multipart_uploads(uri, "exp/").size(), 1u);
  GcReport report = collect_garbage(uri + "/exp");
  EXPECT_TRUE(report.skipped.empty()) << report.skipped.front();
  EXPECT_TRUE(multipart_uploads(uri, "exp/").empty());
  EXPECT_TRUE(s->list_incomplete("").empty());
  // The same left for the next open of the experiment to clean up.
  pid = ::fork();
  if (pid == 0) {
    auto child = open_storage(uri);
    auto w = child->open_writer("exp/checkpoint_000001/model.bin");
    w->append(as_bytes(random_bytes(700'000, 4)));
    ::raise(SIGKILL);
  }
  ::waitpid(pid, nullptr, 0);
  s->put("exp/.cairn.lock", foreign_lease(0));
  ASSERT_EQ(multipart_uploads(uri, "exp/").size(), 1u);
  { CheckpointManager reopened(uri + "/exp", CheckpointConfig{}); }
  EXPECT_TRUE(multipart_uploads(uri, "exp/").empty());
}

TEST_F(S3Storage, BucketNamesTheServerCannotHaveAreRefusedAndMissingOnesNamed) {
  for (std::string bad : {"s3://ab/p", "s3://Upper-Case/p", "s3://has space/p"}) {
    EXPECT_EQ(code_of([&] { open_storage(bad); }), ErrorCode::kInvalidArgument) << bad;
  }
  auto missing = open_storage("s3://cairn-no-such-bucket-anywhere/p");
  std::string message = error_message_of([&] { missing->get("k"); }, ErrorCode::kNotFound);
  EXPECT_NE(message.find("cairn-no-such-bucket-anywhere"), std::string::npos) << message;
}

// The holder's heartbeat renews its lease every third of a lifetime (6 s in
// the tests) on the lease clock, which the test moves by hand: four periods,
// more than a lifetime, each answered by a renewal of the same lease (same
// holder, same token) while a taker is refused. No step depends on how fast
// the machine is: each waits (at most 60 s) for the renewal it caused.
TEST_F(S3Storage, AHeldLeaseIsRenewedPastItsLifetime) {
  auto now = std::make_shared<std::atomic<int64_t>>(1000);
  s3::set_lease_clock_for_testing(
      [now] { return std::chrono::steady_clock::time_point(std::chrono::seconds(now->load())); });
  auto lock = s->try_lock("exp/.cairn.lock");
  const std::string lease = s->get("exp/.cairn.lock");
  // The clock stands still: no renewal, however long the machine takes.
  const uint64_t before = s3::lease_renewals();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_EQ(s3::lease_renewals(), before);
  for (int period = 1; period <= 4; ++period) {
    *now += 2;  // a third of the lifetime
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (s3::lease_renewals() < before + static_cast<uint64_t>(period) &&
           std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_EQ(s3::lease_renewals(), before + static_cast<uint64_t>(period))
        << "no renewal for period " << period << " within 60 s";
    EXPECT_EQ(s->get("exp/.cairn.lock"), lease);  // the same holder, the same token
    EXPECT_TRUE(s->is_locked("exp/.cairn.lock"));
    EXPECT_EQ(code_of([&] { open_storage(uri)->try_lock("exp/.cairn.lock"); }), ErrorCode::kLocked);
  }
}

// Servers that take If-Match / If-None-Match and ignore them are
// declared with CAIRN_S3_CONDITIONAL_WRITES=off: leases are then taken by
// listing the takers (docs/s3.md), which lets only one of several racing
// takers hold a lease, on any server.
TEST_F(S3Storage, WithoutConditionalWritesRacingTakersOfALapsedLeaseYieldOneHolder) {
  ScopedEnv off("CAIRN_S3_CONDITIONAL_WRITES", "off");
  int taken = 0;
  for (int round = 0; round < 8; ++round) {
    int holders = race_for_lapsed_lease(uri, fmt::format("race{}/.cairn.lock", round), 5);
    EXPECT_LE(holders, 1) << "round " << round;
    taken += holders;
  }
  EXPECT_GE(taken, 1);
  // Every lease was released, and no taker left its object behind.
  EXPECT_TRUE(raw_keys(uri, "").empty()) << raw_keys(uri, "").front();
}

TEST_F(S3Storage, WithoutConditionalWritesALeaseIsTakenHeldAndReleasedAsWithThem) {
  ScopedEnv off("CAIRN_S3_CONDITIONAL_WRITES", "off");
  auto plain = open_storage(uri);
  {
    auto lock = plain->try_lock("exp/.cairn.lock");
    EXPECT_TRUE(s->is_locked("exp/.cairn.lock"));
    EXPECT_EQ(code_of([&] { open_storage(uri)->try_lock("exp/.cairn.lock"); }), ErrorCode::kLocked);
    plain->put("exp/manifest.json", "written under the lease");
  }
  EXPECT_FALSE(s->exists("exp/.cairn.lock"));
  EXPECT_EQ(raw_keys(uri, ""), std::vector<std::string>{bucket_key(uri, "exp/manifest.json")});
}

// Without conditional writes a holder cannot confirm a lease it has not
// renewed for half its lifetime (a taker may be writing it right now): it
// stops writing, and leaves the lease for whoever took it.
TEST_F(S3Storage, WithoutConditionalWritesAHolderPausedPastHalfItsLeaseStopsWriting) {
  ScopedEnv off("CAIRN_S3_CONDITIONAL_WRITES", "off");
  auto now = std::make_shared<std::atomic<int64_t>>(0);
  s3::set_lease_clock_for_testing(
      [now] { return std::chrono::steady_clock::time_point(std::chrono::seconds(now->load())); });
  auto holder = open_storage(uri);
  auto lock = holder->try_lock("exp/.cairn.lock");
  holder->put("exp/a.bin", "before the pause");
  *now += 4;  // the tests' lease lives 6 s
  std::string message =
      error_message_of([&] { holder->put("exp/b.bin", "after"); }, ErrorCode::kLocked);
  EXPECT_NE(message.find("half its lifetime"), std::string::npos) << message;
  EXPECT_NE(message.find(uri + "/exp/.cairn.lock"), std::string::npos) << message;
  EXPECT_FALSE(s->exists("exp/b.bin"));
  lock.reset();
  // Not deleted on release: it may be another taker's by now.
  EXPECT_TRUE(s->exists("exp/.cairn.lock"));
}

// A taker killed between writing its object and withdrawing it holds the
// lease back for one lifetime (the server's clock), not for good.
TEST_F(S3Storage, WithoutConditionalWritesATakerKilledMidwayHoldsTheLeaseBackForOneLifetime) {
  ScopedEnv off("CAIRN_S3_CONDITIONAL_WRITES", "off");
  const std::string dead = "exp/..cairn.lock.cairn-taker-killed";
  s->put(dead, foreign_lease(3));
  {
    // A lifetime far longer than the test: however slow the server, the
    // leftover is a rival for as long as the taker tries.
    ScopedEnv ttl("CAIRN_S3_LOCK_TTL", "600");
    std::string message = error_message_of([&] { open_storage(uri)->try_lock("exp/.cairn.lock"); },
                                           ErrorCode::kLocked);
    EXPECT_NE(message.find("taking it over"), std::string::npos) << message;
  }
  EXPECT_TRUE(s->list("exp").empty());  // takers' objects are not listed
  // With a lifetime of 2 s the leftover is stale once 3 s older than the
  // taker's own object (server times, whole seconds). The taker's clock is
  // stopped, so a slow server cannot make it give up for taking too long.
  std::this_thread::sleep_for(std::chrono::seconds(4));
  s3::set_lease_clock_for_testing([] { return std::chrono::steady_clock::time_point(); });
  ScopedEnv ttl("CAIRN_S3_LOCK_TTL", "2");
  EXPECT_NO_THROW(open_storage(uri)->try_lock("exp/.cairn.lock"));
  EXPECT_TRUE(raw_keys(uri, "").empty()) << raw_keys(uri, "").front();
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
