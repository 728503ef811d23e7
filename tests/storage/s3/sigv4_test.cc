// SigV4 against AWS's published examples (the Signature Version 4 test suite
// and the S3 API reference's worked examples), and against botocore as an
// independent oracle on generated requests.
#include "storage/s3/sigv4.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "support/temp_dir.h"
#include "util/json.h"

namespace cairn::s3 {
namespace {

using std::chrono::system_clock;
using Query = std::vector<std::pair<std::string, std::string>>;

// 2015-08-30T12:36:00Z, the test suite's request time.
const system_clock::time_point kSuiteTime = system_clock::from_time_t(1440938160);
// 2013-05-24T00:00:00Z, the S3 examples' request time.
const system_clock::time_point kS3ExampleTime = system_clock::from_time_t(1369353600);
constexpr std::string_view kEmptySha256 =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

Credentials suite_credentials() {
  return {"AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "", std::nullopt, "test"};
}

Credentials s3_example_credentials() {
  return {"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "", std::nullopt,
          "test"};
}

std::string authorization(const Headers& added) {
  for (const auto& [name, value] : added) {
    if (name == "authorization") return value;
  }
  ADD_FAILURE() << "no authorization header";
  return "";
}

std::string signature_of(const Headers& added) {
  const std::string auth = authorization(added);
  const auto at = auth.rfind("Signature=");
  return at == std::string::npos ? "" : auth.substr(at + 10);
}

// One case of AWS's SigV4 test suite: service "service", region us-east-1,
// signed at kSuiteTime with suite_credentials().
struct SuiteCase {
  std::string name;
  std::string method;
  std::string path;
  Query query;
  Headers headers;  // besides host and x-amz-date
  std::string body;
  std::string signed_headers;
  std::string signature;
  std::string session_token;
};

std::vector<SuiteCase> suite_cases() {
  const std::string token =
      "AQoDYXdzEPT//////////"
      "wEXAMPLEtc764bNrC9SAPBSM22wDOk4x4HIZ8j4FZTwdQWLWsKWHGBuFqwAeMicRXmxfpSPfIe"
      "oIYRqTflfKD8YUuwthAx7mSEI/qkPpKPi/"
      "kMcGdQrmGdeehM4IC1NtBmUpp2wUE8phUZampKsburEDy0KPkyQDYwT7WZ0wq"
      "5VSXDvp75YU9HFvlRd8Tx6q6fE8YQcHNVXAkiY9q6d+xo0rKwT38xVqr7ZD0u0iPPkUL64lIZbqBAz+"
      "scqKmlzm8FDrypNC9"
      "Yjc8fPOLn9FX9KSYvKTr4rvx3iSIlTJabIQwj2ICCR/oLxBA==";
  return {
      {"get-vanilla",
       "GET",
       "/",
       {},
       {},
       "",
       "host;x-amz-date",
       "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
       ""},
      {"post-vanilla",
       "POST",
       "/",
       {},
       {},
       "",
       "host;x-amz-date",
       "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b",
       ""},
      {"get-vanilla-query-order-key-case",
       "GET",
       "/",
       {{"Param2", "value2"}, {"Param1", "value1"}},
       {},
       "",
       "host;x-amz-date",
       "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500",
       ""},
      {"get-vanilla-empty-query-key",
       "GET",
       "/",
       {{"Param1", "value1"}},
       {},
       "",
       "host;x-amz-date",
       "a67d582fa61cc504c4bae71f336f98b97f1ea3c7a6bfe1b6e45aec72011b9aeb",
       ""},
      {"get-vanilla-query-unreserved",
       "GET",
       "/",
       {{"-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
         "-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"}},
       {},
       "",
       "host;x-amz-date",
       "9c3e54bfcdf0b19771a7f523ee5669cdf59bc7cc0884027167c21bb143a40197",
       ""},
      {"get-vanilla-utf8-query",
       "GET",
       "/",
       {{"\xe1\x88\xb4", "bar"}},
       {},
       "",
       "host;x-amz-date",
       "2cdec8eed098649ff3a119c94853b13c643bcf08f8b0a1d91e12c9027818dd04",
       ""},
      {"post-vanilla-query",
       "POST",
       "/",
       {{"Param1", "value1"}},
       {},
       "",
       "host;x-amz-date",
       "28038455d6de14eafc1f9222cf5aa6f1a96197d7deb8263271d420d138af7f11",
       ""},
      {"post-vanilla-query-nonunreserved",
       "POST",
       "/",
       {{"@#$%^", ""}, {"+", "/,?><`\";:\\|][{}"}},
       {},
       "",
       "host;x-amz-date",
       "66c82657c86e26fb25238d0e69f011edc4c6df5ae71119d7cb98ed9b87393c1e",
       ""},
      {"get-unreserved",
       "GET",
       "/-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
       {},
       {},
       "",
       "host;x-amz-date",
       "07ef7494c76fa4850883e2b006601f940f8a34d404d0cfa977f52a65bbf5f24f",
       ""},
      {"get-utf8",
       "GET",
       "/%E1%88%B4",
       {},
       {},
       "",
       "host;x-amz-date",
       "8318018e0b0f223aa2bbf98705b62bb787dc9c0e678f255a891fd03141be5d85",
       ""},
      {"get-header-key-duplicate",
       "GET",
       "/",
       {},
       {{"My-Header1", "value2"}, {"My-Header1", "value2"}, {"My-Header1", "value1"}},
       "",
       "host;my-header1;x-amz-date",
       "c9d5ea9f3f72853aea855b47ea873832890dbdd183b4468f858259531a5138ea",
       ""},
      {"get-header-value-order",
       "GET",
       "/",
       {},
       {{"My-Header1", "value4"},
        {"My-Header1", "value1"},
        {"My-Header1", "value3"},
        {"My-Header1", "value2"}},
       "",
       "host;my-header1;x-amz-date",
       "08c7e5a9acfcfeb3ab6b2185e75ce8b1deb5e634ec47601a50643f830c755c01",
       ""},
      {"get-header-value-trim",
       "GET",
       "/",
       {},
       {{"My-Header1", " value1 "}, {"My-Header2", "\"a   b   c\""}},
       "",
       "host;my-header1;my-header2;x-amz-date",
       "acc3ed3afb60bb290fc8d2dd0098b9911fcaa05412b367055dee359757a9c736",
       ""},
      {"post-header-key-sort",
       "POST",
       "/",
       {},
       {{"My-Header1", "value1"}},
       "",
       "host;my-header1;x-amz-date",
       "c5410059b04c1ee005303aed430f6e6645f61f4dc9e1461ec8f8916fdf18852c",
       ""},
      {"post-header-value-case",
       "POST",
       "/",
       {},
       {{"My-Header1", "VALUE1"}},
       "",
       "host;my-header1;x-amz-date",
       "cdbc9802e29d2942e5e10b5bccfdd67c5f22c7c4e8ae67b53629efa58b974b7d",
       ""},
      {"post-x-www-form-urlencoded",
       "POST",
       "/",
       {},
       {{"Content-Type", "application/x-www-form-urlencoded"}},
       "Param1=value1",
       "content-type;host;x-amz-date",
       "ff11897932ad3f4e8b18135d722051e5ac45fc38421b1da7b9d196a0fe09473a",
       ""},
      {"post-x-www-form-urlencoded-parameters",
       "POST",
       "/",
       {},
       {{"Content-Type", "application/x-www-form-urlencoded; charset=utf8"}},
       "Param1=value1",
       "content-type;host;x-amz-date",
       "1a72ec8f64bd914b0e42e42607c7fbce7fb2c7465f63e3092b3b0d39fa77a6fe",
       ""},
      {"post-sts-header-before",
       "POST",
       "/",
       {},
       {},
       "",
       "host;x-amz-date;x-amz-security-token",
       "85d96828115b5dc0cfc3bd16ad9e210dd772bbebba041836c64533a82be05ead",
       token},
  };
}

TEST(Sigv4, MatchesEveryCaseOfTheAwsTestSuite) {
  for (const SuiteCase& c : suite_cases()) {
    SCOPED_TRACE(c.name);
    const std::string payload = sha256_hex(c.body);
    SigningRequest r{c.method, c.path, c.query, c.headers, payload};
    r.headers.insert(r.headers.begin(), {"Host", "example.amazonaws.com"});
    Credentials creds = suite_credentials();
    creds.session_token = c.session_token;
    const Headers added = sign_request(r, creds, "us-east-1", "service", kSuiteTime);
    EXPECT_EQ(authorization(added),
              fmt::format("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/"
                          "aws4_request, SignedHeaders={}, Signature={}",
                          c.signed_headers, c.signature));
  }
}

TEST(Sigv4, CanonicalRequestAndStringToSignMatchTheSuite) {
  SigningRequest r{"GET", "/", {{"Param2", "value2"}, {"Param1", "value1"}}, {}, kEmptySha256};
  r.headers = {{"Host", "example.amazonaws.com"}, {"X-Amz-Date", "20150830T123600Z"}};
  const std::string creq = canonical_request(r);
  EXPECT_EQ(creq,
            "GET\n/\nParam1=value1&Param2=value2\nhost:example.amazonaws.com\n"
            "x-amz-date:20150830T123600Z\n\nhost;x-amz-date\n" +
                std::string(kEmptySha256));
  EXPECT_EQ(string_to_sign(kSuiteTime, "us-east-1", "service", creq),
            "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n"
            "816cd5b414d056048ba4f7c5386d6e0533120fb1fcfa93762cf0fc39e2cf19e0");

  r.query.clear();
  EXPECT_EQ(sha256_hex(canonical_request(r)),
            "bb579772317eb040ac9ed261061d46c1f17a8133879d6129b6e1c25292927e63");
}

TEST(Sigv4, CanonicalHeadersTrimCollapseLowercaseAndMergeRepeats) {
  SigningRequest r{"GET", "/", {}, {}, kEmptySha256};
  r.headers = {{"My-Header2", "\"a   b   c\""},
               {"Host", "example.amazonaws.com"},
               {"My-Header1", "  value1  "},
               {"my-header1", "\tsecond\t value "}};
  EXPECT_EQ(canonical_request(r),
            "GET\n/\n\nhost:example.amazonaws.com\nmy-header1:value1,second value\n"
            "my-header2:\"a b c\"\n\nhost;my-header1;my-header2\n" +
                std::string(kEmptySha256));
  EXPECT_EQ(signed_headers(r.headers), "host;my-header1;my-header2");
}

TEST(Sigv4, SigningKeyMatchesTheDocumentedDerivation) {
  // The AWS General Reference's example: secret wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY,
  // 20120215, us-east-1, iam.
  EXPECT_EQ(
      hex(signing_key("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "20120215", "us-east-1", "iam")),
      "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d");
}

// The S3 API reference's examples ("Signature Calculations for the
// Authorization Header"), which sign x-amz-content-sha256 too.
TEST(Sigv4, MatchesTheS3GetObjectExampleWithARange) {
  SigningRequest r{"GET", "/test.txt", {}, {}, kEmptySha256};
  r.headers = {{"Host", "examplebucket.s3.amazonaws.com"}, {"Range", "bytes=0-9"}};
  const Headers added =
      sign_request(r, s3_example_credentials(), "us-east-1", "s3", kS3ExampleTime);
  EXPECT_EQ(authorization(added),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
            "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
            "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
  ASSERT_EQ(added.size(), 3u);
  EXPECT_EQ(added[0], (std::pair<std::string, std::string>{"x-amz-date", "20130524T000000Z"}));
  EXPECT_EQ(added[1], (std::pair<std::string, std::string>{"x-amz-content-sha256",
                                                           std::string(kEmptySha256)}));
}

TEST(Sigv4, MatchesTheS3PutObjectExample) {
  const std::string body = "Welcome to Amazon S3.";
  const std::string payload = sha256_hex(body);
  EXPECT_EQ(payload, "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
  const std::string path = "/" + uri_encode("test$file.text", false);
  EXPECT_EQ(path, "/test%24file.text");
  SigningRequest r{"PUT", path, {}, {}, payload};
  r.headers = {{"Host", "examplebucket.s3.amazonaws.com"},
               {"Date", "Fri, 24 May 2013 00:00:00 GMT"},
               {"x-amz-storage-class", "REDUCED_REDUNDANCY"}};
  const Headers added =
      sign_request(r, s3_example_credentials(), "us-east-1", "s3", kS3ExampleTime);
  EXPECT_EQ(authorization(added),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
            "SignedHeaders=date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class, "
            "Signature=98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");
}

TEST(Sigv4, MatchesTheS3ListObjectsAndLifecycleExamples) {
  SigningRequest list{"GET", "/", {{"prefix", "J"}, {"max-keys", "2"}}, {}, kEmptySha256};
  list.headers = {{"Host", "examplebucket.s3.amazonaws.com"}};
  EXPECT_EQ(canonical_query_string(list.query), "max-keys=2&prefix=J");
  EXPECT_EQ(
      signature_of(sign_request(list, s3_example_credentials(), "us-east-1", "s3", kS3ExampleTime)),
      "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");

  SigningRequest lifecycle{"GET", "/", {{"lifecycle", ""}}, {}, kEmptySha256};
  lifecycle.headers = {{"Host", "examplebucket.s3.amazonaws.com"}};
  EXPECT_EQ(signature_of(sign_request(lifecycle, s3_example_credentials(), "us-east-1", "s3",
                                      kS3ExampleTime)),
            "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");
}

TEST(Sigv4, ASessionTokenIsAddedAndSigned) {
  SigningRequest r{"GET", "/b/k", {}, {{"host", "s3.example"}}, "UNSIGNED-PAYLOAD"};
  Credentials c = s3_example_credentials();
  const std::string without = signature_of(sign_request(r, c, "eu-west-1", "s3", kSuiteTime));
  c.session_token = "FwoGZXIvYXdzE/token+with/slashes==";
  const Headers added = sign_request(r, c, "eu-west-1", "s3", kSuiteTime);
  ASSERT_EQ(added.size(), 4u);
  EXPECT_EQ(added[1].second, "UNSIGNED-PAYLOAD");
  EXPECT_EQ(added[2],
            (std::pair<std::string, std::string>{"x-amz-security-token", c.session_token}));
  EXPECT_NE(authorization(added).find("SignedHeaders=host;x-amz-content-sha256;x-amz-date;"
                                      "x-amz-security-token,"),
            std::string::npos)
      << authorization(added);
  EXPECT_NE(signature_of(added), without);
}

TEST(Sigv4, OnlyS3GetsAContentSha256Header) {
  SigningRequest r{"GET", "/", {}, {{"host", "sts.amazonaws.com"}}, kEmptySha256};
  const Headers added = sign_request(r, suite_credentials(), "us-east-1", "sts", kSuiteTime);
  ASSERT_EQ(added.size(), 2u);
  EXPECT_EQ(added[0].first, "x-amz-date");
  EXPECT_EQ(added[1].first, "authorization");
}

TEST(Sigv4, MisuseIsRefused) {
  SigningRequest no_host{"GET", "/", {}, {{"range", "bytes=0-1"}}, kEmptySha256};
  EXPECT_THROW(sign_request(no_host, suite_credentials(), "us-east-1", "s3", kSuiteTime),
               std::invalid_argument);
  EXPECT_THROW(canonical_request(no_host), std::invalid_argument);
  SigningRequest dated{"GET", "/", {}, {{"host", "h"}, {"X-Amz-Date", "x"}}, kEmptySha256};
  EXPECT_THROW(sign_request(dated, suite_credentials(), "us-east-1", "s3", kSuiteTime),
               std::invalid_argument);
  SigningRequest ok{"GET", "/", {}, {{"host", "h"}}, kEmptySha256};
  Credentials no_secret = suite_credentials();
  no_secret.secret_access_key.clear();
  EXPECT_THROW(sign_request(ok, no_secret, "us-east-1", "s3", kSuiteTime), std::invalid_argument);
}

TEST(Sigv4, UriEncodeKeepsOnlyUnreservedBytes) {
  EXPECT_EQ(uri_encode("a b+c/d~e", false), "a%20b%2Bc/d~e");
  EXPECT_EQ(uri_encode("a b+c/d~e", true), "a%20b%2Bc%2Fd~e");
  EXPECT_EQ(uri_encode("100%*!'()", true), "100%25%2A%21%27%28%29");
  EXPECT_EQ(uri_encode("\xd0\xba\xe2\x82\xac", true), "%D0%BA%E2%82%AC");
  EXPECT_EQ(uri_encode(std::string_view("\0\xff", 2), true), "%00%FF");
  EXPECT_EQ(uri_encode("AZaz09-._~", true), "AZaz09-._~");
}

TEST(Sigv4, CanonicalQuerySortsByEncodedNameThenValue) {
  // Sorting by raw names would put "a b" after "a+b"; encoded, %20 < %2B.
  EXPECT_EQ(canonical_query_string({{"b", "2"}, {"a+b", "x"}, {"a b", "y"}, {"b", "1"}, {"c", ""}}),
            "a%20b=y&a%2Bb=x&b=1&b=2&c=");
  EXPECT_EQ(canonical_query_string({}), "");
  EXPECT_EQ(canonical_query_string({{"prefix", "dir/sub dir/"}}), "prefix=dir%2Fsub%20dir%2F");
}

TEST(Sigv4, AmzDateIsUtcBasicFormat) {
  EXPECT_EQ(amz_date(kSuiteTime), "20150830T123600Z");
  EXPECT_EQ(amz_date(kSuiteTime + std::chrono::milliseconds(999)), "20150830T123600Z");
  EXPECT_EQ(amz_date(system_clock::from_time_t(951782400)), "20000229T000000Z");
  EXPECT_EQ(amz_date(system_clock::from_time_t(4102444799)), "20991231T235959Z");
}

TEST(Sigv4, DigestsMatchKnownValues) {
  EXPECT_EQ(sha256_hex(""), kEmptySha256);
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // RFC 1864's Content-MD5 of an empty body, and of "abc" (RFC 1321).
  EXPECT_EQ(md5_base64(""), "1B2M2Y8AsgTpgAmY7PhCfg==");
  EXPECT_EQ(md5_base64("abc"), "kAFQmDzST7DWlj99KOF/cg==");
  const std::byte raw[] = {std::byte{0x61}, std::byte{0x62}, std::byte{0x63}};
  EXPECT_EQ(sha256_hex(std::span<const std::byte>(raw)), sha256_hex("abc"));
  const unsigned char bytes[] = {0x00, 0x7f, 0xab, 0xff};
  EXPECT_EQ(hex(bytes), "007fabff");
}

// ---- botocore as an oracle ----

// Runs `command`, returning its exit status and standard output.
std::pair<int, std::string> run(const std::string& command) {
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) throw std::runtime_error("popen failed: " + command);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out.push_back(c);
    }
  }
  return out + "'";
}

// Random request parts with what breaks naive signers: spaces, '~', '+',
// '%', reserved characters, multi-byte UTF-8, repeated names.
class Generator {
 public:
  explicit Generator(uint32_t seed) : rng_(seed) {}

  size_t pick(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }
  bool chance(double p) { return std::bernoulli_distribution(p)(rng_); }

  std::string text(size_t max_len, bool allow_slash) {
    static const std::vector<std::string> kPieces = {
        "a", "Z", "0", "9",    "-", "_",    ".",          "~",         " ", "+", "%", "=",
        "&", "?", "#", "$",    "!", "*",    "'",          "(",         ")", ",", ";", ":",
        "@", "[", "]", "\"",   "<", ">",    "^",          "`",         "{", "}", "|", "\\",
        "é", "ß", "ሴ", "日本", "😀", "file", "checkpoint", "model.bin", "  "};
    std::string out;
    const size_t len = 1 + pick(max_len);
    for (size_t i = 0; i < len; ++i) {
      out += kPieces[pick(kPieces.size())];
      if (allow_slash && chance(0.1)) out += "/";
    }
    return out;
  }

  // A key whose path segments botocore does not normalize away: no empty,
  // "." or ".." segments.
  std::string key() {
    std::string out;
    const size_t segments = 1 + pick(3);
    for (size_t i = 0; i < segments; ++i) {
      if (i > 0) out += "/";
      std::string seg = text(6, false);
      if (seg == "." || seg == "..") seg += "x";
      out += seg;
    }
    return out;
  }

  std::string header_value() {
    static const std::vector<std::string> kPieces = {"a", "B", "7", " ",  "  ", "\t",  "-",  "=",
                                                     "/", ";", ",", "\"", ":",  "x y", "   "};
    std::string out;
    const size_t len = 1 + pick(8);
    for (size_t i = 0; i < len; ++i) out += kPieces[pick(kPieces.size())];
    // Not all whitespace: botocore and SigV4 agree there, but an empty
    // header value is not worth a case.
    return out + "v";
  }

  std::string token(size_t len, const std::string& alphabet) {
    std::string out;
    for (size_t i = 0; i < len; ++i) out.push_back(alphabet[pick(alphabet.size())]);
    return out;
  }

 private:
  std::mt19937 rng_;
};

std::string hex_of(const std::string& s) {
  return hex({reinterpret_cast<const unsigned char*>(s.data()), s.size()});
}

TEST(Sigv4, AgreesWithBotocoreOnGeneratedRequests) {
  const std::string python = CAIRN_TEST_PYTHON3;
  if (python.empty()) GTEST_SKIP() << "no python3 found at configure time";
  const auto [import_status, import_out] = run(shell_quote(python) + " -c 'import botocore' 2>&1");
  if (import_status != 0) {
    GTEST_SKIP() << python << " cannot import botocore (install python3-botocore): " << import_out;
  }

  struct Case {
    std::string method;
    Query query;
    Headers headers;
    std::string path;
    std::string payload;
    Credentials creds;
    std::string service;
    std::string region;
    system_clock::time_point when;
  };
  Generator gen(20261123);
  const std::vector<std::string> services = {"s3", "s3", "s3", "sts", "ec2", "execute-api"};
  const std::vector<std::string> regions = {"us-east-1", "eu-central-1", "ap-southeast-2",
                                            "us-gov-west-1"};
  const std::vector<std::string> methods = {"GET", "PUT", "POST", "DELETE", "HEAD"};
  const std::string alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  const int kCases = 300;
  std::vector<Case> cases(kCases);
  nlohmann::json specs = nlohmann::json::array();
  for (Case& c : cases) {
    c.service = services[gen.pick(services.size())];
    c.region = regions[gen.pick(regions.size())];
    c.when = system_clock::from_time_t(946684800 + static_cast<time_t>(gen.pick(3'000'000'000u)));
    c.creds.access_key_id = "AKIA" + gen.token(16, alnum);
    c.creds.secret_access_key = gen.token(40, alnum + "/+");
    if (gen.chance(0.4)) c.creds.session_token = gen.token(20 + gen.pick(300), alnum + "/+=");
    const std::string host = gen.chance(0.5) ? "bucket.s3.example.com" : "127.0.0.1:9000";
    // S3 signs each key byte encoded once; other services sign the
    // already-encoded path encoded again.
    const std::string encoded = "/" + uri_encode(gen.key(), false);
    c.path = c.service == "s3" ? encoded : uri_encode(encoded, false);
    Query query;
    const size_t nq = gen.pick(5);
    for (size_t i = 0; i < nq; ++i) {
      query.emplace_back(gen.chance(0.2) && !query.empty() ? query.back().first : gen.text(5, true),
                         gen.chance(0.2) ? "" : gen.text(8, true));
    }
    Headers headers = {{gen.chance(0.5) ? "Host" : "host", host}};
    const std::vector<std::string> names = {"Content-Type", "x-amz-meta-Owner", "X-AMZ-META-tag",
                                            "Range",        "If-None-Match",    "Content-MD5"};
    const size_t nh = gen.pick(4);
    for (size_t i = 0; i < nh; ++i) {
      headers.emplace_back(names[gen.pick(names.size())], gen.header_value());
    }
    const std::string body = gen.chance(0.5) ? "" : gen.text(40, true);
    const bool unsigned_payload = c.service == "s3" && gen.chance(0.3);
    c.payload = unsigned_payload ? "UNSIGNED-PAYLOAD" : sha256_hex(body);
    const std::string method = methods[gen.pick(methods.size())];
    c.method = method;
    c.query = query;
    c.headers = headers;

    nlohmann::json q = nlohmann::json::array();
    for (const auto& [n, v] : query) q.push_back({n, v});
    nlohmann::json h = nlohmann::json::array();
    for (const auto& [n, v] : headers) h.push_back({n, v});
    specs.push_back({{"method", method},
                     {"url", "https://" + host + encoded},
                     {"query", q},
                     {"headers", h},
                     {"body_hex", hex_of(body)},
                     {"unsigned_payload", unsigned_payload},
                     {"service", c.service},
                     {"region", c.region},
                     {"access_key", c.creds.access_key_id},
                     {"secret_key", c.creds.secret_access_key},
                     {"token", c.creds.session_token},
                     {"timestamp", amz_date(c.when)}});
  }
  cairn::testing::TempDir dir;
  cairn::testing::write_text(dir / "requests.json", specs.dump());
  const auto [status, out] =
      run(fmt::format("{} {} {}", shell_quote(python), shell_quote(CAIRN_SIGV4_ORACLE),
                      shell_quote((dir / "requests.json").string())));
  ASSERT_EQ(status, 0) << out;
  const nlohmann::json answers = parse_json(out, "sigv4_oracle.py output");
  ASSERT_EQ(answers.size(), cases.size());

  int mismatches = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const SigningRequest request{c.method, c.path, c.query, c.headers, c.payload};
    const Headers added = sign_request(request, c.creds, c.region, c.service, c.when);
    std::map<std::string, std::string> mine(added.begin(), added.end());
    const nlohmann::json& want = answers[i];
    for (const std::string name :
         {"authorization", "x-amz-date", "x-amz-content-sha256", "x-amz-security-token"}) {
      const std::string theirs = want[name].is_null() ? "" : want[name].get<std::string>();
      const std::string ours = mine.count(name) ? mine[name] : "";
      if (theirs != ours && ++mismatches <= 5) {
        ADD_FAILURE() << "request " << i << " " << specs[i].dump() << "\n"
                      << name << ": botocore " << theirs << "\n     cairn    " << ours
                      << "\ncanonical request:\n"
                      << canonical_request([&] {
                           SigningRequest full = request;
                           for (const auto& h : added) {
                             if (h.first != "authorization") full.headers.push_back(h);
                           }
                           return full;
                         }());
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

}  // namespace
}  // namespace cairn::s3
