// Where S3 requests get their AWS credentials: the default provider chain
// every AWS tool uses, in botocore's order:
//
//   1. environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN
//      (and AWS_CREDENTIAL_EXPIRATION);
//   2. the shared credentials file's profile: aws_access_key_id,
//      aws_secret_access_key, aws_session_token;
//   3. the config file's profile, the same three settings;
//   4. the profile's credential_process (config file, or credentials file),
//      whose output is JSON {"Version": 1, "AccessKeyId", "SecretAccessKey",
//      "SessionToken"?, "Expiration"?};
//   5. container credentials: AWS_CONTAINER_CREDENTIALS_RELATIVE_URI against
//      http://169.254.170.2, else AWS_CONTAINER_CREDENTIALS_FULL_URI, with
//      AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE's contents (else
//      AWS_CONTAINER_AUTHORIZATION_TOKEN) as the Authorization header;
//   6. the EC2 instance metadata service, IMDSv2 only (a session token first;
//      IMDSv1 is not used): AWS_EC2_METADATA_SERVICE_ENDPOINT, else
//      http://169.254.169.254; AWS_EC2_METADATA_DISABLED=true skips it. One
//      attempt with short timeouts, so a machine without it fails fast.
//
// A place that is not configured is passed over and the next one tried. A
// place that is configured but broken stops the chain with its own error
// rather than silently falling through to a different identity: a key id
// without its secret, a failing or malformed credential_process, a container
// endpoint that refuses or answers garbage. When no place yields credentials
// the error is kFailedPrecondition (the machine is not set up for AWS, which
// no retry fixes), and its message lists every place looked at and why it
// gave nothing. No message or log line ever holds a secret key, a session
// token or an authorization token.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string_view>

#include "storage/s3/aws_config.h"
#include "storage/s3/sigv4.h"

namespace cairn::s3 {

class CredentialsProvider {
 public:
  virtual ~CredentialsProvider() = default;
  // Valid credentials, resolved lazily on the first call (opening storage
  // needs no network). Temporary credentials are re-fetched when they expire
  // within the refresh window: CredentialsOptions::refresh_window (5 minutes
  // by default), or a quarter of the lifetime they had when fetched if that
  // is shorter. While the cached ones have not expired, get() asks the chain
  // at most once per CredentialsOptions::min_refetch_interval, so a source
  // that answers with credentials about to expire (or fails) is not asked on
  // every request; should a re-fetch fail while the old ones have not
  // expired yet, the old ones are returned.
  // Thread-safe: concurrent callers share one fetch, and its failure.
  // Throws cairn::Error as described at the top of this file.
  virtual Credentials get() = 0;
  // After the server answered ExpiredToken / InvalidToken /
  // TokenRefreshRequired: re-resolves the chain once, ignoring any cached
  // value, and returns the result (callers arriving while a fetch is under way
  // share it). Thread-safe; throws as get() does.
  virtual Credentials refresh() = 0;
};

struct CredentialsOptions {
  // Temporary credentials that expire within this window are re-fetched; for
  // credentials that lived less than 4 windows when fetched, the window is a
  // quarter of that lifetime.
  std::chrono::seconds refresh_window{std::chrono::minutes(5)};
  // While cached credentials have not expired, get() re-fetches at most once
  // per this interval (refresh() after an expired-token answer always does).
  std::chrono::seconds min_refetch_interval{std::chrono::seconds(10)};
  // The instance metadata service: per-request connect and total timeouts.
  std::chrono::milliseconds metadata_connect_timeout{std::chrono::seconds(1)};
  std::chrono::milliseconds metadata_timeout{std::chrono::seconds(2)};
  // Container credentials: the whole request.
  std::chrono::milliseconds container_timeout{std::chrono::seconds(5)};
};

// The default chain, reading everything through `env`. Resolves nothing
// until the first get().
std::shared_ptr<CredentialsProvider> default_credentials(AwsEnvironment env,
                                                         CredentialsOptions options = {});

// Always `c` (for tests and explicitly configured keys); refresh() too.
std::shared_ptr<CredentialsProvider> static_credentials(Credentials c);

// "2026-11-23T12:00:00Z", also with fractional seconds or a "+hh:mm" /
// "-hh:mm" offset; nullopt when `s` is not such a time.
std::optional<std::chrono::system_clock::time_point> parse_aws_time(std::string_view s);

}  // namespace cairn::s3
