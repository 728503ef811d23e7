#include "support/s3_server.h"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "storage/s3/http.h"

#ifndef CAIRN_SOURCE_DIR
#error "CAIRN_SOURCE_DIR must name the source tree"
#endif
#ifndef CAIRN_TEST_PYTHON
#error "CAIRN_TEST_PYTHON must name the Python that runs the tests' helper scripts"
#endif

namespace cairn::testing {

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    throw std::runtime_error("free_port: cannot bind 127.0.0.1:0");
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

namespace {

// How long a helper process (moto's server, the fault proxy) may take to say
// its port: generous for a loaded machine, bounded so that none hangs a test.
constexpr int kStartTimeoutMs = 120'000;

// The first line `fd` gives (without its newline, at most 64 bytes), or what
// came before end of file or `timeout_ms`.
std::string first_line(int fd, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  std::string line;
  while (line.size() < 64) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) break;
    char c;
    if (::read(fd, &c, 1) != 1 || c == '\n') break;
    line.push_back(c);
  }
  return line;
}

}  // namespace

bool wait_for_port(int port, int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    ::close(fd);
    if (ok) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

const char* test_python() {
  if (const char* e = std::getenv("CAIRN_TEST_PYTHON")) return e;
  return CAIRN_TEST_PYTHON;
}

S3Server& S3Server::instance() {
  static S3Server server;
  return server;
}

S3Server::S3Server() {
  owner_ = ::getpid();
  const char* which = std::getenv("CAIRN_TEST_S3_SERVER");
  if ((which != nullptr && std::string(which) == "radosgw") ||
      std::getenv("CAIRN_TEST_RADOSGW_DIR") != nullptr) {
    kind_ = Kind::kRadosgw;
    access_key_ = "cairn";
    secret_key_ = "cairn-secret";
    start_radosgw();
  } else {
    start_moto();
  }
  endpoint_ = fmt::format("http://127.0.0.1:{}", port_);
  ::setenv("AWS_ENDPOINT_URL_S3", endpoint_.c_str(), 1);
  ::setenv("AWS_ACCESS_KEY_ID", access_key_.c_str(), 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", secret_key_.c_str(), 1);
  ::unsetenv("AWS_SESSION_TOKEN");
  ::unsetenv("AWS_PROFILE");
  ::setenv("AWS_REGION", "us-east-1", 1);
  ::setenv("AWS_EC2_METADATA_DISABLED", "true", 1);
  ::setenv("AWS_CONFIG_FILE", "/dev/null", 1);
  ::setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null", 1);
  // Parts below S3's 5 MiB: the test servers accept them (as moto_s3.py
  // and tests/support/radosgw.sh configure them).
  ::setenv("CAIRN_S3_PART_SIZE", "262144", 0);
  ::setenv("CAIRN_S3_MIN_PART_SIZE", "262144", 0);
  ::setenv("CAIRN_S3_MAX_ATTEMPTS", "4", 0);
  ::setenv("CAIRN_S3_LOCK_TTL", "6", 0);
}

void S3Server::start_moto() {
  const std::string script = std::string(CAIRN_SOURCE_DIR) + "/tests/support/moto_s3.py";
  char tmpl[] = "/tmp/cairn-moto-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
  dir_ = tmpl;
  int in[2], out[2];
  if (::pipe(in) != 0 || ::pipe(out) != 0) throw std::runtime_error("pipe failed");
  const pid_t parent = ::getpid();
  const std::string log_file = log_path();
  const char* python = test_python();
  pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    ::dup2(in[0], STDIN_FILENO);
    ::dup2(out[1], STDOUT_FILENO);
    // Its own output goes to a log that fresh_uri() shows should it die.
    const int log = ::open(log_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (log >= 0) ::dup2(log, STDERR_FILENO);
    ::close(in[1]);
    ::close(out[0]);
    ::execl(python, python, script.c_str(), "--bucket", bucket_.c_str(),
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  ::fcntl(in[1], F_SETFD, FD_CLOEXEC);
  moto_stdin_ = in[1];
  pid_ = pid;
  // The first line is port=<n>, written once the bucket exists; end of file
  // first means it died, and check_alive() says why.
  std::string line = first_line(out[0], kStartTimeoutMs);
  ::close(out[0]);
  if (line.rfind("port=", 0) != 0) {
    ::kill(pid_, SIGKILL);  // silent past the timeout: stopped, and its output shown
    check_alive();
    throw std::runtime_error(
        fmt::format("moto's S3 server ({} {}) did not start (said \"{}\")", python, script, line));
  }
  port_ = std::stoi(line.substr(5));
}

void S3Server::start_radosgw() {
  const std::string script = std::string(CAIRN_SOURCE_DIR) + "/tests/support/radosgw.sh";
  ::setenv("CAIRN_RGW_ACCESS_KEY", access_key_.c_str(), 1);
  ::setenv("CAIRN_RGW_SECRET_KEY", secret_key_.c_str(), 1);
  ::setenv("CAIRN_RGW_BUCKET", bucket_.c_str(), 1);
  // The gateway a CTest fixture started for every radosgw test.
  if (const char* shared = std::getenv("CAIRN_TEST_RADOSGW_DIR")) {
    std::ifstream in(std::string(shared) + "/endpoint");
    if (in >> port_ && port_ > 0) return;
    port_ = 0;
  }
  char tmpl[] = "/tmp/cairn-radosgw-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
  dir_ = tmpl;
  port_ = free_port();
  // A watchdog that stops the gateway when this process goes, however it
  // goes: it waits for end of file on a pipe only this process writes to.
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) throw std::runtime_error("pipe failed");
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(pipe_fds[1]);
    char c;
    while (::read(pipe_fds[0], &c, 1) > 0) {
    }
    ::execlp("bash", "bash", script.c_str(), "stop", dir_.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(pipe_fds[0]);
  ::fcntl(pipe_fds[1], F_SETFD, FD_CLOEXEC);
  watchdog_pid_ = pid;
  watchdog_stdin_ = pipe_fds[1];
  std::string cmd = fmt::format("bash '{}' start '{}' {} >/dev/null", script, dir_, port_);
  int rc = std::system(cmd.c_str());
  if (rc != 0) {
    throw std::runtime_error(
        fmt::format("radosgw did not start on 127.0.0.1:{} ({} exited with {})", port_, cmd, rc));
  }
}

S3Server::~S3Server() {
  if (::getpid() != owner_) return;
  if (moto_stdin_ >= 0) ::close(moto_stdin_);
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  if (watchdog_stdin_ >= 0) {
    ::close(watchdog_stdin_);
    ::waitpid(watchdog_pid_, nullptr, 0);
    return;  // the watchdog removed the folder
  }
  if (kind_ == Kind::kMoto && !dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    std::filesystem::remove(log_path(), ec);
  }
}

void S3Server::check_alive() {
  if (kind_ != Kind::kMoto || pid_ <= 0 || ::getpid() != owner_) return;
  int status = 0;
  // Called when the server said nothing yet (it closed stdout): wait for it.
  if (::waitpid(pid_, &status, port_ == 0 ? 0 : WNOHANG) != pid_) return;
  pid_ = -1;
  std::ifstream in(log_path());
  std::string log((std::istreambuf_iterator<char>(in)), {});
  if (log.size() > 4000) log = "..." + log.substr(log.size() - 4000);
  throw std::runtime_error(
      fmt::format("the test's moto S3 server on port {} died ({}); its output:\n{}", port_,
                  WIFSIGNALED(status) ? fmt::format("signal {}", WTERMSIG(status))
                                      : fmt::format("exit status {}", WEXITSTATUS(status)),
                  log));
}

std::string S3Server::fresh_uri(const std::string& tag) {
  check_alive();
  static std::atomic<int> counter{0};
  return fmt::format("s3://{}/{}-{}-{}", bucket_, tag, ::getpid(), counter++);
}

}  // namespace cairn::testing

namespace cairn::testing {

FaultProxy::FaultProxy() {
  const std::string upstream = S3Server::instance().endpoint();
  const std::string script = std::string(CAIRN_SOURCE_DIR) + "/tests/support/s3_fault_proxy.py";
  int in[2], out[2];
  if (::pipe(in) != 0 || ::pipe(out) != 0) throw std::runtime_error("pipe failed");
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    ::dup2(in[0], 0);
    ::dup2(out[1], 1);
    ::close(in[1]);
    ::close(out[0]);
    const char* python = test_python();
    ::execl(python, python, script.c_str(), "--upstream", upstream.c_str(), "--port", "0",
            "--fault-rate", "0", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  pid_ = pid;
  stdin_fd_ = in[1];
  ::fcntl(stdin_fd_, F_SETFD, FD_CLOEXEC);
  std::string line = first_line(out[0], kStartTimeoutMs);
  ::close(out[0]);
  if (line.rfind("port=", 0) != 0) {
    throw std::runtime_error("the fault proxy did not start (said \"" + line + "\")");
  }
  endpoint_ = "http://127.0.0.1:" + line.substr(5);
}

FaultProxy::~FaultProxy() {
  if (stdin_fd_ >= 0) ::close(stdin_fd_);
  if (pid_ > 0) {
    for (int i = 0; i < 50; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
}

std::string FaultProxy::control(const std::string& method, const std::string& path,
                                const std::string& body) {
  static auto http = s3::make_http_client(2);
  s3::HttpRequest r;
  r.method = method;
  r.url = endpoint_ + path;
  r.body = std::as_bytes(std::span(body.data(), body.size()));
  r.headers = {{"content-type", "application/json"}};
  s3::HttpResponse resp = http->send(r);
  if (resp.status != 200) {
    throw std::runtime_error(
        fmt::format("fault proxy {} {}: HTTP {} {}", method, path, resp.status, resp.body));
  }
  return resp.body;
}

void FaultProxy::configure(const std::string& json_config) {
  control("POST", "/__fault__/config", json_config);
}

std::string FaultProxy::stats() { return control("GET", "/__fault__/stats", ""); }

}  // namespace cairn::testing
