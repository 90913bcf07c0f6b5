// precompile_test::gate(Tensor x) -> Tensor: returns a copy of x, after
// waiting at a gate that a test holds closed. Lets a test see how many calls
// of one compiled variant run at once (how many AOTInductor runners it has)
// without measuring time: each call that reaches the op says so with a file,
// and none leaves it before the test opens the gate.
//
// Loaded into the server with --op_library. The gate lives in the directory
// named by PRECOMPILE_TEST_GATE_DIR: a call creates `entered.<n>` there, then
// waits for a file `open`. Without the variable the op is a plain copy.
#include <torch/library.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>

#include <unistd.h>

namespace {

at::Tensor Gate(const at::Tensor& x) {
  const char* dir = std::getenv("PRECOMPILE_TEST_GATE_DIR");
  if (dir != nullptr) {
    static std::atomic<int> calls{0};
    const std::filesystem::path gate(dir);
    std::ofstream(gate / ("entered." + std::to_string(getpid()) + "." +
                          std::to_string(calls.fetch_add(1))));
    // A test that never opens the gate fails on its own deadline long before
    // this one; the bound only keeps a broken test from hanging the server.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
    while (!std::filesystem::exists(gate / "open")) {
      if (std::chrono::steady_clock::now() > deadline) {
        throw std::runtime_error("precompile_test::gate: never opened");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  return x.clone();
}

}  // namespace

TORCH_LIBRARY(precompile_test, m) { m.def("gate(Tensor x) -> Tensor"); }

TORCH_LIBRARY_IMPL(precompile_test, CPU, m) { m.impl("gate", &Gate); }
