#include "train/control/channel.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>

#include <fmt/format.h>

#include "cairn/error.h"
#include "util/json.h"

namespace cairn::train_internal {

namespace {

// A message larger than this is a protocol error, not a report (metrics and
// file lists are small).
constexpr uint32_t kMaxMessage = 256u << 20;

}  // namespace

void Channel::send(const nlohmann::json& message) {
  const std::string body = message.dump();
  if (body.size() > kMaxMessage) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("message to {} is {} bytes, over the {} byte limit", peer_, body.size(),
                            kMaxMessage));
  }
  std::string frame(4, '\0');
  const auto n = static_cast<uint32_t>(body.size());
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  frame += body;
  size_t off = 0;
  while (off < frame.size()) {
    ssize_t w = ::send(fd_.get(), frame.data() + off, frame.size() - off, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        pollfd p{fd_.get(), POLLOUT, 0};
        ::poll(&p, 1, 1000);  // ignore-error: the next send reports a real failure
        continue;
      }
      const int err = errno;
      throw Error(ErrorCode::kUnavailable,
                  fmt::format("sending to {}: {}", peer_, std::strerror(err)));
    }
    off += static_cast<size_t>(w);
  }
}

bool Channel::take_message(nlohmann::json& out) {
  if (buffer_.size() < 4) return false;
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i)
    n |= static_cast<uint32_t>(static_cast<uint8_t>(buffer_[i])) << (8 * i);
  if (n > kMaxMessage) {
    throw Error(ErrorCode::kCorruption,
                fmt::format("message from {} claims {} bytes (protocol error)", peer_, n));
  }
  if (buffer_.size() < 4 + static_cast<size_t>(n)) return false;
  // Bounded parse: a peer's message nested too deeply, holding a NUL byte or
  // too large is kCorruption naming the peer, never a stack overflow.
  const std::string_view body(buffer_.data() + 4, n);
  nlohmann::json parsed = parse_json(body, fmt::format("message from {}", peer_));
  buffer_.erase(0, 4 + static_cast<size_t>(n));
  out = std::move(parsed);
  return true;
}

bool Channel::read_available(std::vector<nlohmann::json>& out) {
  char chunk[65536];
  bool open = true;
  for (int i = 0; i < 1024; ++i) {  // bounded: at most 64 MiB per call
    ssize_t r = ::recv(fd_.get(), chunk, sizeof chunk, MSG_DONTWAIT);
    if (r > 0) {
      buffer_.append(chunk, static_cast<size_t>(r));
      continue;
    }
    if (r == 0) {
      open = false;
      break;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    if (errno == ECONNRESET) {
      open = false;
      break;
    }
    const int err = errno;
    throw Error(ErrorCode::kUnavailable,
                fmt::format("receiving from {}: {}", peer_, std::strerror(err)));
  }
  nlohmann::json m;
  while (take_message(m)) out.push_back(std::move(m));
  return open;
}

std::optional<nlohmann::json> Channel::recv(int timeout_ms) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms);
  nlohmann::json m;
  while (true) {
    if (take_message(m)) return m;
    int wait = -1;
    if (timeout_ms >= 0) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return std::nullopt;
      wait = static_cast<int>(left.count());
    }
    pollfd p{fd_.get(), POLLIN, 0};
    int rc = ::poll(&p, 1, wait);
    if (rc < 0 && errno != EINTR) {
      const int err = errno;
      throw Error(ErrorCode::kUnavailable,
                  fmt::format("waiting for {}: {}", peer_, std::strerror(err)));
    }
    if (rc <= 0) continue;
    char chunk[65536];
    ssize_t r = ::recv(fd_.get(), chunk, sizeof chunk, 0);
    if (r > 0) {
      buffer_.append(chunk, static_cast<size_t>(r));
    } else if (r == 0 || errno == ECONNRESET) {
      return std::nullopt;
    } else if (errno != EINTR && errno != EAGAIN) {
      const int err = errno;
      throw Error(ErrorCode::kUnavailable,
                  fmt::format("receiving from {}: {}", peer_, std::strerror(err)));
    }
  }
}

}  // namespace cairn::train_internal
