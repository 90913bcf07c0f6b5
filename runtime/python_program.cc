// EagerProgram on the Python plugin's interpreter.
#include "runtime/python_program.h"

#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "runtime/frame_caller.h"
#include "runtime/python_plugin.h"
#include "spdlog/spdlog.h"

#ifndef PRECOMPILE_PYTHON_ENVIRONMENT
#define PRECOMPILE_PYTHON_ENVIRONMENT ""
#endif

namespace precompile {
namespace {

std::string DefaultPluginPath() {
  char exe[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return "libprecompile_python.so";
  std::string dir(exe, static_cast<size_t>(n));
  dir = dir.substr(0, dir.rfind('/'));
  return dir + "/../runtime/libprecompile_python.so";
}

// The plugin, loaded once per process; a failed load is final.
absl::StatusOr<const PythonPlugin*> Plugin(const std::string& requested) {
  static std::once_flag once;
  static const PythonPlugin* plugin = nullptr;
  static std::string* failure = new std::string;
  std::call_once(once, [&] {
    const std::string path = requested.empty() ? DefaultPluginPath() : requested;
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      *failure = absl::StrCat("cannot load the Python plugin ", path, ": ", dlerror());
      return;
    }
    using Entry = const PythonPlugin* (*)();
    auto entry = reinterpret_cast<Entry>(dlsym(handle, "PrecompilePythonPlugin"));
    if (entry == nullptr || entry()->abi != kPythonPluginAbi) {
      *failure = absl::StrCat("the Python plugin ", path,
                              " is not this server's (another build's interface)");
      return;
    }
    plugin = entry();
  });
  if (plugin == nullptr) return absl::FailedPreconditionError(*failure);
  return plugin;
}

// The plugin, its interpreter started, once it has what `needs` names.
absl::StatusOr<const PythonPlugin*> StartedPlugin(const artifact::v1::PythonEnvironment& needs,
                                                  const PythonSettings& settings) {
  ASSIGN_OR_RETURN(const PythonPlugin* plugin, Plugin(settings.plugin));
  const std::string environment =
      settings.environment.empty() ? PRECOMPILE_PYTHON_ENVIRONMENT : settings.environment;
  PythonError error;
  if (!plugin->start(environment, settings.path, &error)) {
    return absl::FailedPreconditionError(error.message);
  }
  std::vector<std::pair<std::string, std::string>> modules;
  for (const auto& m : needs.modules()) modules.emplace_back(m.name(), m.version());
  if (!plugin->check_environment(needs.python_version(), modules, &error)) {
    return absl::FailedPreconditionError(error.message);
  }
  return plugin;
}

class PythonProgram final : public EagerProgram {
 public:
  PythonProgram(std::string frame, const PythonPlugin* plugin, void* program)
      : frame_(std::move(frame)), plugin_(plugin), program_(program) {}
  ~PythonProgram() override { plugin_->release(program_); }

  absl::StatusOr<std::vector<c10::IValue>> Run(std::vector<c10::IValue> args) const override {
    std::vector<c10::IValue> leaves;
    PythonError error;
    // The call's predicate, polled by the plugin's watcher thread.
    const std::function<bool()>* cancelled = CurrentCancellation();
    auto stop = [](const void* predicate) {
      return (*static_cast<const std::function<bool()>*>(predicate))();
    };
    if (plugin_->run(program_, args, &leaves, cancelled != nullptr ? +stop : nullptr, cancelled,
                     &error)) {
      return leaves;
    }
    if (error.stopped) {
      return absl::CancelledError(absl::StrCat(
          "the call was cancelled (or ran past its deadline) while frame '", frame_,
          "' ran its Python eager program"));
    }
    // A callee's refusal or error passes through the program unchanged.
    if (std::optional<absl::Status> callee = TakeCalleeStatus()) return *std::move(callee);
    if (!error.traceback.empty()) {
      std::call_once(traceback_logged_, [&] {
        spdlog::error("event=python_eager_error frame={} traceback=\"{}\"", frame_,
                      error.traceback);
      });
    }
    return absl::InternalError(absl::StrCat("frame '", frame_,
                                            "': its Python eager program failed: ",
                                            error.message));
  }

 private:
  const std::string frame_;
  const PythonPlugin* const plugin_;
  void* const program_;
  // The first traceback of a frame is logged; later ones are the same story.
  mutable std::once_flag traceback_logged_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<EagerProgram>> LoadPythonProgram(
    const std::string& frame, const std::string& path, DeviceType device,
    const artifact::v1::PythonEnvironment& needs, const PythonSettings& settings) {
  if (!settings.allowed) {
    return absl::FailedPreconditionError(absl::StrCat(
        "frame '", frame, "' has a Python eager program, which this server loads only when "
        "started with --allow_python_programs: loading one unpickles it, which runs the code "
        "it names"));
  }
  ASSIGN_OR_RETURN(const PythonPlugin* plugin, StartedPlugin(needs, settings));
  PythonError error;
  void* program = plugin->load(frame, path, device == DeviceType::kCuda ? "cuda" : "cpu", &error);
  if (program == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot load the Python eager program of frame '", frame, "': ",
                     error.message));
  }
  return std::unique_ptr<EagerProgram>(new PythonProgram(frame, plugin, program));
}

absl::Status ImportPythonModules(const std::vector<std::string>& modules,
                                 const artifact::v1::PythonEnvironment& needs,
                                 const PythonSettings& settings) {
  ASSIGN_OR_RETURN(const PythonPlugin* plugin, StartedPlugin(needs, settings));
  for (const std::string& module : modules) {
    PythonError error;
    if (!plugin->import_module(module, &error)) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot import the Python module ", module, ": ", error.message));
    }
  }
  return absl::OkStatus();
}

}  // namespace precompile
