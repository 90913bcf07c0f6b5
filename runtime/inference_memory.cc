#include "runtime/inference_memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"

namespace precompile {
namespace {

// Each allocation starts with what it was charged and the serial of the
// call charged, so that its deleter (a plain function of the data pointer,
// as libtorch's raw allocations need) can give it back, and tell the call
// while it runs. 64 keeps the data at libtorch's alignment (c10's
// gAlignment).
constexpr size_t kHeader = 64;

std::atomic<uint64_t> held_bytes{0};
std::atomic<uint64_t> limit_bytes{0};
std::atomic<uint64_t> refusals{0};
std::atomic<bool> counting{false};  // Whether the counting allocator is installed.
std::atomic<uint64_t> next_serial{1};
thread_local ChargedCall::Record* current_call = nullptr;

void Free(void* data) {
  if (data == nullptr) return;
  char* base = static_cast<char*>(data) - kHeader;
  uint64_t charged, serial;
  std::memcpy(&charged, base, sizeof charged);
  std::memcpy(&serial, base + sizeof charged, sizeof serial);
  if (charged != 0) {
    held_bytes.fetch_sub(charged, std::memory_order_relaxed);
    ChargedCall::Record* call = current_call;
    if (call != nullptr && call->serial == serial) call->own -= std::min(call->own, charged);
  }
  c10::free_cpu(base);
}

[[noreturn]] void Refuse(uint64_t asked, uint64_t held, uint64_t limit,
                         ChargedCall::Record& record) {
  record.refused = true;
  record.asked = asked;
  record.held = held;
  record.limit = limit;
  record.own_held = record.own;
  refusals.fetch_add(1, std::memory_order_relaxed);
  // No backtrace: the message is all a log or a Python traceback needs.
  throw c10::OutOfMemoryError(
      absl::StrCat("a CPU tensor of ", asked, " bytes would take what the model calls running "
                   "hold (", held, " bytes) past --max_inference_memory_bytes (", limit, ")"),
      c10::Backtrace());
}

// Adds `n` to what calls hold unless that would pass the limit; false then,
// with what they held and the limit.
bool TryCharge(uint64_t n, uint64_t& held, uint64_t& limit) {
  limit = limit_bytes.load(std::memory_order_relaxed);
  held = held_bytes.load(std::memory_order_relaxed);
  do {
    if (limit != 0 && (n > limit || held > limit - n)) return false;
  } while (!held_bytes.compare_exchange_weak(held, held + n, std::memory_order_relaxed));
  return true;
}

void Charge(uint64_t n, ChargedCall::Record& record) {
  uint64_t held, limit;
  if (!TryCharge(n, held, limit)) Refuse(n, held, limit, record);
  record.own += n;
}

absl::Status Refusal(const ChargedCall::Record& r, absl::string_view what,
                     absl::string_view asked_for) {
  if (r.asked > r.limit || r.own_held > r.limit - r.asked) {
    // Never fits, however idle the server: a retry would only fail again.
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": this call asked for ", asked_for, " of ", r.asked, " bytes",
        // What the call held matters only where the tensor alone fits.
        r.asked > r.limit || r.own_held == 0
            ? ""
            : absl::StrCat(" while it held ", r.own_held, " of its own"),
        ", more than the ", r.limit,
        " bytes all model calls may hold at once (--max_inference_memory_bytes); send smaller "
        "inputs"));
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      what, ": this call asked for ", asked_for, " of ", r.asked,
      " bytes when the model calls running held ", r.held, ", past the ", r.limit,
      " bytes they may hold at once (--max_inference_memory_bytes); retry later, or send "
      "smaller inputs"));
}

class CountingCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    const c10::Device cpu(c10::DeviceType::CPU);
    if (n == 0) return {nullptr, nullptr, &Free, cpu};
    ChargedCall::Record* call = current_call;
    if (n > std::numeric_limits<size_t>::max() - kHeader) {
      if (call != nullptr) Refuse(n, InferenceMemoryHeld(), InferenceMemoryLimit(), *call);
      throw c10::OutOfMemoryError(absl::StrCat("a CPU tensor of ", n, " bytes"), c10::Backtrace());
    }
    const uint64_t charged = call != nullptr ? n : 0;
    if (call != nullptr) Charge(n, *call);
    void* base = nullptr;
    try {
      base = c10::alloc_cpu(n + kHeader);
    } catch (...) {
      if (charged != 0) held_bytes.fetch_sub(charged, std::memory_order_relaxed);
      throw;
    }
    const uint64_t serial = call != nullptr ? call->serial : 0;
    std::memcpy(base, &charged, sizeof charged);
    std::memcpy(static_cast<char*>(base) + sizeof charged, &serial, sizeof serial);
    void* data = static_cast<char*>(base) + kHeader;
    return {data, data, &Free, cpu};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &Free; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

}  // namespace

void SetInferenceMemoryLimit(uint64_t limit) {
  static std::once_flag installed;
  // Nothing to bound: libtorch's allocator stays (an operator's way out).
  if (limit == 0 && !counting.load()) return;
  std::call_once(installed, [] {
    // Never destroyed: tensors freed at exit still reach it.
    c10::SetCPUAllocator(new CountingCpuAllocator(), /*priority=*/1);
    counting.store(true);
  });
  limit_bytes.store(limit, std::memory_order_relaxed);
}

uint64_t InferenceMemoryHeld() { return held_bytes.load(std::memory_order_relaxed); }
uint64_t InferenceMemoryLimit() { return limit_bytes.load(std::memory_order_relaxed); }
uint64_t InferenceMemoryRefusals() { return refusals.load(std::memory_order_relaxed); }

ChargedCall::ChargedCall() : record_(current_call), outermost_(current_call == nullptr) {
  if (outermost_) {
    own_.serial = next_serial.fetch_add(1, std::memory_order_relaxed);
    record_ = &own_;
    current_call = record_;
  }
}

ChargedCall::~ChargedCall() {
  if (outermost_) current_call = nullptr;
}

absl::Status ChargedCall::Explain(absl::Status failure, absl::string_view what) const {
  if (failure.ok() || !record_->refused) return failure;
  return Refusal(*record_, what, "a tensor");
}

absl::StatusOr<ChargedBytes> ChargedBytes::Charge(uint64_t bytes, absl::string_view what) {
  uint64_t held, limit;
  if (!TryCharge(bytes, held, limit)) {
    refusals.fetch_add(1, std::memory_order_relaxed);
    return Refusal({true, bytes, held, limit}, what, "stacked inputs");
  }
  return ChargedBytes(bytes);
}

ChargedBytes::ChargedBytes(ChargedBytes&& other) noexcept : bytes_(other.bytes_) {
  other.bytes_ = 0;
}

ChargedBytes::~ChargedBytes() {
  if (bytes_ != 0) held_bytes.fetch_sub(bytes_, std::memory_order_relaxed);
}

UnchargedSection::UnchargedSection() : saved_(current_call) { current_call = nullptr; }
UnchargedSection::~UnchargedSection() { current_call = saved_; }

}  // namespace precompile
