#include "runtime/device_health.h"

#include <atomic>
#include <mutex>

namespace precompile {
namespace {

std::atomic<bool> lost{false};
std::mutex reason_mu;
std::string& Reason() {
  static auto* reason = new std::string;
  return *reason;
}

}  // namespace

void ReportDeviceLost(absl::string_view reason) {
  std::lock_guard<std::mutex> lock(reason_mu);
  if (lost.load()) return;
  Reason() = std::string(reason);
  lost.store(true);
}

std::optional<std::string> DeviceLostReason() {
  if (!lost.load()) return std::nullopt;
  std::lock_guard<std::mutex> lock(reason_mu);
  return Reason();
}

}  // namespace precompile
