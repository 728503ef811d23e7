// The default credentials chain with a scripted HTTP client, an injected
// clock and an injected process runner: order, caching and refresh,
// concurrency, and each source's protocol and failures.
#include "storage/s3/credentials.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <thread>

#include "storage/s3/aws_env_fake.h"
#include "support/errors.h"
#include "support/temp_dir.h"

namespace cairn::s3 {
namespace {

using cairn::testing::error_message_of;
using cairn::testing::TempDir;
using cairn::testing::write_text;
using std::chrono::hours;
using std::chrono::minutes;
using std::chrono::seconds;
using std::chrono::system_clock;
using testing::FakeWorld;
using testing::header_of;
using testing::respond;

bool contains(const std::string& s, std::string_view part) {
  return s.find(part) != std::string::npos;
}

std::string iso(system_clock::time_point t) {
  const auto secs = std::chrono::floor<seconds>(t);
  const auto day = std::chrono::floor<std::chrono::days>(secs);
  const std::chrono::year_month_day ymd(day);
  const std::chrono::hh_mm_ss hms(secs - day);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z", static_cast<int>(ymd.year()),
                     static_cast<unsigned>(ymd.month()), static_cast<unsigned>(ymd.day()),
                     hms.hours().count(), hms.minutes().count(), hms.seconds().count());
}

std::string creds_json(const std::string& key, system_clock::time_point expires,
                       const char* token_name = "Token") {
  return fmt::format(
      R"({{"Code": "Success", "AccessKeyId": "{}", "SecretAccessKey": "secret-{}", "{}": "token-{}", "Expiration": "{}"}})",
      key, key, token_name, key, iso(expires));
}

// An instance metadata service speaking IMDSv2: a token first, then the role
// listing and the role's credentials, each answer computed when asked.
struct FakeImds {
  std::string role = "cairn-role";
  std::function<std::string()> credentials;
  std::atomic<int> fetches{0};

