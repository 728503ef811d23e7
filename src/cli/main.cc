// The `cairn` command: list, inspect, verify, clean and copy checkpoints.
// Usage and the --json schema: docs/cli.md. Exit codes: cli/exit_codes.h.
#include <charconv>
#include <cstdio>
#include <exception>
#include <iostream>
#include <map>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include "cairn/error.h"
#include "cairn/version.h"
#include "cli/commands.h"
#include "cli/cp.h"
#include "cli/exit_codes.h"
#include "cli/views.h"

namespace {

using namespace cairn::cli;

constexpr const char* kRootHelp =
    "a storage root holding experiments, or one experiment folder (a Tuner experiment lists "
    "its trials): a plain path, "
    "file:///abs/path or memory://name/prefix";
constexpr const char* kAnyHelp =
    "a storage root holding experiments, one experiment folder, or one checkpoint: a plain "
    "path, file:///abs/path or memory://name/prefix";

constexpr const char* kFooter =
    "Exit codes: 0 ok; 1 verify found bad files; 2 usage error; 3 not found; 4 stored data "
    "unreadable (corrupt); 5 any other error; 6 the destination already holds other data. "
    "--json prints one JSON document on stdout (schema_version 1, see docs/cli.md).";

constexpr const char* kVersionLine = "cairn " CAIRN_VERSION_STRING;

// A check of one option's text that fails with a message naming the option,
// the value given and the values accepted (CLI11 prefixes the option's name),
// rather than CLI11's own "Check ... FAILED" text.
CLI::Validator one_of(std::vector<std::string> accepted) {
  const std::string list = fmt::format("{}", fmt::join(accepted, ", "));
  return CLI::Validator(
      [accepted, list](std::string& value) -> std::string {
        for (const auto& a : accepted) {
          if (value == a) return "";
        }
        return fmt::format("\"{}\" is not accepted; use one of: {}", value, list);
      },
      fmt::format("{}", fmt::join(accepted, "|")));
}

CLI::Validator whole_number(int min, int max) {
  return CLI::Validator(
      [min, max](std::string& value) -> std::string {
        int n = 0;
        const char* end = value.data() + value.size();
        auto [at, ec] = std::from_chars(value.data(), end, n);
        if (ec == std::errc() && at == end && n >= min && n <= max) return "";
        return fmt::format("\"{}\" is not accepted; use a whole number from {} to {}", value, min,
                           max);
      },
      fmt::format("{}-{}", min, max));
}

// `cp`'s arguments as given, when `message` names neither: an error found
// deep below the destination (a parent folder it could not create, an
// absolute URI for a relative path) names what failed, which is not always
// what was typed.
std::string naming_arguments(std::string message, const std::string& src, const std::string& dst) {
  if (message.find(dst) != std::string::npos || message.find(src) != std::string::npos) {
    return message;
  }
  return fmt::format("cp {} {}: {}", src, dst, message);
}

template <typename View>
void print(const View& view, bool json) {
  std::cout << render(view, json);
  std::cout.flush();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cairn: list, inspect, verify, clean and copy Cairn checkpoints", "cairn"};
  app.require_subcommand(1);
  app.footer(kFooter);
  app.set_version_flag("-V,--version", kVersionLine,
                       "Print the version (cairn <version>) and exit");

  bool json = false;
  bool dry_run = false;
  std::string path;

  CLI::App* ls = app.add_subcommand(
      "ls", "List experiments and their checkpoints: state, time (UTC), size and metrics");
  ls->add_flag("--json", json, "Print one JSON document (schema in docs/cli.md)");
  ls->add_option("PATH", path, kRootHelp)->required();

  CLI::App* show = app.add_subcommand(
      "show",
      "Show one checkpoint: its files with sizes and checksums, manifest and metadata; or one "
      "trial of a Tuner experiment: its status, config, last result and checkpoints");
  show->add_flag("--json", json, "Print one JSON document (schema in docs/cli.md)");
  show->add_option("CHECKPOINT", path,
                   "the checkpoint folder, or a Tuner trial folder <experiment>/<trial> (a path "
                   "or URI)")
      ->required();

  CLI::App* verify = app.add_subcommand(
      "verify",
      "Check every file of every committed checkpoint against its manifest; exit 1 and name "
      "each bad file if any is missing, truncated or altered");
  verify->add_flag("--json", json, "Print one JSON document (schema in docs/cli.md)");
  verify->add_option("PATH", path, kAnyHelp)->required();

  CLI::App* gc = app.add_subcommand(
      "gc",
      "Remove leftovers of interrupted saves (uncommitted checkpoint folders and temporary "
      "files); experiments locked by a live writer are skipped");
  gc->add_flag("--dry-run", dry_run, "Report what would be removed without removing it");
  gc->add_flag("--json", json, "Print one JSON document (schema in docs/cli.md)");
  gc->add_option("PATH", path, kRootHelp)->required();

  int jobs = 8;
  bool no_progress = false;
  std::string destination;
  CLI::App* cp = app.add_subcommand(
      "cp",
      "Copy a committed checkpoint, or an experiment's committed checkpoints and history, "
      "between any two storages; verified, manifest last, resumable (a re-run skips files "
      "already in place)");
  cp->add_flag("--json", json, "Print one JSON document (schema in docs/cli.md)");
  cp->add_option("--jobs,-j", jobs, "Parallel reads and writes (default 8)")
      ->check(whole_number(1, 1024));
  cp->add_flag("--no-progress", no_progress, "Do not report progress on stderr");
  std::string verify_name = "auto";
  cp->add_option("--verify", verify_name,
                 "How copied files are checked before the manifest is written: checksum (read "
                 "back), size, or auto (size where the destination checks uploads itself, as S3 "
                 "does; checksum elsewhere)")
      ->check(one_of({"auto", "checksum", "size"}));
  cp->add_option("SRC", path, "a committed checkpoint or an experiment (a path or URI)")
      ->required();
  cp->add_option("DST", destination,
                 "where the checkpoint or experiment goes (a path or URI; it becomes the copy)")
      ->required();

  CLI::App* version =
      app.add_subcommand("version", "Print the version (cairn <version>) and exit, as --version");

  for (CLI::App* sub : {ls, show, verify, gc, cp, version}) sub->footer(kFooter);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::string message = e.what();
    if (app.get_subcommands().empty() && argc > 1 && argv[1][0] != '-') {
      message = fmt::format("unknown command \"{}\" (commands: ls, show, verify, gc, cp, version)",
                            argv[1]);
    }
    std::cerr << error_line(message + " (run `cairn --help` for usage)") << '\n';
    return kExitUsage;
  }

