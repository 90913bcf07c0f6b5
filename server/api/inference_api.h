// The KServe v2 / Open Inference Protocol, with the Triton extensions that
// standard clients and load testers rely on (ModelConfig, ModelStatistics,
// RepositoryIndex, RepositoryModelLoad/Unload, TraceSetting), apart from the transports
// that carry it. The gRPC service (server/grpc/inference_service.h) and the
// HTTP/REST endpoint (server/http/http_service.h) turn what arrives into these
// protos and send what comes back, so the two mean the same thing: the same
// checks, the same messages, the same metrics.
//
// A model's inputs are its entry frame's tensor arguments, by name; its
// non-tensor arguments travel as request parameters. Outputs are the tensor
// leaves of what the entry returns, named by their path (last_hidden_state,
// pooled.0; output0, output1, ... for a tensor or a flat tuple). Each
// response carries two parameters saying how the entry frame was served:
// "precompile_outcome" ("variant" or "eager_fallback") and
// "precompile_variant" (the variant's id, or ""); a model with dynamic
// batching adds "precompile_batch_rows", the requests' rows in the call
// that served the request (more than its own when it ran in a batch), and
// "precompile_batch_padding_rows" when that call was padded up to a static
// variant's batch.
//
// A model whose config.pbtxt keeps sequences' state
// (server/scheduling/sequence_state.h) takes Triton's request parameters
// sequence_id, sequence_start and sequence_end. Its state tensors are the
// server's: its metadata does not list them, a request may not send them,
// and no answer carries them; ModelConfig lists them under
// sequence_batching.
//
// Requests the tracer samples (server/api/request_trace.h) are written to its
// trace file when they end: Triton's timestamps (REQUEST_START and
// QUEUE_START when the request arrived, COMPUTE_START when a run slot took
// it, COMPUTE_INPUT_END once decoded, COMPUTE_OUTPUT_START when the model
// returned, COMPUTE_END once encoded, REQUEST_END), the waits of an eager
// miss for its thread (EAGER_QUEUE_START, EAGER_START) and of a request for
// its batch (BATCH_QUEUE_START, BATCH_START), and every frame call of the
// model (its guards' time, the variant or eager program that ran, its run
// time). The differences are what ModelStatistics adds up.
//
// Thread safety: all methods may be called concurrently.
#ifndef PRECOMPILE_SERVER_API_INFERENCE_API_H_
#define PRECOMPILE_SERVER_API_INFERENCE_API_H_

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/inference.pb.h"
#include "runtime/value.h"
#include "server/api/request_trace.h"
#include "server/api/serving_state.h"
#include "server/metrics/metrics.h"
#include "server/repository/model_repository.h"
#include "server/scheduling/request_scheduler.h"
#include "server/scheduling/sequence_state.h"

namespace precompile::server {

class InferenceApi {
  struct RequestState;

 public:
  // One inference request as its transport holds it.
  class Call {
   public:
    // Fills `request` from what arrived; INVALID_ARGUMENT, naming the
    // problem, when it does not decode.
    virtual absl::Status Parse(inference::ModelInferRequest* request) = 0;
    // Whether the client has gone or its deadline passed: polled before each
    // frame runs, so a request nobody waits for stops early.
    virtual bool Cancelled() = 0;
    // The certificate the client presented (mutual TLS) in PEM, as
    // PEM_write_bio_X509 writes it; empty without one. A sequence is the
    // client's own (see SequenceStore::Request::client).
    virtual std::string ClientCertificate() { return {}; }
    // Makes what the transport sends from `response` (its outputs described,
    // their bytes not in it) and the output tensors, in the order of
    // response.outputs().
    virtual absl::Status Encode(const inference::ModelInferResponse& response,
                                std::vector<OutputTensor>& outputs) = 0;

    // After Infer returned nullopt: the batch the request waits for, or
    // null when it waits for an eager thread.
    const BatchTicket* batch_ticket() const { return waits_for_batch_ ? &ticket_ : nullptr; }

   protected:
    Call();
    ~Call();

   private:
    friend class InferenceApi;
    // A request stopped at its eager miss or before its batch, for
    // InferEager or InferBatch.
    std::unique_ptr<RequestState> pending_;
    bool waits_for_batch_ = false;
    BatchTicket ticket_;
  };

  // The references must outlive the API. `metrics` may be null. A request
  // still running `max_request_time` after it arrived ends with
  // DEADLINE_EXCEEDED (zero: no limit).
  // `tracer` may be null: no request is traced. `sequences` holds the
  // state of models' sequences; null: a model that keeps sequences is
  // refused (UNAVAILABLE).
  InferenceApi(ModelRepository& repository, ServerMetrics* metrics, const ServingState& state,
               absl::Duration max_request_time = absl::ZeroDuration(),
               RequestTracer* tracer = nullptr, SequenceStore* sequences = nullptr)
      : repository_(repository),
        metrics_(metrics),
        state_(state),
        max_request_time_(max_request_time),
        tracer_(tracer),
        sequences_(sequences) {}

