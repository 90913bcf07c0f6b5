#include "server/grpc/health_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/grpc/message_bytes.h"

namespace precompile::server {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// A request names a service: a model's name at most, which the repository
// takes from a directory's name.
constexpr size_t kMaxRequestBytes = 4096;

// The request, or why it is refused.
grpc::Status ParseRequest(const grpc::ByteBuffer& bytes, HealthCheckRequest* request) {
  if (const size_t size = bytes.Length(); size > kMaxRequestBytes) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat("a health check request of ", size, " bytes; at most ",
                                     kMaxRequestBytes, " are read"));
  }
  return ParseMessage(bytes, request);
}

void Serialize(HealthCheckResponse::ServingStatus status, grpc::ByteBuffer* bytes) {
  HealthCheckResponse response;
  response.set_status(status);
  SerializeMessage(response, bytes);
}

// A call finished as soon as it starts.
class Refusal final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit Refusal(grpc::Status status) { Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

}  // namespace

// One Watch stream: writes its service's status now and at each change
// (only the newest, if several came while a write was out), until its client
// goes or the service shuts down. Reactions are never run inline from the
// Start* calls (gRPC's callback API), so they may be made with mu_ held.
class HealthService::Watcher final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit Watcher(HealthService* service) : service_(service) {}

  // Sends `status` unless the client has it; `last`: then ends the stream.
  void Tell(Status status, bool last) ABSL_LOCKS_EXCLUDED(mu_) {
    std::lock_guard<std::mutex> lock(mu_);
    next_ = status;
    last_ = last_ || last;
    if (!writing_) WriteNext();
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) {
      FinishOnce(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the status could not be written"));
      return;
    }
    WriteNext();
  }

  void OnCancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    FinishOnce(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    service_->Forget(this);
    delete this;
  }

 private:
  void WriteNext() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    if (next_ != sent_) {
      sent_ = next_;
      response_.Clear();
      Serialize(sent_, &response_);
      writing_ = true;
      StartWrite(&response_);
    } else if (last_) {
      FinishOnce(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down"));
    }
  }
  void FinishOnce(grpc::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(std::move(status));
  }

  HealthService* const service_;
  std::mutex mu_;
  // No status is -1: the first is always sent.
  Status sent_ ABSL_GUARDED_BY(mu_) = static_cast<Status>(-1);
  Status next_ ABSL_GUARDED_BY(mu_) = HealthCheckResponse::UNKNOWN;
  bool last_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ByteBuffer response_ ABSL_GUARDED_BY(mu_);
};

HealthService::HealthService(int max_watches) : max_watches_(max_watches) {}

HealthService::~HealthService() = default;

HealthService::Status HealthService::StatusOf(const std::string& service) const {
  if (shut_down_) return HealthCheckResponse::NOT_SERVING;
  auto it = serving_.find(service);
  if (it == serving_.end()) return HealthCheckResponse::SERVICE_UNKNOWN;
  return it->second ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING;
}

void HealthService::SetServingStatus(const std::string& service, bool serving) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_) return;
  serving_[service] = serving;
  const Status status = StatusOf(service);
  for (auto& [watcher, watched] : watchers_) {
    if (watched == service) watcher->Tell(status, false);
  }
}

void HealthService::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  shut_down_ = true;
  for (auto& [watcher, watched] : watchers_) watcher->Tell(HealthCheckResponse::NOT_SERVING, true);
}

void HealthService::Forget(Watcher* watcher) {
  std::lock_guard<std::mutex> lock(mu_);
  watchers_.erase(watcher);
}

grpc::ServerUnaryReactor* HealthService::Check(grpc::CallbackServerContext* context,
                                               const grpc::ByteBuffer* request_bytes,
                                               grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  HealthCheckRequest request;
  if (grpc::Status parsed = ParseRequest(*request_bytes, &request); !parsed.ok()) {
    reactor->Finish(parsed);
    return reactor;
  }
  Status status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    status = StatusOf(request.service());
  }
  if (status == HealthCheckResponse::SERVICE_UNKNOWN) {
    reactor->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service"));
    return reactor;
  }
  Serialize(status, response);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* HealthService::Watch(
    grpc::CallbackServerContext*, const grpc::ByteBuffer* request_bytes) {
  HealthCheckRequest request;
  if (grpc::Status parsed = ParseRequest(*request_bytes, &request); !parsed.ok()) {
    return new Refusal(std::move(parsed));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (static_cast<int>(watchers_.size()) >= max_watches_) {
    return new Refusal(grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("the server has ", max_watches_,
                     " health Watch streams open, its limit; close one and try again")));
  }
  auto* watcher = new Watcher(this);
  watchers_.emplace(watcher, request.service());
  watcher->Tell(StatusOf(request.service()), shut_down_);
  return watcher;
}

}  // namespace precompile::server
