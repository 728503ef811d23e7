// AWS Signature Version 4 (SigV4), the request signing that S3 and every
// other AWS service expects, as pure functions: the caller passes the clock
// reading, so a signature is a function of its inputs alone and can be checked
// against AWS's published examples.
//
// Signing, in the order the spec describes it:
//   1. canonical_request(): method, canonical URI, canonical query string,
//      canonical headers, signed-header list and payload hash, one per line;
//   2. string_to_sign(): the algorithm, the request time, the credential
//      scope (date/region/service/aws4_request) and the canonical request's
//      SHA-256;
//   3. signing_key(): HMAC-SHA256 chained over the date, region, service and
//      "aws4_request", keyed by "AWS4" + the secret key;
//   4. the signature: HMAC-SHA256 of the string to sign under that key, which
//      sign_request() puts in an Authorization header.
//
// Thread-safety: every function here is pure and may be called from any
// thread. Failure: arguments that break a documented precondition (no host
// header, a header that sign_request() adds itself) throw std::invalid_argument;
// these are bugs in the caller, not conditions to handle. Nothing here does I/O.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "storage/s3/http.h"

struct evp_md_ctx_st;  // OpenSSL's EVP_MD_CTX, kept out of this header

namespace cairn::s3 {

// AWS credentials. Whoever formats a Credentials for people (logs, error
// messages) shows `source` and at most `access_key_id`, never the secret or
// the session token.
struct Credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // empty for long-term keys
  // When temporary credentials stop working; empty for long-term keys.
  std::optional<std::chrono::system_clock::time_point> expiration;
  // Where they came from, for messages: "environment", "profile dev in
  // /root/.aws/credentials", "EC2 instance metadata", ...
  std::string source;
};

struct SigningRequest {
  std::string_view method;  // "GET"
  // The canonical URI, already percent-encoded by the caller ("/bucket/a%20b")
  // and used as is. S3 wants each key byte encoded once
  // ("/" + uri_encode(key, false)); other services want the encoded path
  // encoded a second time.
  std::string_view path;
  // Raw (not encoded) query names and values, in any order; a name without a
  // value ("?uploads") has an empty value.
  std::vector<std::pair<std::string, std::string>> query;
  // Every header to sign, names in any case; must include "host". A name that
  // appears more than once is signed as one header with its values joined by
  // ',' in the order given.
  Headers headers;
  // Lowercase hex SHA-256 of the body, or "UNSIGNED-PAYLOAD".
  std::string_view payload_sha256;
};

// `s` percent-encoded the way SigV4 wants: RFC 3986 unreserved characters
// (A-Z a-z 0-9 - . _ ~) kept, every other byte as %XX with uppercase hex
// (so UTF-8 is encoded byte by byte); '/' kept unless `encode_slash`.
std::string uri_encode(std::string_view s, bool encode_slash);

// "name=value&..." with every name and value uri_encode()d (slashes too) and
// the pairs sorted by encoded name, then encoded value. The same string is a
// valid URL query, so the S3 backend builds its URLs with it.
std::string canonical_query_string(const std::vector<std::pair<std::string, std::string>>& query);

// The request's headers as SigV4 canonicalizes them: names lowercased, values
// trimmed with inner runs of whitespace collapsed to one space, sorted by
// name (stable, so repeated names keep their order), repeated names merged
// into one entry with values joined by ','.
Headers canonical_headers(const Headers& headers);

// The signed-header list: the canonical header names joined by ';'
// ("host;range;x-amz-date").
std::string signed_headers(const Headers& headers);

// The canonical request (step 1). Throws std::invalid_argument without a
// "host" header.
std::string canonical_request(const SigningRequest& r);

// `t` as SigV4's timestamp, ISO 8601 basic format in UTC: "20150830T123600Z".
std::string amz_date(std::chrono::system_clock::time_point t);

// The string to sign (step 2).
std::string string_to_sign(std::chrono::system_clock::time_point t, std::string_view region,
                           std::string_view service, std::string_view canonical_request);

// The signing key (step 3); `yyyymmdd` is the UTC date of the request.
std::array<unsigned char, 32> signing_key(std::string_view secret, std::string_view yyyymmdd,
                                          std::string_view region, std::string_view service);

// Signs `r` at time `now` and returns the headers to add to the request:
// x-amz-date, x-amz-content-sha256 (only when service == "s3"),
// x-amz-security-token (when `c` has a session token) and authorization, in
// that order. All of them but authorization are signed too. Throws
// std::invalid_argument when `r` has no host header, already carries one of
// the headers this adds, or `c` has no access key id or secret.
Headers sign_request(const SigningRequest& r, const Credentials& c, std::string_view region,
                     std::string_view service, std::chrono::system_clock::time_point now);

// Lowercase hex SHA-256 of `data`.
std::string sha256_hex(std::span<const std::byte> data);
std::string sha256_hex(std::string_view data);

// Base64 of the MD5 of `data`, the value of a Content-MD5 header.
std::string md5_base64(std::span<const std::byte> data);
std::string md5_base64(std::string_view data);

// The same over bytes fed in pieces, for bodies streamed from a source.
class Md5 {
 public:
  Md5();
  ~Md5();
  Md5(const Md5&) = delete;
  Md5& operator=(const Md5&) = delete;
  void update(std::span<const std::byte> data);
  // Base64 of the digest of everything fed; call once.
  std::string base64();

 private:
  ::evp_md_ctx_st* ctx_;  // OpenSSL's EVP_MD_CTX
};

// Lowercase hex of `bytes`.
std::string hex(std::span<const unsigned char> bytes);

}  // namespace cairn::s3
