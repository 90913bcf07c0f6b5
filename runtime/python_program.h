// The Python backend of EagerProgram: a flagged frame's own Python, saved by
// the capture tool (capture/precompile_capture/python_program.py) and run by
// the interpreter of the Python plugin (runtime/python_plugin.h), which is
// loaded and started when the first such program loads.
#ifndef PRECOMPILE_RUNTIME_PYTHON_PROGRAM_H_
#define PRECOMPILE_RUNTIME_PYTHON_PROGRAM_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/artifact.pb.h"
#include "runtime/dtype.h"
#include "runtime/eager_program.h"

namespace precompile {

struct PythonSettings {
  // Whether Python eager programs may load at all: loading one unpickles it
  // (torch.load), which runs whatever code it names. Default: false.
  bool allowed = false;
  // The Python environment to run (a directory holding bin/python3): the
  // one the artifacts' programs were captured in, or one with the same
  // packages. Empty: the environment this project was built with.
  std::string environment;
  // The plugin library. Empty: runtime/libprecompile_python.so beside the
  // running binary's directory (as Bazel lays out bin/ and runfiles).
  std::string plugin;
  // Directories put first on the interpreter's sys.path (the models' own
  // code): the interpreter reads no PYTHONPATH.
  std::vector<std::string> path;
};

// Loads the Python program of `frame` saved at `path`, with its weights on
// `device`, after checking that the environment has what `needs` names.
// FAILED_PRECONDITION when Python programs are not allowed, or when the
// plugin, the interpreter or a module the artifact needs is missing; the
// message says which.
absl::StatusOr<std::unique_ptr<EagerProgram>> LoadPythonProgram(
    const std::string& frame, const std::string& path, DeviceType device,
    const artifact::v1::PythonEnvironment& needs, const PythonSettings& settings);

// Imports each of `modules` in the Python plugin's interpreter (started as
// for a program, its environment checked against `needs`), for what
// importing them registers: operators that compiled code calls, defined in
// Python. The caller decides whether Python may run (settings.allowed).
// FAILED_PRECONDITION, saying why, when the plugin, the interpreter or a
// module is missing or an import raises.
absl::Status ImportPythonModules(const std::vector<std::string>& modules,
                                 const artifact::v1::PythonEnvironment& needs,
                                 const PythonSettings& settings);

}  // namespace precompile

#endif  // PRECOMPILE_RUNTIME_PYTHON_PROGRAM_H_
