// The S3 backend's leases (try_lock): what the read after writing a lease
// says. Pure, so the decision is tested without a server.
#pragma once

#include <string_view>

namespace cairn::s3 {

enum class LeaseReadBack {
  kOurs,            // the lease read back is the one just written
  kNotYetVisible,   // the server still shows what was there before the write
  kTakenByAnother,  // another holder's lease: a racing taker wrote last
};

// `read_exists`/`read_token`: the read after the write (the token is empty
// when the object was missing or could not be parsed, as when it is read
// mid-write); `ours`: the token just written; `replaced`: the token of the
// lapsed lease the write replaced (empty if there was none). Some servers
// answer a PUT before the object is readable (s3rver writes the file after
// answering), so a read showing no token, or the replaced lease, is read
// again before concluding anything; any other token is another holder's.
inline LeaseReadBack classify_lease_read_back(bool read_exists, std::string_view read_token,
                                              std::string_view ours, std::string_view replaced) {
  if (read_exists && read_token == ours) return LeaseReadBack::kOurs;
  if (!read_exists || read_token.empty() || read_token == replaced) {
    return LeaseReadBack::kNotYetVisible;
  }
  return LeaseReadBack::kTakenByAnother;
}

}  // namespace cairn::s3