  testing::FakeHttp::Handler handler(std::string endpoint = "http://169.254.169.254") {
    return [this, endpoint](const HttpRequest& r) {
      if (r.method == "PUT" && r.url == endpoint + "/latest/api/token") {
        if (header_of(r.headers, "X-aws-ec2-metadata-token-ttl-seconds") != "21600") {
          return respond(400, "");
        }
        return respond(200, "imds-token");
      }
      if (header_of(r.headers, "X-aws-ec2-metadata-token") != "imds-token") {
        return respond(401, "");
      }
      const std::string base = endpoint + "/latest/meta-data/iam/security-credentials/";
      if (r.method == "GET" && r.url == base) return respond(200, role + "\n");
      if (r.method == "GET" && r.url == base + role) {
        ++fetches;
        return respond(200, credentials());
      }
      return respond(404, "");
    };
  }
};

// A world with an empty HOME, so the files are absent unless a test writes them.
struct World : FakeWorld {
  TempDir home;
  World() { vars["HOME"] = home.str(); }
  void config(const std::string& text) { write_text(home / ".aws/config", text); }
  void credentials(const std::string& text) { write_text(home / ".aws/credentials", text); }
};

TEST(Credentials, TheChainIsTriedInBotocoresOrder) {
  World w;
  FakeImds imds;
  imds.credentials = [&] { return creds_json("IMDS", w.now + hours(6)); };
  w.http->set_handler([&](const HttpRequest& r) {
    if (r.url.starts_with("http://169.254.170.2")) {
      return respond(200, creds_json("CONTAINER", w.now + hours(6)));
    }
    return imds.handler()(r);
  });
  w.process = [&](const std::string&) {
    return std::string(R"({"Version": 1, "AccessKeyId": "PROCESS", "SecretAccessKey": "s"})");
  };
  w.vars["AWS_ACCESS_KEY_ID"] = "ENV";
  w.vars["AWS_SECRET_ACCESS_KEY"] = "env-secret";
  w.vars["AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"] = "/v2/credentials/abc";
  w.credentials("[default]\naws_access_key_id = CREDFILE\naws_secret_access_key = s\n");
  w.config(
      "[default]\naws_access_key_id = CONFIGFILE\naws_secret_access_key = s\n"
      "credential_process = /bin/get-creds --profile x\n");

  auto key = [&] { return default_credentials(w.env())->get().access_key_id; };
  EXPECT_EQ(key(), "ENV");
  EXPECT_EQ(default_credentials(w.env())->get().source, "environment");
  w.vars.erase("AWS_ACCESS_KEY_ID");
  w.vars.erase("AWS_SECRET_ACCESS_KEY");
  EXPECT_EQ(key(), "CREDFILE");
  EXPECT_EQ(default_credentials(w.env())->get().source,
            "profile default in " + (w.home / ".aws/credentials").string());
  w.credentials("[other]\n");
  EXPECT_EQ(key(), "CONFIGFILE");
  w.config("[default]\ncredential_process = /bin/get-creds --profile x\n");
  EXPECT_EQ(key(), "PROCESS");
  w.config("[default]\nregion = us-east-1\n");
  EXPECT_EQ(key(), "CONTAINER");
  w.vars.erase("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI");
  EXPECT_EQ(key(), "IMDS");
  EXPECT_EQ(default_credentials(w.env())->get().source,
            "EC2 instance metadata http://169.254.169.254 (role cairn-role)");
}

TEST(Credentials, NothingIsResolvedBeforeTheFirstGet) {
  World w;
  FakeImds imds;
  imds.credentials = [&] { return creds_json("K", w.now + hours(6)); };
  w.http->set_handler(imds.handler());
  auto p = default_credentials(w.env());
  EXPECT_EQ(w.http->count(), 0u);
  const Credentials c = p->get();
  EXPECT_EQ(c.access_key_id, "K");
  EXPECT_EQ(c.secret_access_key, "secret-K");
  EXPECT_EQ(c.session_token, "token-K");
  EXPECT_EQ(c.expiration, w.now + hours(6));
  EXPECT_EQ(w.http->count(), 3u) << "token, role listing, role credentials";
}

TEST(Credentials, EnvironmentTokenAndExpirationAreRead) {
  World w;
  w.vars["AWS_ACCESS_KEY_ID"] = "AKID";
  w.vars["AWS_SECRET_ACCESS_KEY"] = "S";
  w.vars["AWS_SESSION_TOKEN"] = "T";
  w.vars["AWS_CREDENTIAL_EXPIRATION"] = "2026-11-23T12:00:00Z";
  const Credentials c = default_credentials(w.env())->get();
  EXPECT_EQ(c.session_token, "T");
  EXPECT_EQ(c.expiration, parse_aws_time("2026-11-23T12:00:00+00:00"));
}

TEST(Credentials, AKeyIdWithoutASecretIsAnErrorNotAFallThrough) {
  World w;
  w.vars["AWS_ACCESS_KEY_ID"] = "AKID";
  w.credentials("[default]\naws_access_key_id = FILE\naws_secret_access_key = s\n");
  std::string msg = error_message_of([&] { default_credentials(w.env())->get(); },
                                     ErrorCode::kFailedPrecondition);
  EXPECT_TRUE(contains(msg, "AWS_SECRET_ACCESS_KEY is not")) << msg;

  w.vars.clear();
  w.vars["HOME"] = w.home.str();
  w.credentials("[default]\naws_secret_access_key = very-secret\n");
  msg = error_message_of([&] { default_credentials(w.env())->get(); },
                         ErrorCode::kFailedPrecondition);
  EXPECT_TRUE(contains(msg, "without aws_access_key_id")) << msg;
  EXPECT_FALSE(contains(msg, "very-secret")) << msg;
}

TEST(Credentials, NamedProfilesAndSessionTokensFromTheFiles) {
  World w;
  w.vars["AWS_PROFILE"] = "dev";
  w.credentials("[default]\naws_access_key_id = WRONG\naws_secret_access_key = s\n");
  w.config(
      "[profile dev]\naws_access_key_id = DEV\naws_secret_access_key = s\n"
      "aws_session_token = tok\n");
  const Credentials c = default_credentials(w.env())->get();
  EXPECT_EQ(c.access_key_id, "DEV");
  EXPECT_EQ(c.session_token, "tok");
  EXPECT_EQ(c.source, "profile dev in " + (w.home / ".aws/config").string());
}

TEST(Credentials, TemporaryCredentialsAreRefetchedFiveMinutesBeforeTheyExpire) {
  World w;
  FakeImds imds;
  const system_clock::time_point first_expiry = w.now + hours(1);
  int n = 0;
  imds.credentials = [&] {
    ++n;
    return creds_json(fmt::format("K{}", n), n == 1 ? first_expiry : first_expiry + hours(1));
  };
  w.http->set_handler(imds.handler());
  auto p = default_credentials(w.env());
  EXPECT_EQ(p->get().access_key_id, "K1");
  EXPECT_EQ(p->get().access_key_id, "K1");
  EXPECT_EQ(imds.fetches, 1);
  w.advance(minutes(54));  // 6 minutes left
  EXPECT_EQ(p->get().access_key_id, "K1");
  EXPECT_EQ(imds.fetches, 1);
  w.advance(minutes(2));  // 4 minutes left
  EXPECT_EQ(p->get().access_key_id, "K2");
  EXPECT_EQ(imds.fetches, 2);
  EXPECT_EQ(p->get().access_key_id, "K2");
  EXPECT_EQ(imds.fetches, 2);
}

TEST(Credentials, TheRefreshWindowIsConfigurable) {
  World w;
  FakeImds imds;
  imds.credentials = [&] { return creds_json("K", w.now + minutes(10)); };
  w.http->set_handler(imds.handler());
  CredentialsOptions options;
  options.refresh_window = seconds(30);
  auto p = default_credentials(w.env(), options);
  p->get();
  w.advance(minutes(9));
  p->get();
  EXPECT_EQ(imds.fetches, 1);
  w.advance(seconds(40));  // 20 s left
  p->get();
  EXPECT_EQ(imds.fetches, 2);
}

// A credential_process handing out credentials valid for 4 minutes, asked
// for them on each of 47 requests 10 s apart: the refresh window shrinks to a
// quarter of that lifetime, so the process runs once per 3 minutes, not per
// request (it used to run on every request: 4 minutes is inside the default
// 5-minute window).
TEST(Credentials, ShortLivedCredentialsAreRefetchedOncePerWindowNotPerRequest) {
  World w;
  int runs = 0;
  w.process = [&](const std::string&) {
    ++runs;
    return fmt::format(
        R"({{"Version": 1, "AccessKeyId": "P{}", "SecretAccessKey": "S", "SessionToken": "T",
            "Expiration": "{}"}})",
        runs, iso(w.now + minutes(4)));
  };
  w.config("[default]\ncredential_process = /bin/short-lived\n");
  auto p = default_credentials(w.env());
  for (int request = 0; request < 47; ++request) {
    const Credentials c = p->get();
    ASSERT_TRUE(c.expiration);
    EXPECT_GT(*c.expiration - w.now, minutes(1) - seconds(10))
        << "request " << request << " got credentials too close to their expiry";
    w.advance(seconds(10));
  }
  // 470 s of requests: the first fetch and one each time a minute is left.
  EXPECT_EQ(runs, 3);
}

