// S3Client's request loop with a scripted HTTP client: retries, credential
// re-reads on ExpiredToken, error mapping and addressing.
#include <gtest/gtest.h>

#include <map>

#include <deque>
#include <mutex>

#include "cairn/error.h"
#include "storage/s3/client.h"

namespace cairn::s3 {
namespace {

class ScriptedHttp final : public HttpClient {
 public:
  std::deque<HttpResponse> replies;
  std::vector<HttpRequest> seen;
  HttpResponse send(const HttpRequest& r) override {
    std::lock_guard<std::mutex> g(mu);
    seen.push_back(r);
    if (replies.empty()) throw Error(ErrorCode::kUnavailable, "no scripted reply", true);
    HttpResponse out = replies.front();
    replies.pop_front();
    if (out.status == 0) throw Error(ErrorCode::kUnavailable, r.url + ": connection reset", true);
    return out;
  }
  std::mutex mu;
};

class CountingCredentials final : public CredentialsProvider {
 public:
  int gets = 0, refreshes = 0;
  Credentials get() override {
    ++gets;
    return {"AKID" + std::to_string(refreshes), "secret", "", std::nullopt, "test"};
  }
  Credentials refresh() override {
    ++refreshes;
    return get();
  }
};

HttpResponse reply(int status, std::string body = "", Headers headers = {}) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  r.headers = std::move(headers);
  return r;
}

std::string error_xml(const std::string& code) {
  return "<Error><Code>" + code + "</Code><Message>m</Message><RequestId>RID</RequestId></Error>";
}

struct Fixture {
  explicit Fixture(bool custom = true, S3Settings::Addressing a = S3Settings::Addressing::kAuto) {
    S3Settings s;
    s.region = "us-east-1";
    s.custom_endpoint = custom;
    s.endpoint = custom ? "http://127.0.0.1:9000" : "https://s3.us-east-1.amazonaws.com";
    s.addressing = a;
    S3Options o;
    o.retry.base = std::chrono::milliseconds(1);
    o.retry.max_attempts = 3;
    client = std::make_unique<S3Client>(s, creds, http, o);
  }
  std::shared_ptr<ScriptedHttp> http = std::make_shared<ScriptedHttp>();
  std::shared_ptr<CountingCredentials> creds = std::make_shared<CountingCredentials>();
  std::unique_ptr<S3Client> client;
};

std::string header_of(const HttpRequest& r, const std::string& name) {
  for (const auto& [k, v] : r.headers)
    if (k == name) return v;
  return "";
}

TEST(S3Client, ExpiredTokenReReadsCredentialsOnceAndRepeatsTheRequest) {
  Fixture f;
  f.http->replies = {reply(400, error_xml("ExpiredToken")), reply(200)};
  S3Request r;
  r.key = "k";
  f.client->call("b", r);
  EXPECT_EQ(f.creds->refreshes, 1);
  ASSERT_EQ(f.http->seen.size(), 2u);
  EXPECT_NE(header_of(f.http->seen[1], "authorization").find("Credential=AKID1/"),
            std::string::npos);
}

// Temporary credentials (a session token), counting refreshes.
class TemporaryCredentials final : public CredentialsProvider {
 public:
  int refreshes = 0;
  Credentials get() override {
    return {"ASIA" + std::to_string(refreshes), "secret", "token", std::nullopt, "test"};
  }
  Credentials refresh() override {
    ++refreshes;
    return get();
  }
};

// S3 answers a HEAD without a body, so an expired session token is a bare
// 400 or 403 there: it is refreshed and the HEAD repeated once, as for the
// other requests (it used to fail at once, as a usage error for a 400).
TEST(S3Client, ABareHeadDenialWithTemporaryCredentialsRefreshesThemAndRepeatsOnce) {
  for (int status : {400, 403}) {
    Fixture f;
    auto creds = std::make_shared<TemporaryCredentials>();
    S3Settings s;
    s.region = "us-east-1";
    s.custom_endpoint = true;
    s.endpoint = "http://127.0.0.1:9000";
    S3Options o;
    o.retry.base = std::chrono::milliseconds(1);
    S3Client client(s, creds, f.http, o);
    f.http->replies = {reply(status), reply(200)};
    S3Request r;
    r.method = "HEAD";
    r.key = "k";
    EXPECT_EQ(client.call("b", r).status, 200) << status;
    EXPECT_EQ(creds->refreshes, 1) << status;
    ASSERT_EQ(f.http->seen.size(), 2u) << status;
    EXPECT_NE(header_of(f.http->seen[1], "authorization").find("Credential=ASIA1/"),
              std::string::npos);

    // A denial that stays is reported after that one repeat.
    f.http->seen.clear();
    f.http->replies = {reply(status), reply(status)};
    EXPECT_THROW(client.call("b", r), Error);
    EXPECT_EQ(creds->refreshes, 2) << status;
    EXPECT_EQ(f.http->seen.size(), 2u) << status;
  }
}

// Long-term keys do not expire: a bare 403 on a HEAD is a denial, not retried.
TEST(S3Client, ABareHeadDenialWithLongTermKeysIsNotRetried) {
  Fixture f;
  f.http->replies = {reply(403)};
  S3Request r;
  r.method = "HEAD";
  r.key = "k";
  try {
    f.client->call("b", r);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kPermissionDenied);
  }
  EXPECT_EQ(f.creds->refreshes, 0);
  EXPECT_EQ(f.http->seen.size(), 1u);
}

