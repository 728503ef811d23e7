#include "train/control/sigterm.h"

namespace cairn::train_internal {
namespace {

volatile sig_atomic_t g_sigterm = 0;
extern "C" void on_sigterm(int) { g_sigterm = 1; }

}  // namespace

SigtermNotice::SigtermNotice() {
  g_sigterm = 0;
  struct sigaction sa {};
  sa.sa_handler = on_sigterm;
  sa.sa_flags = SA_RESTART;
  ::sigemptyset(&sa.sa_mask);
  ::sigaction(SIGTERM, &sa, &previous_);
}

SigtermNotice::~SigtermNotice() { ::sigaction(SIGTERM, &previous_, nullptr); }

bool SigtermNotice::received() const { return g_sigterm != 0; }

}  // namespace cairn::train_internal