// A source that answers every time with the same credentials, close to their
// expiry (a cache in front of it), is asked at most once per
// min_refetch_interval until they expire, not on every request.
TEST(Credentials, ASourceRepeatingNearlyExpiredCredentialsIsNotAskedPerRequest) {
  World w;
  int runs = 0;
  const system_clock::time_point expiry = w.now + minutes(2);
  w.process = [&](const std::string&) {
    ++runs;
    return fmt::format(
        R"({{"Version": 1, "AccessKeyId": "P", "SecretAccessKey": "S", "SessionToken": "T",
            "Expiration": "{}"}})",
        iso(expiry));
  };
  w.config("[default]\ncredential_process = /bin/cached\n");
  CredentialsOptions options;
  options.min_refetch_interval = seconds(10);
  auto p = default_credentials(w.env(), options);
  int requests = 0;
  while (w.now < expiry) {
    EXPECT_EQ(p->get().access_key_id, "P");
    ++requests;
    w.advance(seconds(1));
  }
  EXPECT_EQ(requests, 120);
  // The first fetch, then (inside the shrinking window) at most one per 10 s.
  EXPECT_LE(runs, 1 + 120 / 10);
  EXPECT_GE(runs, 2) << "it is asked again inside the window";
}

// While a renewal keeps failing, the cached (unexpired) credentials are used
// and the source is asked again once per interval, not per request.
TEST(Credentials, AFailingRenewalIsRetriedOncePerIntervalNotPerRequest) {
  World w;
  FakeImds imds;
  bool broken = false;
  imds.credentials = [&] { return broken ? std::string("{") : creds_json("K", w.now + hours(1)); };
  w.http->set_handler(imds.handler());
  CredentialsOptions options;
  options.min_refetch_interval = seconds(30);
  auto p = default_credentials(w.env(), options);
  EXPECT_EQ(p->get().access_key_id, "K");
  broken = true;
  w.advance(minutes(56));  // 4 minutes left: inside the window
  for (int i = 0; i < 60; ++i) {
    EXPECT_EQ(p->get().access_key_id, "K");
    w.advance(seconds(1));
  }
  EXPECT_EQ(imds.fetches, 1 + 2) << "the first fetch, then one per 30 s";
}