TEST(S3Client, ASecondExpiredTokenIsNotRetriedForever) {
  Fixture f;
  f.http->replies = {reply(400, error_xml("ExpiredToken")), reply(400, error_xml("ExpiredToken"))};
  S3Request r;
  r.key = "k";
  EXPECT_THROW(f.client->call("b", r), Error);
  EXPECT_EQ(f.creds->refreshes, 1);
  EXPECT_EQ(f.http->seen.size(), 2u);
}

TEST(S3Client, ThrottlingAndResetsAreRetriedThenSucceed) {
  Fixture f;
  f.http->replies = {reply(503, error_xml("SlowDown")), reply(0), reply(200, "ok")};
  S3Request r;
  r.key = "k";
  EXPECT_EQ(f.client->call("b", r).body, "ok");
  EXPECT_EQ(f.http->seen.size(), 3u);
}

TEST(S3Client, ExhaustedRetriesNameObjectStatusCodeRequestIdAndAttempts) {
  Fixture f;
  for (int i = 0; i < 3; ++i) f.http->replies.push_back(reply(503, error_xml("SlowDown")));
  S3Request r;
  r.method = "PUT";
  r.key = "exp/a.bin";
  try {
    f.client->call("bucket", r);
    FAIL();
  } catch (const Error& e) {
    std::string w = e.what();
    EXPECT_TRUE(e.retryable());
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable);
    for (const char* part :
         {"s3://bucket/exp/a.bin", "PUT", "HTTP 503", "SlowDown", "RID", "3 attempts"}) {
      EXPECT_NE(w.find(part), std::string::npos) << part << " in " << w;
    }
  }
}

TEST(S3Client, ForbiddenAndMissingAreNotRetried) {
  Fixture f;
  f.http->replies = {reply(403, error_xml("AccessDenied"))};
  S3Request r;
  r.key = "k";
  try {
    f.client->call("b", r);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kPermissionDenied);
    EXPECT_FALSE(e.retryable());
  }
  EXPECT_EQ(f.http->seen.size(), 1u);
  f.http->replies = {reply(404, error_xml("NoSuchBucket"))};
  try {
    f.client->call("b", r);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    EXPECT_NE(std::string(e.what()).find("bucket does not exist"), std::string::npos);
  }
}

TEST(S3Client, AWrongRegionIsReportedWithTheBucketsRegion) {
  Fixture f;
  f.http->replies = {
      reply(301, error_xml("PermanentRedirect"), {{"x-amz-bucket-region", "eu-west-1"}})};
  S3Request r;
  r.key = "k";
  try {
    f.client->call("b", r);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("AWS_REGION=eu-west-1"), std::string::npos) << e.what();
  }
}

