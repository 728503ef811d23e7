// SIGTERM as a preemption notice (docs/train.md, "Preemption"): while a
// SigtermNotice lives, SIGTERM sets a flag instead of ending the process;
// the previous disposition comes back when it is destroyed. One per process
// at a time (the driver, an MPI agent, or a worker).
#pragma once

#include <signal.h>

namespace cairn::train_internal {

class SigtermNotice {
 public:
  SigtermNotice();
  ~SigtermNotice();
  SigtermNotice(const SigtermNotice&) = delete;
  SigtermNotice& operator=(const SigtermNotice&) = delete;

  // Whether SIGTERM arrived since construction.
  bool received() const;

 private:
  struct sigaction previous_ {};
};

}  // namespace cairn::train_internal
