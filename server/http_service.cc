#include "server/http_service.h"

#include <httplib.h>
#include <openssl/ssl.h>
#include <spdlog/spdlog.h>

#include <exception>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/log_text.h"
#include "base/notification.h"
#include "base/proto_json.h"
#include "server/http_codec.h"

namespace precompile::server {
namespace {

constexpr char kJson[] = "application/json";
constexpr char kBinary[] = "application/octet-stream";
constexpr char kHeaderLength[] = "Inference-Header-Content-Length";

// Sets a whole answer (cpp-httplib leaves the body out for HEAD). The body
// is moved, not copied: it may hold every output tensor.
void Send(httplib::Response& response, int status, const char* content_type, std::string body,
          std::optional<size_t> header_length = std::nullopt) {
  response.status = status;
  response.body = std::move(body);
  response.set_header("Content-Type", content_type);
  if (header_length) response.set_header(kHeaderLength, absl::StrCat(*header_length));
}

void SendJson(httplib::Response& response, const Json& json) {
  Send(response, 200, kJson, DumpJson(json, /*pretty=*/false));
}

void SendError(httplib::Response& response, const absl::Status& status) {
  Send(response, HttpStatusOf(status.code()), kJson, ErrorBody(status.message()));
}

// A health answer: 200 for true, 400 for false, as KServe says; no body.
void SendHealth(httplib::Response& response, bool ok) {
  Send(response, ok ? 200 : 400, kJson, "");
}

// One of the API's calls about the model (and version) the path names:
// metadata, config, statistics.
template <typename Request, typename Reply>
absl::StatusOr<Reply> AskAboutModel(const InferenceApi& api, const HttpRoute& route,
                                    absl::Status (InferenceApi::*call)(const Request&, Reply*)
                                        const) {
  Request asked;
  asked.set_name(route.model);
  asked.set_version(route.version);
  Reply reply;
  if (absl::Status s = (api.*call)(asked, &reply); !s.ok()) return s;
  return reply;
}

// What cpp-httplib's own refusals say, in a KServe error body.
std::string ProtocolError(int status, size_t max_body_bytes) {
  switch (status) {
    case 413:
      return absl::StrCat("the request body is more than the server's limit of ", max_body_bytes,
                          " bytes (--max_message_bytes)");
    case 414: return "the request's path is too long";
    case 400: return "the request is not valid HTTP/1.1";
    default: return absl::StrCat("HTTP status ", status);
  }
}

// host:port, or [host]:port for IPv6.
absl::StatusOr<std::pair<std::string, int>> HostAndPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("the HTTP address '", address, "' is not host:port"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return std::make_pair(host, port);
}

// The TLS context: the certificate chain and key and, with a client CA,
// client certificates asked for and checked when given but not required at
// the handshake (the health paths answer without one; Screen refuses the
// rest). False, logged, when a file cannot be used.
bool SetUpTls(SSL_CTX& ctx, const HttpOptions& options) {
  auto fail = [](const std::string& what) {
    spdlog::error("event=http_tls_failed message=\"{}\"", what);
    return false;
  };
  if (SSL_CTX_use_certificate_chain_file(&ctx, options.tls_cert_file.c_str()) != 1) {
    return fail(absl::StrCat("cannot use the TLS certificate ", options.tls_cert_file));
  }
  if (SSL_CTX_use_PrivateKey_file(&ctx, options.tls_key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(&ctx) != 1) {
    return fail(absl::StrCat("cannot use the TLS key ", options.tls_key_file,
                             " with the certificate ", options.tls_cert_file));
  }
  SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION);
  if (!options.tls_client_ca_file.empty()) {
    if (SSL_CTX_load_verify_locations(&ctx, options.tls_client_ca_file.c_str(), nullptr) != 1) {
      return fail(absl::StrCat("cannot read the client CA ", options.tls_client_ca_file));
    }
    if (STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(options.tls_client_ca_file.c_str())) {
      SSL_CTX_set_client_CA_list(&ctx, names);
    }
    SSL_CTX_set_verify(&ctx, SSL_VERIFY_PEER, nullptr);
  }
  return true;
}

// One infer request over HTTP, run by the request scheduler like a gRPC one;
// the thread that read it waits for it and sends the answer.
class HttpInferCall final : public RequestScheduler::Job, public InferenceApi::Call {
 public:
  // `body` must outlive the call.
  HttpInferCall(InferenceApi& api, absl::string_view body, std::optional<size_t> header_length,
                HttpRoute route)
      : api_(api),
        body_(body),
        header_length_(header_length),
        route_(std::move(route)),
        received_(absl::Now()) {}