TEST(Credentials, LongTermKeysAreNeverRefetchedByGet) {
  World w;
  w.credentials("[default]\naws_access_key_id = A\naws_secret_access_key = s\n");
  auto p = default_credentials(w.env());
  EXPECT_EQ(p->get().access_key_id, "A");
  w.credentials("[default]\naws_access_key_id = B\naws_secret_access_key = s\n");
  w.advance(hours(24 * 365));
  EXPECT_EQ(p->get().access_key_id, "A");
  EXPECT_EQ(p->refresh().access_key_id, "B") << "refresh() re-reads the chain";
  EXPECT_EQ(p->get().access_key_id, "B");
}

TEST(Credentials, RefreshIgnoresTheCacheAndReResolves) {
  World w;
  FakeImds imds;
  int n = 0;
  imds.credentials = [&] { return creds_json(fmt::format("K{}", ++n), w.now + hours(6)); };
  w.http->set_handler(imds.handler());
  auto p = default_credentials(w.env());
  EXPECT_EQ(p->get().access_key_id, "K1");
  EXPECT_EQ(p->refresh().access_key_id, "K2");
  EXPECT_EQ(p->get().access_key_id, "K2");
  EXPECT_EQ(imds.fetches, 2);
}

TEST(Credentials, ConcurrentGetsShareOneFetch) {
  World w;
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::atomic<int> fetches{0};
  w.vars["AWS_CONTAINER_CREDENTIALS_FULL_URI"] = "http://127.0.0.1:1/creds";
  w.http->set_handler([&](const HttpRequest&) {
    ++fetches;
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return release; });
    return respond(200, creds_json("SHARED", w.now + hours(6)));
  });
  auto p = default_credentials(w.env());
  std::atomic<int> started{0};
  std::vector<std::string> keys(8);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      ++started;
      keys[static_cast<size_t>(i)] = p->get().access_key_id;
    });
  }
  while (started < 8 || fetches < 1) std::this_thread::yield();
  // Give the other seven time to block inside get(); should one arrive
  // later it finds the cache filled, so the count below is exact either way.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  {
    std::lock_guard lock(mu);
    release = true;
  }
  cv.notify_all();
  for (auto& t : threads) t.join();
  EXPECT_EQ(fetches, 1);
  for (const auto& k : keys) EXPECT_EQ(k, "SHARED");
}

TEST(Credentials, ConcurrentGetsShareOneFailureToo) {
  World w;
  std::atomic<int> fetches{0};
  std::atomic<bool> go{false};
  w.vars["AWS_CONTAINER_CREDENTIALS_FULL_URI"] = "http://127.0.0.1:1/creds";
  w.http->set_handler([&](const HttpRequest&) {
    ++fetches;
    while (!go) std::this_thread::yield();
    return respond(503, "");
  });
  auto p = default_credentials(w.env());
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      try {
        p->get();
      } catch (const Error& e) {
        if (e.code() == ErrorCode::kUnavailable && e.retryable()) ++failures;
      }
    });
  }
  while (fetches < 1) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  go = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures, 8);
  EXPECT_LE(fetches, 8);
  EXPECT_LT(fetches, 8) << "waiting callers should share the failed fetch";
}

