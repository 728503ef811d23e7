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
  // interface) at `port`, or at a port the kernel picks when it is 0. A
  // given port is bound with SO_REUSEADDR, so a previous run's connections
  // in TIME_WAIT do not keep it; one another process listens on is refused
  // (an error naming the address and port). Its queue of connections not
  // yet accepted is as long as the kernel allows (net.core.somaxconn), so
  // that a launch's processes connecting at once are not dropped.
  explicit TcpListener(const std::string& address, int port = 0);
  int port() const { return port_; }
  int fd() const { return fd_.get(); }
  // Waits up to `timeout` for a connection; an empty UniqueFd if none came.
  UniqueFd accept(std::chrono::milliseconds timeout);

 private:
  UniqueFd fd_;
  int port_ = 0;
};

// A TCP port held for a listener that another process opens later (rank 0's
// rendezvous store, torch_distributed.h): a socket bound with SO_REUSEADDR to
// `address` (as TcpListener's) at a port the kernel picks, that never
// listens. While it is held the kernel hands the port to no other bind() to
// port 0 and no outgoing connection, so the port cannot be taken between
// the driver choosing it and rank 0 listening on it; a listener that sets
// SO_REUSEADDR itself (c10d's TCPStore does) can still bind and listen on
// it on Linux, because this socket does not listen. Hold it for the life of
// the group that uses the port.
class PortReservation {
 public:
  explicit PortReservation(const std::string& address);
  int port() const { return port_; }

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
