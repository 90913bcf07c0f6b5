// The unary gRPC methods other than ModelInfer: the KServe v2 liveness,
// readiness, metadata, statistics, repository and trace methods, and the
// admin service. Their requests are small, but gRPC takes messages up to
// --max_message_bytes for ModelInfer's sake, and a synchronous method parses
// whatever gRPC took into a message outside every budget, one copy per
// thread gRPC starts for them (16 ModelMetadata calls naming a model of
// 200 MB grew the server by 650 MiB). So these methods are served through
// gRPC's asynchronous generic API: each request arrives as bytes (held
// within --grpc_memory_bytes), and one of more than `max_request_bytes` is
// refused unparsed (RESOURCE_EXHAUSTED, naming the method and the limit), as
// the HTTP transport refuses such bodies on its other paths.
//
// `threads` threads take the calls from one completion queue and run each
// handler to its end. Handlers routed as Lane::kOneAtATime (those that load
// or unload models, which the repository does one at a time, for as long as
// a load takes) run instead on a thread of their own, in the order their
// calls came: however many wait there, the other methods keep their threads.
// A method no service routed here is answered UNIMPLEMENTED, as gRPC answers
// unknown methods.
//
// Thread safety: Add and StartServing before the server serves; the handlers
// are called concurrently.
#ifndef PRECOMPILE_SERVER_GRPC_UNARY_CALL_ROUTER_H_
#define PRECOMPILE_SERVER_GRPC_UNARY_CALL_ROUTER_H_

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/byte_buffer.h>

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "server/grpc/call_queue.h"
#include "server/grpc/message_bytes.h"

namespace precompile::server {

class UnaryCallRouter {
 public:
  // Parses `request` into a message of its method's request type, runs the
  // method and writes its response into `response` when it succeeds.
  using Handler = std::function<grpc::Status(
      grpc::ServerContext& context, const grpc::ByteBuffer& request, grpc::ByteBuffer* response)>;

  // Where a handler runs: on the threads taking calls, or one at a time on
  // the thread of its own (see above).
  enum class Lane { kCallThreads, kOneAtATime };

  // Decides, on the threads taking calls, whether a call may wait in the
  // one-at-a-time lane: a call it refuses is answered with its status at
  // once, so that calls their callers may not make (a load without the
  // admin token) never wait behind, or hold up, the loads that are allowed.
  using Admission = std::function<grpc::Status(const grpc::ServerContext& context)>;

  // REQUIRES: threads >= 1.
  UnaryCallRouter(int threads, size_t max_request_bytes);
  // Stops serving (see StopServing): the gRPC server must be shut down first.
  ~UnaryCallRouter();
  UnaryCallRouter(const UnaryCallRouter&) = delete;
  UnaryCallRouter& operator=(const UnaryCallRouter&) = delete;

  // Routes `service`'s method `method` to `handle` of `target`, which must
  // outlive the router; `admission`, if any, for Lane::kOneAtATime. If the
  // service has no such method, or its types differ from the handler's (a
  // mistake in the server's own wiring), nothing is routed and CheckRoutes
  // says why.
  template <typename Target, typename Request, typename Response>
  void Add(const google::protobuf::ServiceDescriptor& service, absl::string_view method,
           Target* target,
           grpc::Status (Target::*handle)(grpc::ServerContext*, const Request*, Response*),
           Lane lane = Lane::kCallThreads, Admission admission = nullptr) {
    AddHandler(service, method, *Request::descriptor(), *Response::descriptor(), lane,
               std::move(admission),
               [target, handle](grpc::ServerContext& context, const grpc::ByteBuffer& bytes,
                                grpc::ByteBuffer* response_bytes) {
                 Request request;
                 if (grpc::Status parsed = ParseMessage(bytes, &request); !parsed.ok()) {
                   return parsed;
                 }
                 Response response;
                 grpc::Status status = (target->*handle)(&context, &request, &response);
                 if (status.ok()) SerializeMessage(response, response_bytes);
                 return status;
               });
  }

  // OK when every method of `service` but those in `elsewhere` is routed
  // and every Add was right; otherwise an error naming what is wrong.
  absl::Status CheckRoutes(const google::protobuf::ServiceDescriptor& service,
                           const std::vector<std::string>& elsewhere = {}) const;

  // For grpc::ServerBuilder::RegisterAsyncGenericService: the methods of the
  // services registered with the builder are theirs, all others come here.
  grpc::AsyncGenericService* generic_service() { return &generic_; }

  // Starts answering calls from `cq`, a completion queue of the server the
  // generic service is registered with.
  void StartServing(std::unique_ptr<grpc::ServerCompletionQueue> cq);
  // After the gRPC server has shut down: finishes the calls still running
  // and joins the threads. Idempotent.
  void StopServing();

 private:
  class UnaryCall;

  struct Route {
    Handler handler;
    Lane lane;
    Admission admission;
  };

  void AddHandler(const google::protobuf::ServiceDescriptor& service, absl::string_view method,
                  const google::protobuf::Descriptor& request,
                  const google::protobuf::Descriptor& response, Lane lane, Admission admission,
                  Handler handler);

  void ServeCalls();
  void RequestCall();
  void OnRequested(UnaryCall* call);
  void OnRead(UnaryCall* call, bool ok);
  // Runs the call's handler and answers it.
  void Run(UnaryCall* call);
  // The one-at-a-time lane's thread.
  void RunOneAtATime();
  void Delete(UnaryCall* call);

  const int threads_count_;
  const size_t max_request_bytes_;
  // By the method's path, "/package.Service/Method".
  absl::flat_hash_map<std::string, Route> routes_;
  std::vector<std::string> wiring_errors_;
  grpc::AsyncGenericService generic_;
  // Calls are requested until StopServing; each ends when it is deleted.
  CallQueue calls_;
  // The one-at-a-time lane: the calls waiting, and its thread (started by
  // StartServing, stopped once every call has ended).
  std::mutex one_at_a_time_mu_;
  std::condition_variable one_at_a_time_cv_;
  std::deque<UnaryCall*> one_at_a_time_ ABSL_GUARDED_BY(one_at_a_time_mu_);
  bool one_at_a_time_stop_ ABSL_GUARDED_BY(one_at_a_time_mu_) = false;
  std::thread one_at_a_time_thread_;
};

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_GRPC_UNARY_CALL_ROUTER_H_
