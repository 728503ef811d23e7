// The exit codes of the `cairn` command, one per kind of outcome, so that
// scripts can tell "the data is bad" from "you typed the path wrong". The
// table is documented in docs/cli.md; keep the two in step.
#pragma once

#include "cairn/error.h"

namespace cairn::cli {

enum ExitCode : int {
  kExitOk = 0,             // the command did what was asked; verify found nothing wrong
  kExitProblems = 1,       // verify found bad files or a malformed manifest
  kExitUsage = 2,          // bad command line, unusable argument or URI
  kExitNotFound = 3,       // the path, experiment or checkpoint does not exist
  kExitCorruption = 4,     // stored data could not be read (malformed manifest, metadata, history)
  kExitOtherError = 5,     // I/O, permission, lock, full disk, bugs: anything else
  kExitAlreadyExists = 6,  // the destination already holds other data (cp)
};

// The exit code for a command that stopped with `code`.
ExitCode exit_code_for(ErrorCode code);

}  // namespace cairn::cli
