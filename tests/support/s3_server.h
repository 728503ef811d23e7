// Test support: a real S3-compatible server (s3rver, pinned by
// tests/support/s3rver) on 127.0.0.1, started once per test process on first
// use and stopped when the process exits (or dies: the server gets SIGKILL
// with its parent).
//
// instance() also points this process's AWS environment at it (endpoint,
// the server's fixed credentials S3RVER/S3RVER, region, no instance
// metadata) and sets small multipart parts, so tests exercise multipart
// uploads and ranged reads without large data. Child processes inherit it.
#pragma once

#include <string>

namespace cairn::testing {

class S3Server {
 public:
  static S3Server& instance();

  const std::string& endpoint() const { return endpoint_; }  // http://127.0.0.1:PORT
  const std::string& bucket() const { return bucket_; }
  int port() const { return port_; }
  // A new, empty root: s3://BUCKET/<unique prefix>.
  std::string fresh_uri(const std::string& tag = "t");

  ~S3Server();
  S3Server(const S3Server&) = delete;
  S3Server& operator=(const S3Server&) = delete;

 private:
  S3Server();
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
// The path of s3rver's entry script (installs it on first use).
std::string s3rver_entry();

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
