// SIGTERM as a preemption notice (docs/train.md, "Preemption"): while a
// SigtermNotice lives, SIGTERM sets a flag instead of ending the process;
// the previous disposition comes back when it is destroyed.
//
// Notices nest: the outermost one in a process starts with a clear flag, an
// inner one keeps what arrived before it (a Tuner's trial runner, forked
// while the Tuner's notice lives, keeps a SIGTERM that reaches it before its
// Trainer's own notice exists). The flag belongs to the process that got the
// signal: a child forked after its parent got SIGTERM has not received it.
//
// Thread-safety: construct and destroy on one thread; received() from any.
#pragma once

#include <signal.h>

namespace cairn::train_internal {

class SigtermNotice {
 public:
  SigtermNotice();
  ~SigtermNotice();
  SigtermNotice(const SigtermNotice&) = delete;
  SigtermNotice& operator=(const SigtermNotice&) = delete;

  // Whether this process received SIGTERM since the outermost notice began.
  bool received() const;

 private:
  struct sigaction previous_ {};
};

}  // namespace cairn::train_internal
