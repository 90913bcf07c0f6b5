// The interface between the runtime and its Python plugin
// (libprecompile_python.so, runtime/python_interpreter.cc), which embeds the
// CPython interpreter that runs Python eager programs and the operators
// defined in Python that compiled code calls (runtime/operators.h).
//
// The interpreter lives in a plugin, loaded with dlopen when the first
// artifact that needs Python loads, so that the server neither
// links libpython nor starts Python (nor imports torch's Python half, which
// brings CUDA's libraries along) to serve artifacts without Python. Both
// sides are built by this project with one toolchain and share libtorch and
// the C++ standard library, so std::string and c10::IValue may cross; Abseil
// and the protos, linked into each side separately, may not.
#ifndef PRECOMPILE_RUNTIME_PYTHON_PLUGIN_H_
#define PRECOMPILE_RUNTIME_PYTHON_PLUGIN_H_

#include <string>
#include <utility>
#include <vector>

namespace c10 {
struct IValue;
}

namespace precompile {

// Bumped whenever PythonPlugin changes.
inline constexpr int kPythonPluginAbi = 3;

// What a failed call reports.
struct PythonError {
  // One line: "TypeError: unsupported operand ..." for an exception.
  std::string message;
  // The Python traceback, when there is one.
  std::string traceback;
  // The program was ended by `stop` (PythonPlugin::run).
  bool stopped = false;
};

struct PythonPlugin {
  int abi;
  // Starts the interpreter of the Python environment at `environment` (a
  // virtual environment or an installation: the directory holding
  // bin/python3) once per process, isolated (as `python3 -I`: no PYTHON*
  // environment variables, no user site-packages, not the working
  // directory), with the directories of `path` first on sys.path. Later
  // calls with the same environment and path succeed at once; with others,
  // fail.
  bool (*start)(const std::string& environment, const std::vector<std::string>& path,
                PythonError* error);
  // Whether the interpreter can run programs captured under
  // `python_version` that need `modules` ((name, version) pairs).
  bool (*check_environment)(const std::string& python_version,
                            const std::vector<std::pair<std::string, std::string>>& modules,
                            PythonError* error);
  // Imports `module` (for what importing it registers, such as operators
  // defined in Python).
  bool (*import_module)(const std::string& module, PythonError* error);
  // Loads the program of `frame` saved at `path` with its weights on
  // `device` ("cpu" or "cuda"); nullptr on failure.
  void* (*load)(const std::string& frame, const std::string& path, const std::string& device,
                PythonError* error);
  // Runs `program` on one value per parameter; fills `leaves` with the
  // leaves of its result in torch.utils._pytree's order. Thread-safe.
  // `stop(stop_context)`, polled from another thread while the program runs
  // (null: never), ends it when true: the program's thread raises
  // precompile_eager.Stopped at its next Python instruction, and the call
  // fails with `stopped` set.
  bool (*run)(void* program, std::vector<c10::IValue>& args, std::vector<c10::IValue>* leaves,
              bool (*stop)(const void* stop_context), const void* stop_context,
              PythonError* error);
  void (*release)(void* program);
};

}  // namespace precompile

// The plugin's one exported symbol.
extern "C" const precompile::PythonPlugin* PrecompilePythonPlugin();

#endif  // PRECOMPILE_RUNTIME_PYTHON_PLUGIN_H_
