// A message channel between the driver and a worker (or an MPI agent) over a
// stream socket: each message is a 4-byte little-endian length followed by
// that many bytes of JSON. Works the same over a socketpair, a Unix socket or
// TCP.
//
// Thread-safety: none; a Channel belongs to one thread.
// Failure: send/recv throw cairn::Error (kUnavailable when the peer is gone;
// kCorruption naming the peer for a message that is malformed, nested too
// deeply, holds a NUL byte or is too large: every message is parsed with
// parse_json). A message that parses is JSON of any shape: readers check the
// fields they use (nlohmann's value() and at() throw on a wrong type).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "util/fs.h"

namespace cairn::train_internal {

class Channel {
 public:
  Channel() = default;
  Channel(UniqueFd fd, std::string peer) : fd_(std::move(fd)), peer_(std::move(peer)) {}

  int fd() const { return fd_.get(); }
  const std::string& peer() const { return peer_; }
  void set_peer(std::string peer) { peer_ = std::move(peer); }
  bool open() const { return static_cast<bool>(fd_); }

  // Blocking send of one message.
  void send(const nlohmann::json& message);
  // Blocking receive of one message. nullopt on end of stream or, with
  // timeout_ms >= 0, when nothing complete arrived in that time.
  std::optional<nlohmann::json> recv(int timeout_ms = -1);
  // Reads whatever is available without blocking and appends the complete
  // messages to `out`. Returns false once the peer closed the stream.
  bool read_available(std::vector<nlohmann::json>& out);

  void close() { fd_ = UniqueFd(); }

 private:
  bool take_message(nlohmann::json& out);

  UniqueFd fd_;
  std::string peer_;
  std::string buffer_;
};

}  // namespace cairn::train_internal
