// The control-plane channel refuses what a peer must never make it accept:
// documents nested too deeply, NUL bytes, oversized frames. The error is
// kCorruption naming the peer, never a crash.
#include "train/control/channel.h"

#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include <gtest/gtest.h>

#include "cairn/error.h"
#include "train/mpi_agents.h"

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

// An agent's reply that arrived together with an earlier message (a peer
// that sends two at once) waits in the channel's buffer once the first is
// read; the driver's collect() must find it there, not wait for the socket.
TEST(Channel, CollectFindsAReplyAlreadyBufferedBehindAnEarlierMessage) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  Channel peer(UniqueFd(sv[1]), "peer");
  peer.send({{"t", "hello"}});
  peer.send({{"t", "offer"}, {"n", 7}});
  std::vector<Agent> agents(1);
  agents[0].channel = Channel(UniqueFd(sv[0]), "agent");
  ASSERT_EQ(agents[0].channel.recv(5000).value().at("t"), "hello");
  const auto start = std::chrono::steady_clock::now();
  const std::vector<nlohmann::json> got = collect(agents, "offer", std::chrono::seconds(30));
  ASSERT_EQ(got.size(), 1u);
  ASSERT_TRUE(got[0].is_object()) << "the buffered reply was not seen";
  EXPECT_EQ(got[0].at("n"), 7);
  EXPECT_FALSE(agents[0].gone);
  // Found at once, not after the limit (a bound, not a timing: 30 s).
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(25));
}

}  // namespace
}  // namespace cairn::train_internal
