#include "server/grpc/unary_call_router.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/log_text.h"
#include "server/grpc/call_queue.h"
#include "spdlog/spdlog.h"

namespace precompile::server {
namespace {

std::string PathOf(const google::protobuf::ServiceDescriptor& service, absl::string_view method) {
  return absl::StrCat("/", service.full_name(), "/", method);
}

}  // namespace

// One call, from its arrival to its answer. One operation at a time is
// with gRPC (the request for a call, the read of its message, its finish).
// The thread that starts the next one may still be inside gRPC's call when
// another thread takes the operation's tag back, so each of the two holds
// the call until it is done with it; the last to let go deletes it.
class UnaryCallRouter::UnaryCall {
 public:
  enum class Event { kRequested, kRead, kFinished };
  struct Tag {
    UnaryCall* call;
    Event event;
  };

  UnaryCall() : stream(&context) {}

  static std::pair<UnaryCall*, Event> Of(void* tag) {
    const Tag* t = static_cast<const Tag*>(tag);
    return {t->call, t->event};
  }
  // For an operation about to start: its event holds the call too.
  void* tag(Event event) {
    Hold();
    Tag* t = &tags_[static_cast<int>(event)];
    HandToGrpc(t);
    return t;
  }
  void Hold() { holders_.fetch_add(1, std::memory_order_relaxed); }
  // True for the last holder to let go.
  bool Unref() { return holders_.fetch_sub(1, std::memory_order_acq_rel) == 1; }

  grpc::GenericServerContext context;
  grpc::GenericServerAsyncReaderWriter stream;
  grpc::ByteBuffer request;
  grpc::ByteBuffer response;
  // Its method's, once it has arrived (routes do not change while serving).
  const Route* route = nullptr;

 private:
  Tag tags_[3] = {{this, Event::kRequested}, {this, Event::kRead}, {this, Event::kFinished}};
  std::atomic<int> holders_{0};
};

UnaryCallRouter::UnaryCallRouter(int threads, size_t max_request_bytes)
    : threads_count_(threads), max_request_bytes_(max_request_bytes) {}

UnaryCallRouter::~UnaryCallRouter() { StopServing(); }

void UnaryCallRouter::AddHandler(const google::protobuf::ServiceDescriptor& service,
                                 absl::string_view method,
                                 const google::protobuf::Descriptor& request,
                                 const google::protobuf::Descriptor& response, Lane lane,
                                 Admission admission, Handler handler) {
  const std::string path = PathOf(service, method);
  const google::protobuf::MethodDescriptor* described =
      service.FindMethodByName(std::string(method));
  if (described == nullptr) {
    wiring_errors_.push_back(absl::StrCat(path, " is not a method of ", service.full_name()));
  } else if (described->input_type() != &request || described->output_type() != &response ||
             described->client_streaming() || described->server_streaming()) {
    wiring_errors_.push_back(absl::StrCat(path, " takes ", described->input_type()->full_name(),
                                          " and returns ", described->output_type()->full_name(),
                                          " (unary): its handler takes ", request.full_name(),
                                          " and returns ", response.full_name()));
  } else {
    routes_[path] = Route{std::move(handler), lane, std::move(admission)};
  }
}

absl::Status UnaryCallRouter::CheckRoutes(const google::protobuf::ServiceDescriptor& service,
                                          const std::vector<std::string>& elsewhere) const {
  std::vector<std::string> wrong = wiring_errors_;
  for (int i = 0; i < service.method_count(); ++i) {
    const std::string& method = service.method(i)->name();
    if (std::find(elsewhere.begin(), elsewhere.end(), method) != elsewhere.end()) continue;
    const std::string path = PathOf(service, method);
    if (!routes_.contains(path)) wrong.push_back(absl::StrCat(path, " has no handler"));
  }
  if (wrong.empty()) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("the gRPC methods are wired wrongly: ", absl::StrJoin(wrong, "; ")));
}

void UnaryCallRouter::StartServing(std::unique_ptr<grpc::ServerCompletionQueue> cq) {
  one_at_a_time_thread_ = std::thread([this] { RunOneAtATime(); });
  calls_.Start(std::move(cq), threads_count_, [this] { ServeCalls(); });
  for (int i = 0; i < threads_count_; ++i) RequestCall();
}

void UnaryCallRouter::StopServing() {
  // The calls waiting in the one-at-a-time lane end as it runs them.
  calls_.Stop();
  if (!one_at_a_time_thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(one_at_a_time_mu_);
    one_at_a_time_stop_ = true;
  }
  one_at_a_time_cv_.notify_one();
  one_at_a_time_thread_.join();
}

