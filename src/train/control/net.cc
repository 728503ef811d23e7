#include "train/control/net.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cairn/error.h"

namespace cairn::train_internal {

namespace {

void set_stream_options(int fd) {
  int one = 1;
  // ignore-error: latency and dead-peer detection are improvements, not requirements
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  (void)::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
}

// A TCP socket bound to `address` (numeric IPv4 or IPv6; "" = every
// interface, IPv4 included) at `port` (0: one the kernel picks); returns it
// and the port.
std::pair<UniqueFd, int> bound_socket(const std::string& address, bool reuse_address,
                                      int port = 0) {
  sockaddr_storage ss{};
  socklen_t len = 0;
  const std::string shown = address.empty() ? std::string("every interface") : address;
  if (address.empty()) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    a->sin6_family = AF_INET6;
    a->sin6_addr = in6addr_any;
    len = sizeof *a;
  } else if (auto* a4 = reinterpret_cast<sockaddr_in*>(&ss);
             ::inet_pton(AF_INET, address.c_str(), &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET;
    len = sizeof *a4;
  } else if (auto* a6 = reinterpret_cast<sockaddr_in6*>(&ss);
             ::inet_pton(AF_INET6, address.c_str(), &a6->sin6_addr) == 1) {
    a6->sin6_family = AF_INET6;
    len = sizeof *a6;
  } else {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("\"{}\" is not a numeric IPv4 or IPv6 address to bind to", address));
  }
  if (ss.ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(&ss)->sin_port = htons(static_cast<uint16_t>(port));
  } else {
    reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port = htons(static_cast<uint16_t>(port));
  }
  UniqueFd fd(::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) throw errno_error(errno, "socket", shown);
  if (address.empty()) {
    int zero = 0;  // accept IPv4 too
    (void)::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
  }
  if (reuse_address) {
    int one = 1;
    if (::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0) {
      throw errno_error(errno, "setsockopt(SO_REUSEADDR)", shown);
    }
  }
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    throw errno_error(errno, "bind", port == 0 ? shown : fmt::format("{} port {}", shown, port));
  }
  sockaddr_storage bound{};
  socklen_t blen = sizeof bound;
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &blen) != 0) {
    throw errno_error(errno, "getsockname", shown);
  }
  const int got = bound.ss_family == AF_INET
                      ? ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port)
                      : ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
  return {std::move(fd), got};
}

}  // namespace

TcpListener::TcpListener(const std::string& address, int port) {
  auto [fd, bound] = bound_socket(address, /*reuse_address=*/port != 0, port);
  fd_ = std::move(fd);
  port_ = bound;
  // The kernel's most (net.core.somaxconn, 4096 on current kernels), not
  // 128: the processes of an MPI launch learn the address together from its
  // broadcast and connect at once, and connections past a full queue are
  // dropped and retried by TCP after 1, 3, 7... s.
  if (::listen(fd_.get(), SOMAXCONN) != 0) {
    throw errno_error(errno, "listen", address.empty() ? std::string("every interface") : address);
  }
}

PortReservation::PortReservation(const std::string& address) {
  auto [fd, port] = bound_socket(address, /*reuse_address=*/true);
  fd_ = std::move(fd);
  port_ = port;
}

UniqueFd TcpListener::accept(std::chrono::milliseconds timeout) {
  pollfd p{fd_.get(), POLLIN, 0};
  const int rc = ::poll(&p, 1, static_cast<int>(timeout.count()));
  if (rc <= 0) return UniqueFd();  // timeout or EINTR: the caller's loop decides
  UniqueFd fd(::accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (!fd) {
    if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) return UniqueFd();
    throw errno_error(errno, "accept", fmt::format("port {}", port_));
  }
  set_stream_options(fd.get());
  return fd;
}

UniqueFd tcp_connect(const std::vector<std::string>& hosts, int port,
                     std::chrono::milliseconds limit) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + limit;
  std::string last_error = "no address to try";
  // Bounded by `limit`: the peer may not listen yet, so every address is retried.
  while (true) {
    for (const std::string& host : hosts) {
      addrinfo hints{};
      hints.ai_family = AF_UNSPEC;
      hints.ai_socktype = SOCK_STREAM;
      addrinfo* found = nullptr;
      const std::string service = std::to_string(port);
      const int gai = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
      if (gai != 0) {
        last_error = fmt::format("{}: {}", host, ::gai_strerror(gai));
        continue;
      }
      for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
        UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
        if (!fd) continue;
        if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) == 0) {
          ::freeaddrinfo(found);
          set_stream_options(fd.get());
          return fd;
        }
        last_error = fmt::format("{} port {}: {}", host, port, std::strerror(errno));
      }
      ::freeaddrinfo(found);
    }
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  throw Error(ErrorCode::kTimeout,
              fmt::format("could not connect to port {} of any of [{}] within {} s (last: {})",
                          port, fmt::join(hosts, ", "), limit.count() / 1000, last_error));
}

std::vector<std::string> local_addresses() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) throw errno_error(errno, "getifaddrs", "network interfaces");
  std::vector<std::string> v4, v6;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || !(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) {
      continue;
    }
    char buf[INET6_ADDRSTRLEN] = {};
    if (i->ifa_addr->sa_family == AF_INET) {
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf, sizeof buf);
      v4.emplace_back(buf);
    } else if (i->ifa_addr->sa_family == AF_INET6) {
      const auto* a = reinterpret_cast<sockaddr_in6*>(i->ifa_addr);
      if (IN6_IS_ADDR_LINKLOCAL(&a->sin6_addr)) continue;  // needs a scope id to be usable
      ::inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
      v6.emplace_back(buf);
    }
  }
  ::freeifaddrs(list);
  v4.insert(v4.end(), v6.begin(), v6.end());
  return v4;
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) throw errno_error(errno, "gethostname", "this host");
  return buf;
}

}  // namespace cairn::train_internal
