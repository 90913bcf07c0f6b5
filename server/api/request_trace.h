// Request traces in the shape of Triton's trace extension: which requests
// are traced (settings for the server and per model, changed at run time
// through `/v2/trace/setting` and the TraceSetting RPC), and the trace file
// they are written to.
//
// Settings, as Triton names them (each a list of strings on the wire):
//   trace_level    OFF or TIMESTAMPS (TENSORS is not supported);
//   trace_rate     every Nth request is traced (N >= 1);
//   trace_count    how many more are traced; -1: no end. It counts down,
//                  and reads back as what is left;
//   log_frequency  0: every trace goes to trace_file; N: every N traces
//                  go to a file of their own, trace_file.0, trace_file.1, ...
//   trace_file     where: set only by the server's flag (a client that may
//                  change settings still may not choose where the server
//                  writes).
// A model's own settings override the server's field by field; clearing one
// (null on the wire) makes it follow the server's again. A model with any
// setting of its own has its own count and rate counter.
//
// A trace file is a JSON array of objects, as Triton writes it: per traced
// request one object with its id, model, version and request id, one with
// its timestamps (Triton's names and this server's, in order), and one
// with its frame calls (this server's own: frame, outcome, variant, guard
// and run time). Its closing bracket is written when the file is done
// (log_frequency reached, or the tracer destroyed): a file still being
// written lacks it.
//
// Cost when no level is TIMESTAMPS: Sample() reads one atomic flag.
//
// Thread safety: all methods may be called concurrently.
#ifndef PRECOMPILE_SERVER_API_REQUEST_TRACE_H_
#define PRECOMPILE_SERVER_API_REQUEST_TRACE_H_

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "runtime/observer.h"

namespace precompile::server {

// One level of settings: what it sets.
struct TraceConfig {
  std::optional<bool> timestamps;  // trace_level: TIMESTAMPS (true) or OFF.
  std::optional<int64_t> rate;
  std::optional<int64_t> count;
  std::optional<int64_t> log_frequency;
};

// What one traced request did, for RequestTracer::Write.
struct RequestTrace {
  uint64_t id = 0;
  std::string model;
  int64_t version = 0;
  std::string request_id;
  std::string outcome;
  // In order of time: Triton's REQUEST_START, QUEUE_START, COMPUTE_START,
  // COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END, REQUEST_END, and
  // between them this server's waits (EAGER_QUEUE_START / EAGER_START,
  // BATCH_QUEUE_START / BATCH_START).
  std::vector<std::pair<const char*, absl::Time>> timestamps;
  std::vector<FrameCallEvent> frame_calls;
};

class RequestTracer {
 public:
  // Settings as on the wire: name -> values.
  using Settings = std::map<std::string, std::vector<std::string>>;
  // A change: a setting's new values, or nullopt to clear a model's own.
  using Changes = std::map<std::string, std::optional<std::vector<std::string>>>;

  // `file`: where traces go; empty: nowhere, and no level but OFF is taken.
  // Fields `server` leaves unset take Triton's defaults (OFF, rate 1000,
  // count -1, log_frequency 0).
  RequestTracer(std::string file, TraceConfig server);
  // Finishes the file being written.
  ~RequestTracer();
  RequestTracer(const RequestTracer&) = delete;
  RequestTracer& operator=(const RequestTracer&) = delete;

  // Parses settings as a flag or the wire gives them; INVALID_ARGUMENT
  // naming the setting and the value. Unknown settings are refused.
  static absl::StatusOr<TraceConfig> Parse(const Changes& changes, bool allow_clear);

  // The settings in effect for `model` ("": the server's).
  Settings Get(absl::string_view model) const ABSL_LOCKS_EXCLUDED(mu_);
  // Applies `changes` to `model`'s settings ("": the server's) and returns
  // those in effect after. Changing nothing: INVALID_ARGUMENT for a value
  // that does not parse, for trace_file, or for a model's log_frequency;
  // FAILED_PRECONDITION for a level other than OFF without a file. The
  // caller checks that `model` exists.
  absl::StatusOr<Settings> Update(absl::string_view model, const Changes& changes)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Whether this request of `model` is traced: its trace id, else 0.
  uint64_t Sample(absl::string_view model) ABSL_LOCKS_EXCLUDED(mu_);
  // Writes a sampled request's trace. Errors writing are logged once.
  void Write(const RequestTrace& trace) ABSL_LOCKS_EXCLUDED(file_mu_);

 private:
  struct Level {
    TraceConfig own;
    int64_t seen = 0;  // Requests counted toward the rate.
  };
  TraceConfig EffectiveLocked(const Level* model) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateEnabledLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Settings SettingsOf(const TraceConfig& c) const;
  void FinishFileLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(file_mu_);

  const std::string file_;
  // Whether any level traces: the one read on every request.
  std::atomic<bool> enabled_{false};
  mutable std::mutex mu_;
  Level server_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Level> models_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;

  std::mutex file_mu_;
  std::FILE* out_ ABSL_GUARDED_BY(file_mu_) = nullptr;
  int64_t in_file_ ABSL_GUARDED_BY(file_mu_) = 0;   // Traces in the open file.
  int64_t file_index_ ABSL_GUARDED_BY(file_mu_) = 0;
  bool write_failed_ ABSL_GUARDED_BY(file_mu_) = false;
};

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_API_REQUEST_TRACE_H_
