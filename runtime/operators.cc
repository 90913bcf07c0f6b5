#include "runtime/operators.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace precompile {
namespace {

// "ns::name" or "ns::name.overload", as AOTInductor names it.
bool Registered(const std::string& name) {
  const size_t namespace_end = name.find("::");
  const size_t dot = name.find('.', namespace_end == std::string::npos ? 0 : namespace_end);
  c10::OperatorName op(name.substr(0, dot),
                       dot == std::string::npos ? "" : name.substr(dot + 1));
  return c10::Dispatcher::singleton().findSchema(op).has_value();
}

}  // namespace

absl::Status ProvideOperators(const artifact::v1::Manifest& manifest,
                              const PythonSettings& python) {
  std::vector<const artifact::v1::Operator*> missing;
  std::vector<std::string> modules;
  for (const artifact::v1::Operator& op : manifest.operators()) {
    if (Registered(op.name())) continue;
    if (op.python_module().empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "its compiled code calls the operator ", op.name(),
          ", which no library loaded into this server defines (load one that does with "
          "--op_library)"));
    }
    if (!python.allowed) {
      return absl::FailedPreconditionError(absl::StrCat(
          "its compiled code calls the operator ", op.name(), ", defined in Python by ",
          op.python_module(), ": this server imports that module to run it only when started "
          "with --allow_python_programs (importing it runs its code); or load a C++ "
          "implementation of the operator with --op_library"));
    }
    missing.push_back(&op);
    if (absl::c_find(modules, op.python_module()) == modules.end()) {
      modules.push_back(op.python_module());
    }
  }
  if (missing.empty()) return absl::OkStatus();
  if (absl::Status imported = ImportPythonModules(modules, manifest.python(), python);
      !imported.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "its compiled code calls operators defined in Python (",
        absl::StrJoin(missing, ", ",
                      [](std::string* out, const artifact::v1::Operator* op) {
                        absl::StrAppend(out, op->name());
                      }),
        "): ", imported.message()));
  }
  for (const artifact::v1::Operator* op : missing) {
    if (!Registered(op->name())) {
      return absl::FailedPreconditionError(
          absl::StrCat("its compiled code calls the operator ", op->name(), ", which importing ",
                       op->python_module(), " did not define"));
    }
  }
  return absl::OkStatus();
}

}  // namespace precompile
