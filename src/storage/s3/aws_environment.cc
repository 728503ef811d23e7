// AwsEnvironment::process(): the real environment, clock, HTTP client and
// process runner. Apart from the rest of aws_config.cc because it is the one
// piece that needs the libcurl client.
#include <cstdlib>
#include <string>

#include "storage/s3/aws_config.h"
#include "util/settings.h"

namespace cairn::s3 {

AwsEnvironment AwsEnvironment::process() {
  AwsEnvironment env;
  env.getenv = [process = Environment::process()](std::string_view name) {
    return process.get(name);
  };
  env.now = [] { return std::chrono::system_clock::now(); };
  env.http = make_http_client(8);
  env.run_process = [](const std::string& command) { return run_shell_command(command); };
  return env;
}

}  // namespace cairn::s3
