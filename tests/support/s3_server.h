// Test support: a real S3 implementation on 127.0.0.1, started once per test
// process on first use and stopped when the process exits (or dies: the
// server gets SIGKILL with its parent and exits when the pipe on its stdin
// closes).
//
// instance() also points this process's AWS environment at it (endpoint,
// the server's credentials, region, no instance metadata) and sets small
// multipart parts, so tests exercise multipart uploads and ranged reads
// without large data. Child processes inherit it.
#pragma once

#include <string>

namespace cairn::testing {

// Which server: moto's S3 server by default (tests/support/moto_s3.py, on the
// project's Python: CAIRN_TEST_PYTHON); Ceph's radosgw (tests/support/radosgw.sh)
// when CAIRN_TEST_S3_SERVER=radosgw or CAIRN_TEST_RADOSGW_DIR is set. Under
// CTest the radosgw tests share one gateway that a fixture starts (its port
// in $CAIRN_TEST_RADOSGW_DIR/endpoint); a test binary run on its own starts
// its own and stops it when it exits (a watchdog process stops it if the
// binary is killed).
class S3Server {
 public:
  enum class Kind { kMoto, kRadosgw };
  static S3Server& instance();

  Kind kind() const { return kind_; }
  const char* name() const { return kind_ == Kind::kRadosgw ? "radosgw" : "moto"; }
  // The credentials the server knows (moto takes any).
  const std::string& access_key() const { return access_key_; }
  const std::string& secret_key() const { return secret_key_; }

  const std::string& endpoint() const { return endpoint_; }  // http://127.0.0.1:PORT
  const std::string& bucket() const { return bucket_; }
  int port() const { return port_; }
  // A new, empty root: s3://BUCKET/<unique prefix>. Throws, with the
  // server's exit status and its output, if the moto server this process started
  // has died (so every test after that says why, not only "cannot connect").
  std::string fresh_uri(const std::string& tag = "t");

  ~S3Server();
  S3Server(const S3Server&) = delete;
  S3Server& operator=(const S3Server&) = delete;

 private:
  S3Server();
  void start_moto();
  void check_alive();
  std::string log_path() const { return dir_ + ".log"; }
  void start_radosgw();
  Kind kind_ = Kind::kMoto;
  std::string access_key_ = "cairn-test";
  std::string secret_key_ = "cairn-test-secret";
  int owner_ = -1;           // the process that started the server
  int watchdog_stdin_ = -1;  // radosgw started here: closing it stops the gateway
  int moto_stdin_ = -1;      // moto started here: closing it stops the server
  int watchdog_pid_ = -1;
  std::string dir_;
  std::string endpoint_;
  std::string bucket_ = "cairn-test";
  int port_ = 0;
  int pid_ = -1;
};

// A free TCP port on 127.0.0.1 (bound, then released).
int free_port();
// Waits (bounded) until something accepts connections on 127.0.0.1:port.
bool wait_for_port(int port, int timeout_ms);
// The Python the tests run helper scripts on (the project's venv).
const char* test_python();

}  // namespace cairn::testing

namespace cairn::testing {

// tests/support/s3_fault_proxy.py in front of the test server, for one test:
// started by the constructor, gone when destroyed (its stdin is a pipe held
// here, and it exits when that closes). Faults start off; configure() sets
// them at run time.
class FaultProxy {
 public:
  FaultProxy();
  ~FaultProxy();
  FaultProxy(const FaultProxy&) = delete;
  FaultProxy& operator=(const FaultProxy&) = delete;

  const std::string& endpoint() const { return endpoint_; }
  // POSTs `json_config` ({"rate":0.1,"faults":[...],"seed":1,...}) to the
  // proxy's control endpoint; throws if it is refused.
  void configure(const std::string& json_config);
  // The proxy's counters ({"requests":..,"faults":{kind:n}}) as JSON text.
  std::string stats();

 private:
  std::string control(const std::string& method, const std::string& path, const std::string& body);
  std::string endpoint_;
  int pid_ = -1;
  int stdin_fd_ = -1;
};

}  // namespace cairn::testing
