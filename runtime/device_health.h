// Whether the process's accelerator still works. A CUDA error that poisons
// the context (a device-side assert in compiled code, an illegal address)
// fails every later call on the device, and only a new process recovers. The
// runtime reports one here when a call on CUDA fails and a probe of the
// device then fails too; the server stops calling itself live, so that the
// orchestrator restarts it.
//
// Process-wide, as a CUDA context is. Thread safety: all functions may be
// called concurrently.
#ifndef PRECOMPILE_RUNTIME_DEVICE_HEALTH_H_
#define PRECOMPILE_RUNTIME_DEVICE_HEALTH_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace precompile {

// Records that the device is lost, and why; the first report is kept.
void ReportDeviceLost(absl::string_view reason);

// Why the device is lost, or nullopt while it works.
std::optional<std::string> DeviceLostReason();

}  // namespace precompile

#endif  // PRECOMPILE_RUNTIME_DEVICE_HEALTH_H_