TEST(Credentials, AFailedRenewalKeepsUsingUnexpiredCredentials) {
  World w;
  FakeImds imds;
  bool broken = false;
  imds.credentials = [&] {
    return broken ? std::string("{") : creds_json("K", w.now + minutes(10));
  };
  w.http->set_handler(imds.handler());
  auto p = default_credentials(w.env());
  EXPECT_EQ(p->get().access_key_id, "K");
  broken = true;
  w.advance(minutes(7));  // inside the refresh window, not yet expired
  EXPECT_EQ(p->get().access_key_id, "K");
  EXPECT_THROW(p->refresh(), Error) << "an explicit refresh reports the failure";
  w.advance(minutes(4));  // expired
  EXPECT_THROW(p->get(), Error);
}

TEST(Credentials, CredentialProcessOutputIsParsedAndValidated) {
  World w;
  std::string seen;
  std::string output;
  w.process = [&](const std::string& command) {
    seen = command;
    return output;
  };
  w.config("[default]\ncredential_process = /usr/bin/fetch-creds --role admin\n");
  output = fmt::format(
      R"({{"Version": 1, "AccessKeyId": "PK", "SecretAccessKey": "PS", "SessionToken": "PT",
          "Expiration": "{}"}})",
      iso(w.now + hours(1)));
  const Credentials c = default_credentials(w.env())->get();
  EXPECT_EQ(seen, "/usr/bin/fetch-creds --role admin");
  EXPECT_EQ(c.access_key_id, "PK");
  EXPECT_EQ(c.secret_access_key, "PS");
  EXPECT_EQ(c.session_token, "PT");
  EXPECT_EQ(c.expiration, w.now + hours(1));
  EXPECT_EQ(c.source, "credential_process of profile default");

  output = R"({"Version": 1, "AccessKeyId": "PK", "SecretAccessKey": "PS"})";
  EXPECT_FALSE(default_credentials(w.env())->get().expiration) << "long-term keys";

  struct Bad {
    std::string output;
    std::string_view why;
  };
  const std::vector<Bad> bad = {
      {R"({"Version": 1, "AccessKeyId": "PK", "SecretAccessKey": "top-secret-value)",
       "not valid JSON"},
      {R"({"Version": 2, "AccessKeyId": "PK", "SecretAccessKey": "top-secret-value"})",
       "Version is 2"},
      {R"({"AccessKeyId": "PK", "SecretAccessKey": "top-secret-value"})", "Version is missing"},
      {R"({"Version": 1, "AccessKeyId": "PK"})", "no SecretAccessKey"},
      {R"({"Version": 1, "AccessKeyId": "", "SecretAccessKey": "top-secret-value"})",
       "no AccessKeyId"},
      {R"({"Version": 1, "AccessKeyId": "PK", "SecretAccessKey": "top-secret-value",
           "Expiration": "tomorrow"})",
       "Expiration \"tomorrow\""},
      {R"(["top-secret-value"])", "not a JSON object"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.output);
    output = b.output;
    const std::string msg = error_message_of([&] { default_credentials(w.env())->get(); },
                                             ErrorCode::kFailedPrecondition);
    EXPECT_TRUE(contains(msg, "credential_process of profile default")) << msg;
    EXPECT_TRUE(contains(msg, b.why)) << msg;
    EXPECT_FALSE(contains(msg, "top-secret")) << msg;
  }
}

TEST(Credentials, AFailingCredentialProcessStopsTheChainWithItsError) {
  World w;
  w.config("[default]\ncredential_process = sh -c 'exit 7' --password hunter2\n");
  w.process = run_shell_command;
  const std::string msg = error_message_of([&] { default_credentials(w.env())->get(); },
                                           ErrorCode::kFailedPrecondition);
  EXPECT_TRUE(contains(msg, "credential_process of profile default")) << msg;
  EXPECT_TRUE(contains(msg, "status 7")) << msg;
  EXPECT_FALSE(contains(msg, "hunter2")) << msg;
  EXPECT_EQ(w.http->count(), 0u) << "no fall-through to instance metadata";
}