void UnaryCallRouter::RunOneAtATime() {
  while (true) {
    UnaryCall* call = nullptr;
    {
      std::unique_lock<std::mutex> lock(one_at_a_time_mu_);
      one_at_a_time_cv_.wait(lock,
                             [this] { return one_at_a_time_stop_ || !one_at_a_time_.empty(); });
      if (one_at_a_time_.empty()) return;
      call = one_at_a_time_.front();
      one_at_a_time_.pop_front();
    }
    Run(call);
    if (call->Unref()) Delete(call);  // The lane's hold.
  }
}

void UnaryCallRouter::RequestCall() {
  calls_.RequestCall([this] {
    auto* call = new UnaryCall();
    generic_.RequestCall(&call->context, &call->stream, calls_.queue(), calls_.queue(),
                         call->tag(UnaryCall::Event::kRequested));
  });
}

void UnaryCallRouter::ServeCalls() {
  void* tag = nullptr;
  bool ok = false;
  while (calls_.queue()->Next(&tag, &ok)) {
    TakeFromGrpc(tag);
    auto [call, event] = UnaryCall::Of(tag);
    // Whatever these start holds the call for its own event.
    if (event == UnaryCall::Event::kRequested && ok) {
      RequestCall();
      OnRequested(call);
    } else if (event == UnaryCall::Event::kRead) {
      OnRead(call, ok);
    }
    // A request that failed (the server shut down before a call arrived)
    // and a finish end the call.
    if (call->Unref()) Delete(call);
  }
}

void UnaryCallRouter::OnRequested(UnaryCall* call) {
  // A call to a method this server lacks is read before it is refused, as
  // every other call is. Refused unread, calls their clients had reset
  // lingered: under 2 connections resetting such calls as fast as they
  // could for 8 s, the calls in progress grew faster than they ended (each
  // event of libgrpc's queue costs time in proportion to them) and the
  // server with them, by 1.3 to 1.8 GiB; read first, by 35 to 73 MiB. This
  // raises the rate at which calls pile up; it does not bound it: clients
  // that take the server's answers slowly still pile them up (SECURITY.md).
  auto route = routes_.find(call->context.method());
  if (route != routes_.end()) call->route = &route->second;
  call->stream.Read(&call->request, call->tag(UnaryCall::Event::kRead));
}

void UnaryCallRouter::OnRead(UnaryCall* call, bool ok) {
  const std::string& method = call->context.method();
  if (call->route == nullptr) {
    call->request.Clear();
    call->stream.Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                     absl::StrCat("this server has no method '",
                                                  LoggedText(method, 256), "'")),
                        call->tag(UnaryCall::Event::kFinished));
    return;
  }
  if (!ok) {
    // The client ended its side, or the call, without a message.
    call->stream.Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                     absl::StrCat(method, " was called without a request")),
                        call->tag(UnaryCall::Event::kFinished));
    return;
  }
  const size_t size = call->request.Length();
  if (size > max_request_bytes_) {
    call->request.Clear();
    call->stream.Finish(
        grpc::Status(
            grpc::StatusCode::RESOURCE_EXHAUSTED,
            absl::StrCat("the request of ", size, " bytes is more than the ", max_request_bytes_,
                         " bytes ", method, " takes (only ModelInfer takes larger messages)")),
        call->tag(UnaryCall::Event::kFinished));
    return;
  }
  if (call->route->lane == Lane::kOneAtATime) {
    if (call->route->admission) {
      grpc::Status admitted = call->route->admission(call->context);
      if (!admitted.ok()) {
        call->request.Clear();
        call->stream.Finish(admitted, call->tag(UnaryCall::Event::kFinished));
        return;
      }
    }
    call->Hold();  // For the lane, until it has answered.
    {
      std::lock_guard<std::mutex> lock(one_at_a_time_mu_);
      one_at_a_time_.push_back(call);
    }
    one_at_a_time_cv_.notify_one();
    return;
  }
  Run(call);
}

void UnaryCallRouter::Run(UnaryCall* call) {
  const std::string& method = call->context.method();
  grpc::Status status;
  try {
    status = call->route->handler(call->context, call->request, &call->response);
  } catch (...) {
    spdlog::error("event=grpc_method_threw method={} what=\"{}\"", method,
                  DescribeCaughtException().what);
    status = grpc::Status(grpc::StatusCode::INTERNAL,
                          absl::StrCat(method, " failed inside the server; it has logged why"));
  }
  call->request.Clear();
  if (status.ok()) {
    call->stream.WriteAndFinish(call->response, grpc::WriteOptions(), grpc::Status::OK,
                                call->tag(UnaryCall::Event::kFinished));
  } else {
    call->stream.Finish(status, call->tag(UnaryCall::Event::kFinished));
  }
}

void UnaryCallRouter::Delete(UnaryCall* call) {
  delete call;
  calls_.CallEnded();
}

}  // namespace precompile::server
