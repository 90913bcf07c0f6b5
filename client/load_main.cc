// precompile_load: see client/load_tool.h, or run it with --help.
#include <iostream>
#include <string>
#include <vector>

#include "client/load_tool.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  return precompile::client::RunLoadTool(args, std::cout, std::cerr);
}