TEST(Credentials, ContainerCredentialsSendTheAuthorizationToken) {
  World w;
  std::vector<HttpRequest> seen;
  w.http->set_handler([&](const HttpRequest& r) {
    if (header_of(r.headers, "Authorization") != "Bearer abc") return respond(401, "");
    return respond(200, creds_json("C", w.now + hours(6)));
  });
  w.vars["AWS_CONTAINER_CREDENTIALS_FULL_URI"] = "http://localhost:8080/get";
  w.vars["AWS_CONTAINER_AUTHORIZATION_TOKEN"] = "Bearer abc";
  Credentials c = default_credentials(w.env())->get();
  EXPECT_EQ(c.access_key_id, "C");
  EXPECT_EQ(c.session_token, "token-C");
  EXPECT_EQ(c.source, "container credentials http://localhost:8080/get");
  EXPECT_EQ(w.http->requests().back().url, "http://localhost:8080/get");

  // The token file wins over the variable and is read on every fetch.
  write_text(w.home / "token", "Bearer abc\n");
  w.vars["AWS_CONTAINER_AUTHORIZATION_TOKEN"] = "Bearer wrong";
  w.vars["AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"] = (w.home / "token").string();
  EXPECT_EQ(default_credentials(w.env())->get().access_key_id, "C");
  write_text(w.home / "token", "Bearer rotated-and-secret");
  std::string msg =
      error_message_of([&] { default_credentials(w.env())->get(); }, ErrorCode::kPermissionDenied);
  EXPECT_TRUE(contains(msg, "HTTP 401")) << msg;
  EXPECT_FALSE(contains(msg, "rotated-and-secret")) << msg;
}

TEST(Credentials, ContainerRelativeUriGoesToTheEcsAgent) {
  World w;
  w.vars["AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"] = "/v2/credentials/xyz";
  w.http->set_handler([&](const HttpRequest& r) {
    return r.url == "http://169.254.170.2/v2/credentials/xyz"
               ? respond(200, creds_json("ECS", w.now + hours(6)))
               : respond(404, "");
  });
  EXPECT_EQ(default_credentials(w.env())->get().access_key_id, "ECS");
}

TEST(Credentials, ContainerFailuresAreErrorsOfTheirOwn) {
  World w;
  w.vars["AWS_CONTAINER_CREDENTIALS_FULL_URI"] = "http://metadata.example.com/creds";
  std::string msg =
      error_message_of([&] { default_credentials(w.env())->get(); }, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(contains(msg, "metadata.example.com")) << msg;

  w.vars["AWS_CONTAINER_CREDENTIALS_FULL_URI"] = "http://127.0.0.1:9/creds";
  w.http->set_handler([](const HttpRequest&) { return respond(500, ""); });
  try {
    default_credentials(w.env())->get();
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable);
    EXPECT_TRUE(e.retryable());
  }
  w.http->set_handler(nullptr);  // connection refused
  msg = error_message_of([&] { default_credentials(w.env())->get(); }, ErrorCode::kUnavailable);
  EXPECT_TRUE(contains(msg, "container credentials http://127.0.0.1:9/creds")) << msg;
}

TEST(Credentials, InstanceMetadataUsesTheImdsV2TokenFlowWithShortTimeouts) {
  World w;
  FakeImds imds;
  imds.credentials = [&] { return creds_json("V2", w.now + hours(6)); };
  w.vars["AWS_EC2_METADATA_SERVICE_ENDPOINT"] = "http://[fd00:ec2::254]/";
  w.http->set_handler(imds.handler("http://[fd00:ec2::254]"));
  EXPECT_EQ(default_credentials(w.env())->get().access_key_id, "V2");
  const auto reqs = w.http->requests();
  ASSERT_EQ(reqs.size(), 3u);
  EXPECT_EQ(reqs[0].method, "PUT");
  EXPECT_EQ(reqs[0].url, "http://[fd00:ec2::254]/latest/api/token");
  EXPECT_EQ(reqs[1].url, "http://[fd00:ec2::254]/latest/meta-data/iam/security-credentials/");
  EXPECT_EQ(reqs[2].url,
            "http://[fd00:ec2::254]/latest/meta-data/iam/security-credentials/cairn-role");
  for (const auto& r : reqs) {
    EXPECT_EQ(r.connect_timeout, std::chrono::seconds(1));
    EXPECT_LE(r.timeout, std::chrono::seconds(2));
  }
}

