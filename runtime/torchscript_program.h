// The TorchScript backend of EagerProgram: programs the capture tool saved
// with torch.jit.save, whose calls of other frames go through the
// precompile::call_frame operator (runtime/frame_caller.h).
#ifndef PRECOMPILE_RUNTIME_TORCHSCRIPT_PROGRAM_H_
#define PRECOMPILE_RUNTIME_TORCHSCRIPT_PROGRAM_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/dtype.h"
#include "runtime/eager_program.h"

namespace precompile {

// Loads the program of `frame` saved at `path`, with its parameters on
// `device`.
absl::StatusOr<std::unique_ptr<EagerProgram>> LoadTorchScriptProgram(
    const std::string& frame, const std::string& path, DeviceType device);

}  // namespace precompile

#endif  // PRECOMPILE_RUNTIME_TORCHSCRIPT_PROGRAM_H_
