// The S3 backend's leases (try_lock): what the read after writing a lease
// says, how a conditional write spells the ETag, and when a write that
// depends on the lease must confirm it first. Pure (time is passed in or
// comes from an injectable clock), so the decisions are tested without a
// server.
#pragma once

#include <chrono>
#include <functional>
#include <string>
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

// An ETag as a server sends it ("abc", W/"abc") and as some servers want it
// back in If-Match (abc): the same tag. Radosgw (Ceph 16.2) answers 412 to
// `If-Match: "<etag>"` on a PUT and accepts only the bare value; AWS S3
// takes the quoted form that RFC 9110 specifies.
inline std::string_view bare_etag(std::string_view etag) {
  if (etag.starts_with("W/")) etag.remove_prefix(2);
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"') {
    etag = etag.substr(1, etag.size() - 2);
  }
  return etag;
}
inline bool same_etag(std::string_view a, std::string_view b) {
  return bare_etag(a) == bare_etag(b);
}
inline std::string if_match_value(std::string_view etag, bool quoted) {
  std::string bare(bare_etag(etag));
  return quoted ? "\"" + bare + "\"" : bare;
}

// How the server takes If-Match on a PUT, learned on first use.
enum class IfMatchForm { kUnknown, kQuoted, kBare, kUnsupported };

// The clock leases are measured with on the holder's side (steady, so a
// wall-clock step changes nothing). Tests replace it to act out a holder
// paused past its lease's lifetime; nullptr restores the real one.
// A holder's heartbeat follows this clock too: it looks at it at least once
// a second of real time and renews once a renewal period has passed on it.
using LeaseClock = std::function<std::chrono::steady_clock::time_point()>;
void set_lease_clock_for_testing(LeaseClock clock);
std::chrono::steady_clock::time_point lease_now();

// Renewals by heartbeats in this process so far (every lease), for tests and
// diagnostics.
uint64_t lease_renewals();

// Fencing. A lease last confirmed (written by its holder, the time taken
// before the request was sent) at `confirmed` cannot have been taken over
// before `confirmed + ttl` on any clock running at the holder's rate: a
// taker needs the lease unrenewed for `ttl` on the server's clock, counted
// from when the write landed. A write that depends on the lease goes ahead
// without a request while less than half the lifetime has passed (the other
// half is the margin for the write itself to land); after that it confirms
// the lease first (a conditional renewal). The heartbeat renews every third
// of the lifetime, so a live holder never pays for the check.
inline bool lease_needs_confirming(std::chrono::steady_clock::time_point confirmed,
                                   std::chrono::steady_clock::time_point now,
                                   std::chrono::seconds ttl) {
  return now - confirmed >=
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(ttl) / 2;
}

}  // namespace cairn::s3
