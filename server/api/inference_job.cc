#include "server/api/inference_job.h"

#include <optional>
#include <vector>

namespace precompile::server {

InferenceJob::Next InferenceJob::Run() {
  std::optional<absl::Status> answer = api_.Infer(*this, received_);
  if (!answer) return batch_ticket() != nullptr ? Next::kBatch : Next::kEager;
  answer_ = *std::move(answer);
  return Next::kDone;
}

void InferenceJob::RunEager() { answer_ = api_.InferEager(*this); }

void InferenceJob::RunBatch(absl::Span<Job* const> members, absl::Span<Next> next) {
  std::vector<InferenceJob*> jobs;
  std::vector<InferenceApi::Call*> calls;
  jobs.reserve(members.size());
  calls.reserve(members.size());
  for (Job* member : members) {
    jobs.push_back(static_cast<InferenceJob*>(member));
    calls.push_back(jobs.back());
  }
  std::vector<std::optional<absl::Status>> answers = api_.InferBatch(calls);
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (!answers[i]) {
      next[i] = Next::kEager;
      continue;
    }
    jobs[i]->answer_ = *std::move(answers[i]);
    next[i] = Next::kDone;
  }
}

}  // namespace precompile::server
