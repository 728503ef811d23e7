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

// What the command line says, as CLI11 fills it in.
struct Options {
  bool json = false;
  bool check = false;  // ls --check
  bool dry_run = false;
  bool memory_tier = false;  // gc --memory-tier
  std::string path;
  int jobs = 8;
  bool no_progress = false;
  std::string destination;
  std::string verify_name = "auto";
};

struct Commands {
  CLI::App* ls = nullptr;
  CLI::App* show = nullptr;
  CLI::App* verify = nullptr;
  CLI::App* gc = nullptr;
  CLI::App* cp = nullptr;
  CLI::App* version = nullptr;
};

// The subcommands and their options, bound to `o`.
Commands define_commands(CLI::App& app, Options& o) {
  Commands c;
  c.ls = app.add_subcommand(
      "ls", "List experiments and their checkpoints: state, time (UTC), size and metrics");
  c.ls->add_flag("--json", o.json, "Print one JSON document (schema in docs/cli.md)");
  c.ls->add_flag("--check", o.check,
                 "Also read every checkpoint's manifest and flag one that is missing or "
                 "unreadable (without it, sizes and metrics come from the history)");
  c.ls->add_option("PATH", o.path, kRootHelp)->required();

  c.show = app.add_subcommand(
      "show",
      "Show one checkpoint: its files with sizes and checksums, manifest and metadata; or one "
      "trial of a Tuner experiment: its status, config, last result and checkpoints");
  c.show->add_flag("--json", o.json, "Print one JSON document (schema in docs/cli.md)");
  c.show
      ->add_option("CHECKPOINT", o.path,
                   "the checkpoint folder, or a Tuner trial folder <experiment>/<trial> (a path "
                   "or URI)")
      ->required();

  c.verify = app.add_subcommand(
      "verify",
      "Check every file of every committed checkpoint against its manifest; exit 1 and name "
      "each bad file if any is missing, truncated or altered");
  c.verify->add_flag("--json", o.json, "Print one JSON document (schema in docs/cli.md)");
  c.verify->add_option("PATH", o.path, kAnyHelp)->required();

  c.gc = app.add_subcommand(
      "gc",
      "Remove leftovers of interrupted saves (uncommitted checkpoint folders and temporary "
      "files); experiments locked by a live writer are skipped");
  c.gc->add_flag("--dry-run", o.dry_run, "Report what would be removed without removing it");
  c.gc->add_flag("--json", o.json, "Print one JSON document (schema in docs/cli.md)");
  c.gc->add_flag(
      "--memory-tier", o.memory_tier,
      "Free instead the memory tiers (RAM) of runs that died on this host, under PATH "
      "(default: $CAIRN_MEMORY_TIER_DIR, else /dev/shm); tiers of live runs are skipped");
  c.gc->add_option("PATH", o.path, kRootHelp);

  c.cp = app.add_subcommand(
      "cp",
      "Copy a committed checkpoint, or an experiment's committed checkpoints and history, "
      "between any two storages; verified, manifest last, resumable (a re-run skips files "
      "already in place)");
  c.cp->add_flag("--json", o.json, "Print one JSON document (schema in docs/cli.md)");
  c.cp->add_option("--jobs,-j", o.jobs, "Parallel reads and writes (default 8)")
      ->check(whole_number(1, 1024));
  c.cp->add_flag("--no-progress", o.no_progress, "Do not report progress on stderr");
  c.cp->add_option("--verify", o.verify_name,
                   "How copied files are checked before the manifest is written: checksum (read "
                   "back), size, or auto (size where the destination checks uploads itself, as S3 "
                   "does; checksum elsewhere)")
      ->check(one_of({"auto", "checksum", "size"}));
  c.cp->add_option("SRC", o.path, "a committed checkpoint or an experiment (a path or URI)")
      ->required();
  c.cp->add_option("DST", o.destination,
                   "where the checkpoint or experiment goes (a path or URI; it becomes the copy)")
      ->required();

  c.version =
      app.add_subcommand("version", "Print the version (cairn <version>) and exit, as --version");

  return c;
}

// `cairn cp`: its errors name the arguments as given.
int run_cp_command(const Options& o) {
  const cairn::TransferVerify verify_mode =
      o.verify_name == "checksum" ? cairn::TransferVerify::kChecksum
      : o.verify_name == "size"   ? cairn::TransferVerify::kSize
                                  : cairn::TransferVerify::kAuto;
  cairn::TransferReport report;
  try {
    report = run_cp(o.path, o.destination, o.jobs, !o.no_progress, verify_mode);
  } catch (const cairn::Error& e) {
    std::cerr << render_text(error_line(naming_arguments(e.what(), o.path, o.destination))) << '\n';
    return exit_code_for(e.code());
  }
  std::cout << (o.json ? render_json(cp_to_json(report)) : render_text(cp_to_text(report)));
  std::cout.flush();
  return kExitOk;
}

// Runs the parsed subcommand; its exit code.
int run_command(const Commands& c, const Options& o) {
  if (c.ls->parsed()) {
    LsView view = collect_ls(o.path, o.check);
    auto warn = [](const std::string& error) {
      if (!error.empty()) std::cerr << render_text("cairn: warning: " + error) << '\n';
    };
    for (const auto& e : view.experiments) {
      warn(e.error);
      if (!e.tuner) continue;
      for (const auto& trial : e.tuner->trials) warn(trial.folder.error);
    }
    print(view, o.json);
  } else if (c.show->parsed()) {
    print(collect_show(o.path), o.json);
  } else if (c.verify->parsed()) {
    VerifyView view = collect_verify(o.path);
    print(view, o.json);
    return view.ok() ? kExitOk : kExitProblems;
  } else if (c.gc->parsed()) {
    if (o.memory_tier) {
      print(collect_gc_memory_tiers(o.path, o.dry_run), o.json);
    } else if (o.path.empty()) {
      throw cairn::Error(cairn::ErrorCode::kInvalidArgument,
                         "gc: PATH is required (or --memory-tier)");
    } else {
      print(collect_gc(o.path, o.dry_run), o.json);
    }
  } else if (c.cp->parsed()) {
    return run_cp_command(o);
  } else if (c.version->parsed()) {
    std::cout << kVersionLine << '\n';
  }
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cairn: list, inspect, verify, clean and copy Cairn checkpoints", "cairn"};
  app.require_subcommand(1);
  app.footer(kFooter);
  app.set_version_flag("-V,--version", kVersionLine,
                       "Print the version (cairn <version>) and exit");

  Options o;
  const Commands c = define_commands(app, o);
  for (CLI::App* sub : {c.ls, c.show, c.verify, c.gc, c.cp, c.version}) sub->footer(kFooter);

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
    return run_command(c, o);
  } catch (const cairn::Error& e) {
    std::cerr << render_text(error_line(e.what())) << '\n';
    return exit_code_for(e.code());
  } catch (const std::exception& e) {
    std::cerr << error_line(std::string("internal error: ") + e.what()) << '\n';
    return kExitOtherError;
  }
}
