// What precompile_client and precompile_load share on the command line,
// which CLI11 parses: the connection flags, checks for numeric flags, and a
// parse that reports problems as absl::Status (CLI11 throws). Each run of a
// tool builds its own CLI::App, so that the tools hold no global state and
// run in-process more than once, as their tests do.
//
// Flags are spelled --name=value or --name value, a bool flag alone or as
// --flag=true|false; a flag given twice keeps its last value unless it is
// one that may be repeated; "--" ends the flags.
//
// Thread safety: free functions; a CLI::App is used by one thread.
#ifndef PRECOMPILE_CLIENT_TOOL_FLAGS_H_
#define PRECOMPILE_CLIENT_TOOL_FLAGS_H_

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/client_options.h"

namespace precompile::client {

// A check for a numeric flag: a finite number >= `min`, or > `min` when
// `exclusive`. CLI11's message names the flag: "--timeout: expected a
// number > 0, got 'soon'".
CLI::Validator NumberAbove(double min, bool exclusive);

// The connection flags both tools take.
struct ConnectionFlags {
  std::string address = "127.0.0.1:8001";
  double timeout_seconds = 30;
  int max_attempts = 3;
  bool tls = false;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_server_name;
  std::string admin_token_file;
};

// Adds the connection flags to `app`, writing into `flags`, which must
// outlive the parse; their values now are the defaults --help shows.
void AddConnectionFlags(CLI::App& app, ConnectionFlags* flags);

// ClientOptions from the flags; reads the admin token file. INVALID_ARGUMENT
// or NOT_FOUND say which flag is wrong.
absl::StatusOr<ClientOptions> ClientOptionsFromFlags(const ConnectionFlags& flags);

// Adds the tool's flags to `app` with `add_flags` (after ConfigureApp),
// then parses `args` (the command line without the program name) into it.
// Sets `*help` when --help (or -h) was given: then app.help() is the text
// to print, that of the subcommand it followed. INVALID_ARGUMENT says what
// is wrong, naming the flag or argument: CLI11's message for a bad value or
// a missing one, and for what nothing took: "unknown flag --x", "--x
// applies to infer only" for a subcommand's flag given to another,
// "unknown command 'x'" when no subcommand was named, else "unexpected
// argument 'x'". INTERNAL if `add_flags` made CLI11 throw (a flag added
// twice).
absl::Status ParseCommandLine(CLI::App& app, const std::function<void(CLI::App&)>& add_flags,
                              const std::vector<std::string>& args, bool* help);

// The --help text of the tool `name` whose flags `add_flags` adds (with
// their defaults), or what is wrong with how it adds them.
std::string ToolUsage(const std::string& name, const std::function<void(CLI::App&)>& add_flags);

}  // namespace precompile::client

#endif  // PRECOMPILE_CLIENT_TOOL_FLAGS_H_
