// precompile_client: see client/cli.h, or run it with --help.
#include <iostream>
#include <string>
#include <vector>

#include "client/cli.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  return precompile::client::RunCli(args, std::cout, std::cerr);
}