  try {
    if (ls->parsed()) {
      LsView view = collect_ls(path);
      auto warn = [](const std::string& error) {
        if (!error.empty()) std::cerr << render_text("cairn: warning: " + error) << '\n';
      };
      for (const auto& e : view.experiments) {
        warn(e.error);
        if (!e.tuner) continue;
        for (const auto& trial : e.tuner->trials) warn(trial.folder.error);
      }
      print(view, json);
    } else if (show->parsed()) {
      print(collect_show(path), json);
    } else if (verify->parsed()) {
      VerifyView view = collect_verify(path);
      print(view, json);
      return view.ok() ? kExitOk : kExitProblems;
    } else if (gc->parsed()) {
      print(collect_gc(path, dry_run), json);
    } else if (cp->parsed()) {
      const cairn::TransferVerify verify_mode =
          verify_name == "checksum" ? cairn::TransferVerify::kChecksum
          : verify_name == "size"   ? cairn::TransferVerify::kSize
                                    : cairn::TransferVerify::kAuto;
      cairn::TransferReport report;
      try {
        report = run_cp(path, destination, jobs, !no_progress, verify_mode);
      } catch (const cairn::Error& e) {
        std::cerr << render_text(error_line(naming_arguments(e.what(), path, destination))) << '\n';
        return exit_code_for(e.code());
      }
      std::cout << (json ? render_json(cp_to_json(report)) : render_text(cp_to_text(report)));
      std::cout.flush();
    } else if (version->parsed()) {
      std::cout << kVersionLine << '\n';
    }
    return kExitOk;
  } catch (const cairn::Error& e) {
    std::cerr << render_text(error_line(e.what())) << '\n';
    return exit_code_for(e.code());
  } catch (const std::exception& e) {
    std::cerr << error_line(std::string("internal error: ") + e.what()) << '\n';
    return kExitOtherError;
  }
}