TEST(Credentials, InstanceMetadataProblemsAfterTheTokenAreErrors) {
  World w;
  FakeImds imds;
  imds.credentials = [] {
    return std::string(R"({"Code": "AssumeRoleUnauthorizedAccess", "AccessKeyId": "x"})");
  };
  w.http->set_handler(imds.handler());
  std::string msg = error_message_of([&] { default_credentials(w.env())->get(); },
                                     ErrorCode::kFailedPrecondition);
  EXPECT_TRUE(contains(msg, "AssumeRoleUnauthorizedAccess")) << msg;
  EXPECT_TRUE(contains(msg, "(role cairn-role)")) << msg;
}

TEST(Credentials, NothingFoundListsEveryPlaceLookedAt) {
  World w;
  w.config("[default]\nregion = eu-west-1\n");
  const std::string msg = error_message_of([&] { default_credentials(w.env())->get(); },
                                           ErrorCode::kFailedPrecondition);
  const std::vector<std::string> places = {
      "no AWS credentials found for profile \"default\": ",
      "environment: AWS_ACCESS_KEY_ID not set",
      "shared credentials file " + (w.home / ".aws/credentials").string() + ": no such file",
      "config file " + (w.home / ".aws/config").string() +
          ": profile default has no aws_access_key_id",
      "credential_process: not set in profile default",
      "container credentials: AWS_CONTAINER_CREDENTIALS_RELATIVE_URI and "
      "AWS_CONTAINER_CREDENTIALS_FULL_URI not set",
      "EC2 instance metadata http://169.254.169.254: PUT "
      "http://169.254.169.254/latest/api/token: connection refused",
  };
  size_t at = 0;
  for (const std::string& p : places) {
    const size_t found = msg.find(p, at);
    EXPECT_NE(found, std::string::npos) << "missing, or out of order: " << p << "\nin: " << msg;
    if (found != std::string::npos) at = found + p.size();
  }

  w.vars["AWS_EC2_METADATA_DISABLED"] = "TRUE";
  w.vars["AWS_PROFILE"] = "ghost";
  const size_t before = w.http->count();
  const std::string msg2 = error_message_of([&] { default_credentials(w.env())->get(); },
                                            ErrorCode::kFailedPrecondition);
  EXPECT_EQ(w.http->count(), before);
  EXPECT_TRUE(contains(msg2, "disabled by AWS_EC2_METADATA_DISABLED")) << msg2;
  EXPECT_TRUE(contains(msg2, ": no profile ghost")) << msg2;
}

TEST(Credentials, StaticCredentialsAreReturnedAsGiven) {
  auto p = static_credentials({"A", "S", "", std::nullopt, "test"});
  EXPECT_EQ(p->get().access_key_id, "A");
  EXPECT_EQ(p->refresh().secret_access_key, "S");
}

TEST(Credentials, AwsTimesAreIso8601) {
  const auto base = system_clock::from_time_t(1795435200);  // 2026-11-23T12:00:00Z
  EXPECT_EQ(parse_aws_time("2026-11-23T12:00:00Z"), base);
  EXPECT_EQ(parse_aws_time(" 2026-11-23T12:00:00z\n"), base);
  EXPECT_EQ(parse_aws_time("2026-11-23T12:00:00.250Z"), base + std::chrono::milliseconds(250));
  EXPECT_EQ(parse_aws_time("2026-11-23T14:30:00+02:30"), base);
  EXPECT_EQ(parse_aws_time("2026-11-23T07:00:00-0500"), base);
  EXPECT_EQ(parse_aws_time("2024-02-29T00:00:00Z"), system_clock::from_time_t(1709164800));
  for (const char* bad :
       {"", "2026-11-23", "2026-11-23T12:00:00", "2026-02-30T00:00:00Z", "2026-11-23T25:00:00Z",
        "2026-11-23T12:00:00Zjunk", "2026/11/23T12:00:00Z", "2026-11-23T12:00:00.Z",
        "2026-11-23T12:00:00+5"}) {
    EXPECT_FALSE(parse_aws_time(bad)) << bad;
  }
}

}  // namespace
}  // namespace cairn::s3