  void Run() override { status_ = api_.Infer(*this, received_); }
  void Complete() override { done_.Notify(); }

  absl::Status Parse(inference::ModelInferRequest* request) override {
    request_ = request;
    return DecodeInferRequest(body_, header_length_, route_.model, route_.version, request);
  }
  // cpp-httplib does not say when a client has gone: the request runs to
  // the end and its answer is dropped.
  bool Cancelled() override { return false; }
  absl::Status Encode(const inference::ModelInferResponse& response,
                      std::vector<OutputTensor>& outputs) override {
    answer_ = EncodeInferResponse(*request_, response, outputs);
    return absl::OkStatus();
  }

  void Wait() { done_.WaitForNotification(); }
  const absl::Status& status() const { return status_; }
  HttpInferResponse& answer() { return answer_; }

 private:
  InferenceApi& api_;
  const absl::string_view body_;
  const std::optional<size_t> header_length_;
  const HttpRoute route_;
  const absl::Time received_;
  const inference::ModelInferRequest* request_ = nullptr;
  // Until Run() answers: what the client gets if it never does.
  absl::Status status_ = absl::InternalError("the request ended before it was answered");
  HttpInferResponse answer_;
  Notification done_;
};

}  // namespace

HttpService::HttpService(const HttpOptions& options, InferenceApi& api,
                         RequestScheduler& scheduler, ControlAccess access)
    : options_(options),
      api_(api),
      scheduler_(scheduler),
      access_(std::move(access)),
      client_certificates_(!options.tls_client_ca_file.empty()) {}

HttpService::~HttpService() { Stop(); }

absl::StatusOr<std::unique_ptr<HttpService>> HttpService::Start(const HttpOptions& options,
                                                                InferenceApi& api,
                                                                RequestScheduler& scheduler,
                                                                ControlAccess access) {
  auto address = HostAndPort(options.address);
  if (!address.ok()) return address.status();
  std::unique_ptr<HttpService> service(
      new HttpService(options, api, scheduler, std::move(access)));
  HttpService* raw = service.get();
  if (options.tls_cert_file.empty()) {
    service->server_ = std::make_unique<httplib::Server>();
  } else {
    bool tls_ok = false;
    service->server_ = std::make_unique<httplib::SSLServer>([raw, &tls_ok](SSL_CTX& ctx) {
      tls_ok = SetUpTls(ctx, raw->options_);
      return tls_ok;
    });
    if (!tls_ok) {
      return absl::InvalidArgumentError(
          "cannot serve HTTPS: the TLS certificate or key cannot be used (see the log)");
    }
  }
  httplib::Server& server = *service->server_;
  const int threads = options.threads;
  server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server.set_payload_max_length(options.max_body_bytes);
  const auto timeout = absl::ToChronoSeconds(options.request_timeout);
  server.set_read_timeout(timeout);
  server.set_write_timeout(timeout);
  server.set_keep_alive_timeout(static_cast<time_t>(timeout.count()));
  // cpp-httplib closes a kept-alive connection after 5 requests by default.
  server.set_keep_alive_max_count(size_t{1} << 30);
  server.set_tcp_nodelay(true);
  server.set_pre_routing_handler(
      [raw](const httplib::Request& request, httplib::Response& response) {
        return raw->Screen(request, response) ? httplib::Server::HandlerResponse::Unhandled
                                              : httplib::Server::HandlerResponse::Handled;
      });
  auto handle = [raw](const httplib::Request& request, httplib::Response& response) {
    raw->Handle(request, response);
  };
  server.Get(".*", handle);
  server.Post(".*", handle);
  server.Put(".*", handle);
  server.Delete(".*", handle);
  server.Patch(".*", handle);
  // Without a handler cpp-httplib answers a handler's exception with its
  // text in a header (EXCEPTION_WHAT); inference requests never get here
  // (InferenceApi::Infer throws nothing), so this is the other paths' barrier.
  server.set_exception_handler(
      [](const httplib::Request&, httplib::Response& response, std::exception_ptr thrown) {
        absl::Status status = absl::InternalError(
            "the server failed while answering this request (an internal error; the server's "
            "log has it)");
        try {
          std::rethrow_exception(thrown);
        } catch (...) {
          const CaughtException caught = DescribeCaughtException();
          if (caught.out_of_memory) {
            status =
                absl::ResourceExhaustedError("the server ran out of memory answering this request");
          } else {
            spdlog::error("event=http_handler_threw what=\"{}\"", caught.what);
          }
        }
        response.headers.clear();
        SendError(response, status);
      });
  const size_t max_body_bytes = options.max_body_bytes;
  server.set_error_handler([max_body_bytes](const httplib::Request&, httplib::Response& response) {
    // Only cpp-httplib's own refusals come without a Content-Type: every
    // answer of Handle has one.
    if (!response.has_header("Content-Type")) {
      response.set_content(ErrorBody(ProtocolError(response.status, max_body_bytes)), kJson);
    }
  });
  const auto& [host, port] = *address;
  if (port == 0) {
    service->port_ = server.bind_to_any_port(host);
  } else if (server.bind_to_port(host, port)) {
    service->port_ = port;
  }
  if (service->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen for HTTP on ", options.address));
  }
  service->listener_ = std::thread([raw] { raw->server_->listen_after_bind(); });
  return service;
}

void HttpService::Stop() {
  // listen_after_bind returns once the requests being answered are done.
  if (server_) server_->stop();
  if (listener_.joinable()) listener_.join();
}

bool HttpService::Screen(const httplib::Request& request, httplib::Response& response) {
  const HttpRoute route = RouteOf(request.method, request.path);
  const bool health =
      route.kind == HttpRoute::Kind::kServerLive || route.kind == HttpRoute::Kind::kServerReady;
  if (client_certificates_ && !health &&
      (request.ssl == nullptr || SSL_get0_peer_certificate(request.ssl) == nullptr)) {
    SendError(response, absl::UnauthenticatedError(
                            "this server needs a client certificate signed by its client CA "
                            "for every path but /v2/health/*"));
    return false;
  }
  // KServe bodies are JSON, or JSON and binary tensors, whatever a client
  // labels them. cpp-httplib parses a body labelled a form (curl -d's
  // default) as one and answers 413 past 8 KiB, and one labelled multipart
  // as parts: the label is dropped before the body is read. (The request is
  // const here only by the hook's signature: the server owns it.)
  const std::string content_type = request.get_header_value("Content-Type");
  if (absl::StartsWith(content_type, "application/x-www-form-urlencoded") ||
      absl::StartsWith(content_type, "multipart/form-data")) {
    const_cast<httplib::Request&>(request).headers.erase("Content-Type");
  }
  const std::string encoding = request.get_header_value("Content-Encoding");
  if (!encoding.empty() && encoding != "identity") {
    Send(response, 415, kJson,
         ErrorBody(absl::StrCat("Content-Encoding '", encoding,
                                "' is not supported: send the body uncompressed")));
    return false;
  }
  // cpp-httplib does not hold a chunked body to the size limit: a body's
  // size must be known before it is read.
  if (request.has_header("Transfer-Encoding")) {
    Send(response, 411, kJson,
         ErrorBody("send the body with a Content-Length: a chunked body's size is known only "
                   "once it is read, and this server refuses bodies over its limit unread"));
    return false;
  }
  // cpp-httplib refuses a POST that says nothing of its body (400), which is
  // what `curl -X POST .../unload` and Triton's client send for the calls
  // whose body is optional: they are answered here, with none.
  const bool optional_body = route.kind == HttpRoute::Kind::kRepositoryIndex ||
                             route.kind == HttpRoute::Kind::kModelLoad ||
                             route.kind == HttpRoute::Kind::kModelUnload;
  // Only inference carries tensors. Every other body is a few bytes of JSON,
  // which a parser turns into a tree many times its size: a 57 MB body of
  // empty arrays cost the repository index more than 1 GB.
  constexpr size_t kMaxOtherBody = 64 << 10;
  size_t length = 0;
  if (route.kind != HttpRoute::Kind::kInfer && request.has_header("Content-Length") &&
      (!absl::SimpleAtoi(request.get_header_value("Content-Length"), &length) ||
       length > kMaxOtherBody)) {
    Send(response, 413, kJson,
         ErrorBody(absl::StrCat("the body is more than the ", kMaxOtherBody,
                                " bytes this path takes (only inference bodies may be larger)")));
    return false;
  }
  if (optional_body && !request.has_header("Content-Length")) {
    Handle(request, response);
    return false;
  }
  return true;
}

void HttpService::Handle(const httplib::Request& request, httplib::Response& response) {
  const HttpRoute route = RouteOf(request.method, request.path);
  using K = HttpRoute::Kind;
  if (route.kind == K::kNotFound) {
    return SendError(response, absl::NotFoundError(absl::StrCat(
                                   "no such path: ", request.method, " ", request.path,
                                   " (the KServe v2 paths start with /v2)")));
  }
  if (route.kind == K::kWrongMethod) {
    return Send(response, 405, kJson,
                ErrorBody(absl::StrCat(request.path, " takes ", route.method, ", not ",
                                       request.method)));
  }
  switch (route.kind) {
    case K::kServerLive: return SendHealth(response, api_.ServerLive());
    case K::kServerReady: return SendHealth(response, api_.ServerReady());
    case K::kModelReady: return SendHealth(response, api_.ModelReady(route.model, route.version));
    case K::kServerMetadata: {
      inference::ServerMetadataResponse reply;
      api_.ServerMetadata(&reply);
      return SendJson(response, ProtoToJson(reply));
    }
    case K::kModelMetadata: {
      auto reply = AskAboutModel(api_, route, &InferenceApi::ModelMetadata);
      if (!reply.ok()) return SendError(response, reply.status());
      return SendJson(response, ProtoToJson(*reply));
    }
    case K::kModelConfig: {
      auto reply = AskAboutModel(api_, route, &InferenceApi::ModelConfig);
      if (!reply.ok()) return SendError(response, reply.status());
      // Triton answers the configuration itself, not wrapped.
      return SendJson(response, ProtoToJson(reply->config()));
    }
    case K::kModelStatistics: {
      auto reply = AskAboutModel(api_, route, &InferenceApi::ModelStatistics);
      if (!reply.ok()) return SendError(response, reply.status());
      return SendJson(response, ProtoToJson(*reply));
    }
    case K::kRepositoryIndex: {
      inference::RepositoryIndexRequest asked;
      if (!absl::StripAsciiWhitespace(request.body).empty()) {
        absl::StatusOr<Json> json = ParseJson(request.body);
        if (!json.ok()) return SendError(response, json.status());
        if (const Json* ready = JsonMember(*json, "ready")) {
          if (!ready->is_boolean()) {
            return SendError(response, absl::InvalidArgumentError("\"ready\" must be true or false"));
          }
          asked.set_ready(ready->get<bool>());
        }
      }
      inference::RepositoryIndexResponse reply;
      api_.RepositoryIndex(asked, &reply);
      // Triton answers the list itself.
      return SendJson(response, ProtoToJson(reply)["models"]);
    }
    case K::kModelLoad:
    case K::kModelUnload: {
      const std::string authorization = request.get_header_value("Authorization");
      if (absl::Status s = access_.CheckControlHeader(
              request.has_header("Authorization") ? authorization.c_str() : nullptr);
          !s.ok()) {
        return SendError(response, s);
      }
      const absl::Status s = route.kind == K::kModelLoad ? api_.LoadModel(route.model)
                                                         : api_.UnloadModel(route.model);
      if (!s.ok()) return SendError(response, s);
      return Send(response, 200, kJson, "");
    }
    case K::kInfer: {
      std::optional<size_t> header_length;
      if (request.has_header(kHeaderLength)) {
        absl::StatusOr<size_t> n =
            ParseHeaderLength(request.get_header_value(kHeaderLength), request.body.size());
        if (!n.ok()) return SendError(response, n.status());
        header_length = *n;
      }
      HttpInferCall call(api_, request.body, header_length, route);
      if (!scheduler_.Submit(&call)) return SendError(response, scheduler_.Refusal());
      call.Wait();
      if (!call.status().ok()) return SendError(response, call.status());
      HttpInferResponse& answer = call.answer();
      return Send(response, 200, answer.header_length ? kBinary : kJson, std::move(answer.body),
                  answer.header_length);
    }
    case K::kNotFound:
    case K::kWrongMethod: break;
  }
}

}  // namespace precompile::server
