// precompile_client: a command-line client of precompile-serve. One
// subcommand per call (infer, metadata, config, summary, frames, coverage,
// warnings, models, load, unload, rescan, health); human-readable output by
// default, JSON with stable keys under --json.
//
// The tool is a function so that tests (and other programs) run it
// in-process; the binary's main() only forwards its arguments.
#ifndef PRECOMPILE_CLIENT_CLI_H_
#define PRECOMPILE_CLIENT_CLI_H_

#include <ostream>
#include <string>
#include <vector>

namespace precompile::client {

// Exit statuses of RunCli.
inline constexpr int kExitOk = 0;
// The server returned an error (its status code name and message are
// printed), the health check was not SERVING, or a result could not be saved.
inline constexpr int kExitFailed = 1;
// The command line was wrong: unknown command or flag, missing argument,
// unreadable or malformed input.
inline constexpr int kExitUsage = 2;

// Runs the tool with `args` (the command line without the program name),
// writing results to `out` and diagnostics to `err`. Returns the exit status.
// Thread safety: concurrent runs share nothing.
int RunCli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// The usage text printed by --help and after a usage error.
std::string CliUsage();

}  // namespace precompile::client

#endif  // PRECOMPILE_CLIENT_CLI_H_
