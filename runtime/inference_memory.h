// A bound on the host memory that model calls hold in tensors at once.
//
// The output-size check (LoadOptions::max_output_bytes) refuses calls whose
// outputs would be too large before anything runs, but it cannot see what a
// variant allocates for its intermediate buffers (a batch of attention
// scores grows with the square of the sequence), outputs whose sizes the
// capture could not write as expressions, or what an eager program
// allocates. Those all go through libtorch's CPU allocator, so that is where
// the bound is kept: once installed, every CPU tensor allocated by a thread
// inside a ChargedCall is counted until it is freed (on whichever thread),
// and an allocation that would take the count past the limit fails as
// libtorch's out-of-memory error does. The call ends there, its memory is
// given back, and ChargedCall::Explain turns its failure into
// RESOURCE_EXHAUSTED; the server and the calls beside it go on.
//
// The count covers what calls allocate on their own threads: buffers a
// libtorch operator allocates on its worker threads (small scratch space),
// CUDA memory and memory outside libtorch are not counted. Tensors a call
// returns are counted for as long as anything keeps them (a response being
// encoded, a sequence's state).
//
// This header is free of torch types: the server sets the limit without
// torch's headers.
#ifndef PRECOMPILE_RUNTIME_INFERENCE_MEMORY_H_
#define PRECOMPILE_RUNTIME_INFERENCE_MEMORY_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace precompile {

// Sets the limit, and with the first nonzero one routes libtorch's CPU
// allocations through the counter (tensors allocated before are not
// counted). 0 before that leaves libtorch's own allocator in place, counting
// nothing; 0 after it counts without refusing. Process-wide. Thread-safe.
void SetInferenceMemoryLimit(uint64_t limit_bytes);

// Bytes of CPU tensors allocated inside ChargedCalls and not freed yet.
uint64_t InferenceMemoryHeld();
uint64_t InferenceMemoryLimit();
// Allocations refused since the process started.
uint64_t InferenceMemoryRefusals();

// While alive, the CPU tensors this thread allocates are charged. Nested
// ones share the outermost's record.
class ChargedCall {
 public:
  ChargedCall();
  ~ChargedCall();
  ChargedCall(const ChargedCall&) = delete;
  ChargedCall& operator=(const ChargedCall&) = delete;

  // `failure` unchanged, unless an allocation of this call was refused:
  // then RESOURCE_EXHAUSTED naming `what` (e.g. "model 'bert'"), the bytes
  // asked for, those held by all calls and the limit.
  absl::Status Explain(absl::Status failure, absl::string_view what) const;

  struct Record {
    bool refused = false;
    uint64_t asked = 0;  // The refused allocation's bytes.
    uint64_t held = 0;   // What calls held when it was refused.
    uint64_t limit = 0;
    // Of `held`, what this call had allocated and not freed on its own
    // thread: with `asked`, past the limit means the call cannot run
    // however idle the server is.
    uint64_t own_held = 0;
    // What the call holds of its own now (own_held is this when refused:
    // the call's tensors are freed before it is explained), and the serial
    // that tells its allocations from others' as they are freed.
    uint64_t own = 0;
    uint64_t serial = 0;
  };

 private:
  Record own_;
  Record* record_;  // own_, or the outermost call's.
  bool outermost_;
};

// Host memory that model calls hold outside libtorch's allocator (a merged
// batch's stacked inputs), charged against the same limit for as long as
// this lives, whatever thread it is on.
class ChargedBytes {
 public:
  // `bytes` charged; or, when they would take what calls hold past the
  // limit, the status ChargedCall::Explain gives a refused tensor, naming
  // `what` (e.g. "model 'bert': merging 3 requests").
  static absl::StatusOr<ChargedBytes> Charge(uint64_t bytes, absl::string_view what);
  ChargedBytes(ChargedBytes&& other) noexcept;
  ChargedBytes& operator=(ChargedBytes&&) = delete;
  ChargedBytes(const ChargedBytes&) = delete;
  ~ChargedBytes();

 private:
  explicit ChargedBytes(uint64_t bytes) : bytes_(bytes) {}
  uint64_t bytes_;
};

// While alive, this thread's allocations are not charged, even inside a
// ChargedCall: for memory that belongs to a model, not to the call that
// happens to make it (the constants a variant's first run sets up).
class UnchargedSection {
 public:
  UnchargedSection();
  ~UnchargedSection();
  UnchargedSection(const UnchargedSection&) = delete;
  UnchargedSection& operator=(const UnchargedSection&) = delete;

 private:
  ChargedCall::Record* saved_;
};

}  // namespace precompile

#endif  // PRECOMPILE_RUNTIME_INFERENCE_MEMORY_H_
