// precompile_load: the load generator's command line (load_generator.h).
// It sends only to the given address, refuses anything but a loopback
// address unless --allow_remote is given, and stops by itself after its
// duration or request count.
//
// The tool is a function so that tests run it in-process; the binary's
// main() only forwards its arguments.
#ifndef PRECOMPILE_CLIENT_LOAD_TOOL_H_
#define PRECOMPILE_CLIENT_LOAD_TOOL_H_

#include <ostream>
#include <string>
#include <vector>

namespace precompile::client {

// Runs the tool with `args` (without the program name): the report tables go
// to `out`, progress and diagnostics to `err`. Returns 0 when the run
// completed (whatever the server answered), 1 when it could not run (the
// report could not be written), 2 for a usage error (including a remote
// address without --allow_remote).
int RunLoadTool(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

std::string LoadToolUsage();

}  // namespace precompile::client

#endif  // PRECOMPILE_CLIENT_LOAD_TOOL_H_