  // Runs one admitted request: decodes it, runs the model, encodes the
  // answer, and records the request in the model's metrics; returns the
  // answer. A failure is logged at most once a minute per model and status
  // code. Throws nothing: what any stage throws is answered
  // RESOURCE_EXHAUSTED (out of memory) or INTERNAL, naming the stage, never
  // the exception's text.
  //
  // A request whose entry frame misses and would run its eager program
  // stops before it and returns nullopt: `call` then holds what the rest
  // needs, and InferEager(call), on any thread, runs the program and returns
  // the answer. The wait between counts as queueing in the model's
  // statistics.
  //
  // A request to a model with dynamic batching (server/scheduling/dynamic_batching.h)
  // whose rows a variant takes, alone or padded with copies of its first row
  // up to a batch a variant takes, that has fewer rows than a full batch
  // and whose deadline is more than twice the batch delay away (one that
  // only padding serves runs at once otherwise), stops before its call
  // too, with call.batch_ticket() set. Then InferBatch(calls), given
  // requests with tickets of the same key, runs them as one call when a
  // variant takes their rows stacked (padded, if need be, up to the
  // smallest batch a variant takes, at most twice the rows, with copies of
  // a real row whose outputs are dropped), and answers each with its rows
  // of the outputs;
  // otherwise each runs alone, as Infer would have run it. So batching
  // never turns an answer into a miss. Its
  // answers are in the order of `calls`: nullopt for a request that stopped
  // at an eager miss (then InferEager(call) as above).
  std::optional<absl::Status> Infer(Call& call, absl::Time received)
      ABSL_LOCKS_EXCLUDED(log_mu_);
  absl::Status InferEager(Call& call) ABSL_LOCKS_EXCLUDED(log_mu_);
  std::vector<std::optional<absl::Status>> InferBatch(absl::Span<Call* const> calls)
      ABSL_LOCKS_EXCLUDED(log_mu_);

  bool ServerLive() const { return state_.live(); }
  bool ServerReady() const { return state_.ready(); }
  bool ModelReady(const std::string& name, const std::string& version) const;
  void ServerMetadata(inference::ServerMetadataResponse* response) const;
  absl::Status ModelMetadata(const inference::ModelMetadataRequest& request,
                             inference::ModelMetadataResponse* response) const;
  absl::Status ModelConfig(const inference::ModelConfigRequest& request,
                           inference::ModelConfigResponse* response) const;
  absl::Status ModelStatistics(const inference::ModelStatisticsRequest& request,
                               inference::ModelStatisticsResponse* response) const;
  void RepositoryIndex(const inference::RepositoryIndexRequest& request,
                       inference::RepositoryIndexResponse* response) const;
  // Loading and unloading; the transport checks who may (server/api/control_access.h).
  absl::Status LoadModel(const std::string& name);
  absl::Status UnloadModel(const std::string& name);
  // Triton's trace settings of `model` ("": the server's): read when
  // `changes` is empty, else changed (the transport checks who may).
  // NOT_FOUND for a model the server does not serve; UNIMPLEMENTED without
  // a tracer.
  absl::StatusOr<RequestTracer::Settings> TraceSetting(const std::string& model,
                                                       const RequestTracer::Changes& changes);

 private:
  // Infer's stages. Decode: the request into the entry's arguments (and,
  // for a model that keeps sequences, its sequence's state).
  // RunModel: the call (stopping at an eager miss when `deferred` is not
  // null, and then setting it) and Answer: the answer's encoding.
  absl::Status Decode(Call& call, RequestState& s);
  // Takes `s`'s sequence from the store and passes its state to the model.
  absl::Status JoinSequence(Call& call, RequestState& s, const SequenceConfig& sequences);
  // Whether `s`, decoded, is to wait for a batch (then its ticket is set).
  absl::StatusOr<bool> JoinsBatch(RequestState& s, BatchTicket& ticket);
  absl::Status RunModel(Call& call, RequestState& s, bool* deferred);
  // `batch_rows`: the rows of the call that served it (its own, or its
  // batch's).
  absl::Status Answer(Call& call, RequestState& s, CallResult result, absl::Time called,
                      int64_t batch_rows);
  // Runs the requests `live` of `calls` as one call (padded up to a
  // variant's batch if need be); false, having answered none, when no
  // variant takes them together or their outputs cannot be split by rows.
  // `unstacked`: why the stacked inputs were not made, when they did not
  // fit in what model calls may hold (OK otherwise).
  bool RunMerged(absl::Span<Call* const> calls, std::vector<std::unique_ptr<RequestState>>& states,
                 const std::vector<size_t>& live, std::vector<std::optional<absl::Status>>& answers,
                 absl::Status& unstacked);
  // Runs `stages`, answering what they throw.
  static absl::Status Guarded(RequestState& s, absl::FunctionRef<absl::Status()> stages);
  // Logs a failure and records the request in its model's metrics.
  absl::Status Finish(RequestState& s, absl::Status status) ABSL_LOCKS_EXCLUDED(log_mu_);
  static absl::Status PastDeadline(const RequestState& s, const absl::Status& status);
  // OK while the request's client waits for it and its deadline has not
  // passed at `now`; else CANCELLED (its client gone `when`) or its
  // deadline's error (having `waited`).
  static absl::Status StillWanted(Call& call, const RequestState& s, absl::Time now,
                                  absl::string_view when, absl::string_view waited);
  // `served`: whether `model` names a model the server serves.
  void LogFailure(const std::string& model, bool served, const absl::Status& status)
      ABSL_LOCKS_EXCLUDED(log_mu_);

  ModelRepository& repository_;
  ServerMetrics* const metrics_;
  const ServingState& state_;
  const absl::Duration max_request_time_;
  RequestTracer* const tracer_;
  SequenceStore* const sequences_;
  std::mutex log_mu_;
  absl::flat_hash_map<std::string, absl::Time> last_logged_ ABSL_GUARDED_BY(log_mu_);
};

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_API_INFERENCE_API_H_
