// An inference request as the scheduler runs it: the one place where a
// job's parts (server/scheduling/request_scheduler.h) become the inference API's steps
// (server/api/inference_api.h), so that the gRPC and the HTTP transports, which
// derive from it, run requests alike, and their requests may share a batch.
#ifndef PRECOMPILE_SERVER_API_INFERENCE_JOB_H_
#define PRECOMPILE_SERVER_API_INFERENCE_JOB_H_

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/api/inference_api.h"
#include "server/scheduling/request_scheduler.h"

namespace precompile::server {

class InferenceJob : public RequestScheduler::Job, public InferenceApi::Call {
 public:
  Next Run() final;
  void RunEager() final;
  const BatchTicket* batch_ticket() const final { return Call::batch_ticket(); }
  // REQUIRES: every member is an InferenceJob, as every job whose Run()
  // says kBatch is.
  void RunBatch(absl::Span<Job* const> members, absl::Span<Next> next) final;

 protected:
  explicit InferenceJob(InferenceApi& api) : api_(api) {}
  ~InferenceJob() = default;

  // When the request arrived: its time and deadline count from there.
  void set_received(absl::Time received) { received_ = received; }

  // What the client is answered: until the job answers, an internal error,
  // for a job that ends without an answer.
  const absl::Status& answer() const { return answer_; }

 private:
  InferenceApi& api_;
  absl::Time received_ = absl::Now();
  absl::Status answer_ = absl::InternalError("the request ended before it was answered");
};

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_API_INFERENCE_JOB_H_