TEST(S3Client, AddressingIsVirtualOnAwsAndPathStyleOnCustomEndpoints) {
  Fixture aws(/*custom=*/false);
  aws.http->replies = {reply(200), reply(200)};
  S3Request r;
  r.key = "dir/a b+c";
  r.query = {{"partNumber", "1"}, {"uploadId", "u/1"}};
  aws.client->call("my-bucket", r);
  EXPECT_EQ(
      aws.http->seen[0].url,
      "https://my-bucket.s3.us-east-1.amazonaws.com/dir/a%20b%2Bc?partNumber=1&uploadId=u%2F1");
  aws.client->call("dotted.bucket", r);  // not a DNS label: path-style
  EXPECT_EQ(aws.http->seen[1].url.rfind("https://s3.us-east-1.amazonaws.com/dotted.bucket/dir/", 0),
            0u);
  Fixture local(/*custom=*/true);
  local.http->replies = {reply(200)};
  local.client->call("my-bucket", r);
  EXPECT_EQ(local.http->seen[0].url.rfind("http://127.0.0.1:9000/my-bucket/dir/a%20b%2Bc?", 0), 0u);
  Fixture forced(/*custom=*/true, S3Settings::Addressing::kVirtual);
  forced.http->replies = {reply(200)};
  forced.client->call("my-bucket", r);
  EXPECT_EQ(forced.http->seen[0].url.rfind("http://my-bucket.127.0.0.1:9000/dir/", 0), 0u);
}

TEST(S3Client, BadTunablesAreRefusedNamingTheVariable) {
  AwsEnvironment env;
  env.getenv = [](std::string_view name) -> std::optional<std::string> {
    if (name == "CAIRN_S3_PART_SIZE") return "12x";
    return std::nullopt;
  };
  try {
    S3Options::from_environment(env);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("CAIRN_S3_PART_SIZE"), std::string::npos);
  }
}

// S3 refuses parts below 5 MiB (but the last) with 400 EntityTooSmall only
// once an upload is under way; the setting is refused before any request.
// The options from an environment holding only `vars`.
S3Options options_with(const std::map<std::string, std::string>& vars) {
  AwsEnvironment env;
  env.getenv = [vars](std::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
  return S3Options::from_environment(env);
}

TEST(S3Client, PartSizesOutsideS3sLimitsAreRefusedNamingTheSetting) {
  for (std::string bad : {"4096", "5242879", "5368709121"}) {
    try {
      options_with({{"CAIRN_S3_PART_SIZE", bad}});
      FAIL() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("CAIRN_S3_PART_SIZE=" + bad), std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(options_with({{"CAIRN_S3_PART_SIZE", "5242880"}}).part_size, 5242880u);
  EXPECT_EQ(options_with({{"CAIRN_S3_PART_SIZE", "5368709120"}}).part_size, 5368709120u);
  // A server configured for smaller parts (the tests' servers) is declared.
  EXPECT_EQ(options_with({{"CAIRN_S3_PART_SIZE", "262144"}, {"CAIRN_S3_MIN_PART_SIZE", "262144"}})
                .part_size,
            262144u);
  EXPECT_THROW(options_with({{"CAIRN_S3_PART_SIZE", "262144"}, {"CAIRN_S3_MIN_PART_SIZE", "1024"}}),
               Error);
}

TEST(S3Client, ConditionalWritesAreOnUnlessTurnedOffAndOtherValuesAreRefused) {
  EXPECT_TRUE(options_with({}).conditional_writes);
  EXPECT_FALSE(options_with({{"CAIRN_S3_CONDITIONAL_WRITES", "off"}}).conditional_writes);
  EXPECT_TRUE(options_with({{"CAIRN_S3_CONDITIONAL_WRITES", "on"}}).conditional_writes);
  try {
    options_with({{"CAIRN_S3_CONDITIONAL_WRITES", "maybe"}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("CAIRN_S3_CONDITIONAL_WRITES=\"maybe\""),
              std::string::npos)
        << e.what();
  }
}

TEST(S3Client, KeyPrefixesAreOneUnlessSetAndOutOfRangeCountsAreRefusedNamingTheVariable) {
  EXPECT_EQ(options_with({}).prefixes, 1u);
  EXPECT_EQ(options_with({{"CAIRN_S3_PREFIXES", "16"}}).prefixes, 16u);
  for (const char* bad : {"0", "4097", "-3", "many"}) {
    try {
      options_with({{"CAIRN_S3_PREFIXES", bad}});
      FAIL() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << bad;
      EXPECT_NE(std::string(e.what()).find("CAIRN_S3_PREFIXES"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace cairn::s3
