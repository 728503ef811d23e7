// TCP for the MPI launcher's control connections (driver <-> agents). Small
// and blocking; every wait has a deadline.
//
// Thread-safety: none needed; each object belongs to one thread.
// Failure: cairn::Error (kInvalidArgument for a bad address, kTimeout when a
// deadline passes, kUnavailable/kIO for socket errors), naming the address.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "util/fs.h"

namespace cairn::train_internal {

class TcpListener {
 public:
  // Listens on `address` (a numeric IPv4 or IPv6 address; "" means every
  // interface) at a port the kernel picks.
  explicit TcpListener(const std::string& address);
  int port() const { return port_; }
  int fd() const { return fd_.get(); }
  // Waits up to `timeout` for a connection; an empty UniqueFd if none came.
  UniqueFd accept(std::chrono::milliseconds timeout);

 private:
  UniqueFd fd_;
  int port_ = 0;
};

// Connects to the first of `hosts` (names or numeric addresses) that accepts
// on `port`, retrying all of them until `limit` has passed. The socket has
// TCP_NODELAY and SO_KEEPALIVE set.
UniqueFd tcp_connect(const std::vector<std::string>& hosts, int port,
                     std::chrono::milliseconds limit);

// The numeric addresses of this machine's interfaces that are up, loopback
// excluded, IPv4 first.
std::vector<std::string> local_addresses();

// This machine's host name.
std::string host_name();

}  // namespace cairn::train_internal
