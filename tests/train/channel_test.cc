// The control-plane channel refuses what a peer must never make it accept:
// documents nested too deeply, NUL bytes, oversized frames. The error is
// kCorruption naming the peer, never a crash.
#include "train/control/channel.h"

#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include <gtest/gtest.h>

#include "cairn/error.h"

namespace cairn::train_internal {
namespace {

struct Pair {
  Channel reader;
  int writer = -1;
  Pair() {
    int sv[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    reader = Channel(UniqueFd(sv[0]), "rank 3");
    writer = sv[1];
  }
  ~Pair() { ::close(writer); }
  // A frame as the peer would write it: length, then `body` as is.
  void send_raw(const std::string& body) {
    std::string frame(4, '\0');
    const auto n = static_cast<uint32_t>(body.size());
    for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    frame += body;
    ASSERT_EQ(::send(writer, frame.data(), frame.size(), 0), static_cast<ssize_t>(frame.size()));
  }
};

void expect_refused(Pair& p, const char* what) {
  try {
    p.reader.recv(5000);
    ADD_FAILURE() << what << " was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruption) << what << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 3"), std::string::npos) << e.what();
  }
}

TEST(Channel, MessageNestedTooDeeplyIsRefusedNamingThePeer) {
  Pair p;
  const size_t depth = 100000;  // fits the socket buffer in one frame
  p.send_raw(std::string(depth, '[') + std::string(depth, ']'));
  expect_refused(p, "a message nested 100,000 levels deep");
}

TEST(Channel, MessageWithANulByteIsRefused) {
  Pair p;
  p.send_raw(std::string("{\"t\":\"done\",\"count\":1}\0garbage", 30));
  expect_refused(p, "a message with a NUL byte");
}

TEST(Channel, ReadAvailableRefusesTooDeepMessagesToo) {
  Pair p;
  p.send_raw(std::string(200, '{'));  // malformed and deep
  std::vector<nlohmann::json> out;
  EXPECT_THROW(p.reader.read_available(out), Error);
  Pair q;
  q.send_raw(std::string(1000, '[') + std::string(1000, ']'));
  try {
    q.reader.read_available(out);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruption) << e.what();
  }
}

TEST(Channel, OrdinaryMessagesPassBothWays) {
  Pair p;
  Channel writer(UniqueFd(::dup(p.writer)), "the driver");
  writer.send({{"t", "report"}, {"round", 1}, {"metrics", {{"loss", 0.5}}}});
  auto m = p.reader.recv(5000);
  ASSERT_TRUE(m);
  EXPECT_EQ((*m)["metrics"]["loss"], 0.5);
}

}  // namespace
}  // namespace cairn::train_internal
