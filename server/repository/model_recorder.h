// What the server records of one served model version: the runtime's frame
// calls and warnings (a CallObserver), each finished request, each run of the
// model, and the statistics they add up to. The repository hands one to each
// version it loads without knowing how it records; ModelMetrics
// (server/metrics/metrics.h) is the server's, as Prometheus series.
//
// Thread safety: implementations take calls from any thread.
#ifndef PRECOMPILE_SERVER_REPOSITORY_MODEL_RECORDER_H_
#define PRECOMPILE_SERVER_REPOSITORY_MODEL_RECORDER_H_

#include <cstdint>

#include "absl/time/time.h"
#include "runtime/observer.h"

namespace precompile::server {

// How a request ended, as the request counter labels it.
enum class RequestOutcome : uint8_t {
  kVariant,
  kEagerFallback,
  kRefused,         // FAILED_PRECONDITION: no variant and not flagged.
  kInvalid,         // INVALID_ARGUMENT: a malformed request.
  kOverloaded,      // RESOURCE_EXHAUSTED: over the concurrency limit.
  kCancelled,       // The client cancelled it or its deadline passed.
  kError,           // Anything else.
};
constexpr int kNumRequestOutcomes = 7;
const char* RequestOutcomeName(RequestOutcome outcome);

// Where a request's time went, for Triton's statistics: waiting for
// admission, decoding inputs, running the model, encoding outputs.
struct RequestTiming {
  absl::Duration queue;
  absl::Duration input;
  absl::Duration infer;
  absl::Duration output;
  absl::Duration total;
  // The inferences it counts for (its rows, for a batching model).
  int64_t inferences = 1;
};

// Cumulative counts and durations of a model version's requests, in the
// layout of Triton's ModelStatistics (nanoseconds).
struct InferStatistics {
  uint64_t success_count = 0, success_ns = 0;
  uint64_t fail_count = 0, fail_ns = 0;
  uint64_t queue_count = 0, queue_ns = 0;
  uint64_t input_count = 0, input_ns = 0;
  uint64_t infer_count = 0, infer_ns = 0;
  uint64_t output_count = 0, output_ns = 0;
  uint64_t last_inference_ms = 0;  // Since the Unix epoch; 0 if none yet.
  // Rows of successful requests, and runs of the model that served them.
  uint64_t inference_count = 0;
  uint64_t execution_count = 0;
};

class ModelRecorder : public CallObserver {
 public:
  // A finished request of this model version.
  virtual void RecordRequest(RequestOutcome outcome, const RequestTiming& timing) = 0;
  // One run of the model that served requests of `rows` rows in all (one
  // request's, or a merged batch's).
  virtual void RecordExecution(int64_t rows) = 0;
  virtual InferStatistics Statistics() const = 0;
};

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_REPOSITORY_MODEL_RECORDER_H_
