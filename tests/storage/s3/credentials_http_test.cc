// The credentials chain end to end over real HTTP: the libcurl client
// against a local IMDSv2 and container-credentials server
// (imds_server.py), and against a port where nothing listens.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <string>

#include "storage/s3/credentials.h"
#include "support/errors.h"

extern char** environ;

namespace cairn::s3 {
namespace {

using std::chrono::system_clock;

// imds_server.py, running until destroyed.
class ImdsServer {
 public:
  ImdsServer(const std::string& expiration, const std::string& container_token) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) {
      why_not_ = "pipe failed";
      return;
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    const std::string python = CAIRN_TEST_PYTHON3;
    const std::string script = CAIRN_IMDS_SERVER;
    std::vector<std::string> args = {python,
                                     script,
                                     "--expiration",
                                     expiration,
                                     "--role",
                                     "e2e-role",
                                     "--container-path",
                                     "/v2/credentials/e2e",
                                     "--container-token",
                                     container_token};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int rc = ::posix_spawn(&pid_, python.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(in[0]);
    ::close(out[1]);
    stdin_ = in[1];
    if (rc != 0) {
      pid_ = -1;
      ::close(out[0]);
      why_not_ = "cannot start " + python;
      return;
    }
    std::string line;
    char c;
    while (::read(out[0], &c, 1) == 1 && c != '\n') line.push_back(c);
    ::close(out[0]);
    port_ = std::atoi(line.c_str());
    if (port_ <= 0) why_not_ = "imds_server.py printed no port: \"" + line + "\"";
  }
  ~ImdsServer() {
    if (stdin_ >= 0) ::close(stdin_);
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int status;
      ::waitpid(pid_, &status, 0);
    }
  }
  int port() const { return port_; }
  const std::string& why_not() const { return why_not_; }

 private:
  pid_t pid_ = -1;
  int stdin_ = -1;
  int port_ = 0;
  std::string why_not_;
};

// A loopback port where nothing listens: bound, then closed again.
int closed_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

AwsEnvironment environment(std::map<std::string, std::string> vars) {
  AwsEnvironment env;
  env.getenv = [vars](std::string_view name) -> std::optional<std::string> {
    const auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
  env.now = [] { return system_clock::now(); };
  env.http = make_http_client(4);
  env.run_process = run_shell_command;
  return env;
}

constexpr const char* kExpiration = "2099-01-02T03:04:05Z";

TEST(CredentialsHttp, InstanceMetadataOverRealHttp) {
  if (std::string(CAIRN_TEST_PYTHON3).empty()) GTEST_SKIP() << "no python3 found at configure time";
  ImdsServer server(kExpiration, "Bearer e2e");
  ASSERT_EQ(server.why_not(), "");
  const std::string endpoint = "http://127.0.0.1:" + std::to_string(server.port());
  auto p = default_credentials(
      environment({{"HOME", "/nonexistent"}, {"AWS_EC2_METADATA_SERVICE_ENDPOINT", endpoint}}));
  const Credentials c = p->get();
  EXPECT_EQ(c.access_key_id, "IMDSAKID");
  EXPECT_EQ(c.secret_access_key, "IMDSSECRET");
  EXPECT_EQ(c.session_token, "IMDSTOKEN");
  EXPECT_EQ(c.expiration, parse_aws_time(kExpiration));
  EXPECT_EQ(c.source, "EC2 instance metadata " + endpoint + " (role e2e-role)");
  EXPECT_EQ(p->refresh().access_key_id, "IMDSAKID");
}

TEST(CredentialsHttp, ContainerCredentialsOverRealHttpCheckTheToken) {
  if (std::string(CAIRN_TEST_PYTHON3).empty()) GTEST_SKIP() << "no python3 found at configure time";
  ImdsServer server(kExpiration, "Bearer e2e");
  ASSERT_EQ(server.why_not(), "");
  const std::string url =
      "http://127.0.0.1:" + std::to_string(server.port()) + "/v2/credentials/e2e";
  std::map<std::string, std::string> vars = {{"HOME", "/nonexistent"},
                                             {"AWS_CONTAINER_CREDENTIALS_FULL_URI", url},
                                             {"AWS_CONTAINER_AUTHORIZATION_TOKEN", "Bearer e2e"}};
  const Credentials c = default_credentials(environment(vars))->get();
  EXPECT_EQ(c.access_key_id, "CONTAINERAKID");
  EXPECT_EQ(c.session_token, "CONTAINERTOKEN");

  vars["AWS_CONTAINER_AUTHORIZATION_TOKEN"] = "Bearer wrong";
  const std::string msg = cairn::testing::error_message_of(
      [&] { default_credentials(environment(vars))->get(); }, ErrorCode::kPermissionDenied);
  EXPECT_NE(msg.find("HTTP 401"), std::string::npos) << msg;
}

TEST(CredentialsHttp, NoMetadataServiceFailsFastListingEveryPlace) {
  const std::string endpoint = "http://127.0.0.1:" + std::to_string(closed_port());
  auto p = default_credentials(
      environment({{"HOME", "/nonexistent"}, {"AWS_EC2_METADATA_SERVICE_ENDPOINT", endpoint}}));
  const auto start = std::chrono::steady_clock::now();
  const std::string msg =
      cairn::testing::error_message_of([&] { p->get(); }, ErrorCode::kFailedPrecondition);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  EXPECT_NE(msg.find("environment: AWS_ACCESS_KEY_ID not set"), std::string::npos) << msg;
  EXPECT_NE(msg.find("EC2 instance metadata " + endpoint + ": "), std::string::npos) << msg;
}

}  // namespace
}  // namespace cairn::s3
