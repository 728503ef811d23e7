#include "train/control/sigterm.h"

#include <unistd.h>

namespace cairn::train_internal {
namespace {

// The pid of the process the handler ran in, 0 for none: a forked child
// inherits the value, but it names its parent, not the child.
volatile sig_atomic_t g_sigterm_pid = 0;
// Notices alive in this process (a forked child inherits its parent's).
int g_depth = 0;

extern "C" void on_sigterm(int) { g_sigterm_pid = static_cast<sig_atomic_t>(::getpid()); }

}  // namespace

SigtermNotice::SigtermNotice() {
  if (g_depth++ == 0) g_sigterm_pid = 0;
  struct sigaction sa {};
  sa.sa_handler = on_sigterm;
  sa.sa_flags = SA_RESTART;
  ::sigemptyset(&sa.sa_mask);
  ::sigaction(SIGTERM, &sa, &previous_);
}

SigtermNotice::~SigtermNotice() {
  ::sigaction(SIGTERM, &previous_, nullptr);
  --g_depth;
}

bool SigtermNotice::received() const {
  return g_sigterm_pid != 0 && g_sigterm_pid == static_cast<sig_atomic_t>(::getpid());
}

}  // namespace cairn::train_internal
