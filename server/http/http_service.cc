#include "server/http/http_service.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/json_text.h"
#include "base/log_text.h"
#include "base/proto_json.h"
#include "server/api/inference_job.h"
#include "server/http/http_codec.h"
#include "server/http/http_routes.h"

namespace precompile::server {
namespace {

constexpr char kJson[] = "application/json";
constexpr char kBinary[] = "application/octet-stream";
constexpr char kHeaderLength[] = "Inference-Header-Content-Length";
// Only inference carries tensors. Every other body is a few bytes of JSON,
// which a parser turns into a tree many times its size: a 57 MB body of
// empty arrays cost the repository index more than 1 GB.
constexpr size_t kMaxOtherBody = 64 << 10;

HttpAnswer Json200(const Json& json) {
  return {200, kJson, absl::Cord(DumpJson(json, /*pretty=*/false)), {}};
}

HttpAnswer ErrorAnswer(int status, absl::string_view message) {
  return {status, kJson, absl::Cord(ErrorBody(message)), {}};
}

HttpAnswer ErrorAnswer(const absl::Status& status) {
  return ErrorAnswer(HttpStatusOf(status.code()), status.message());
}

// A health answer: 200 for true, 400 for false, as KServe says; no body.
HttpAnswer HealthAnswer(bool ok) { return {ok ? 200 : 400, kJson, absl::Cord(), {}}; }

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

template <typename Request, typename Reply>
HttpAnswer ModelAnswer(const InferenceApi& api, const HttpRoute& route,
                       absl::Status (InferenceApi::*call)(const Request&, Reply*) const) {
  absl::StatusOr<Reply> reply = AskAboutModel(api, route, call);
  if (!reply.ok()) return ErrorAnswer(reply.status());
  return Json200(ProtoToJson(*reply));
}

// One infer request over HTTP, run by the request scheduler like a gRPC one.
// It answers its exchange when it completes, and deletes itself.
class HttpInferCall final : public InferenceJob {
 public:
  HttpInferCall(InferenceApi& api, HttpExchange& exchange, std::optional<size_t> header_length,
                HttpRoute route)
      : InferenceJob(api),
        exchange_(exchange),
        header_length_(header_length),
        route_(std::move(route)) {}

  void Complete() override {
    HttpExchange& exchange = exchange_;
    HttpAnswer answer;
    if (!this->answer().ok()) {
      answer = ErrorAnswer(this->answer());
    } else {
      answer = {200, encoded_.header_length ? kBinary : kJson, std::move(encoded_.body), {}};
      if (encoded_.header_length) {
        answer.fields.emplace_back(kHeaderLength, absl::StrCat(*encoded_.header_length));
      }
    }
    delete this;
    exchange.Answer(std::move(answer));
  }

  absl::Status Parse(inference::ModelInferRequest* request) override {
    request_ = request;
    return DecodeInferRequest(exchange_.request().body, header_length_, route_.model,
                              route_.version, request);
  }
  bool Cancelled() override { return exchange_.cancelled(); }
  std::string ClientCertificate() override {
    return exchange_.request().client_certificate_pem;
  }
  absl::Status Encode(const inference::ModelInferResponse& response,
                      std::vector<OutputTensor>& outputs) override {
    encoded_ = EncodeInferResponse(*request_, response, outputs);
    return absl::OkStatus();
  }

 private:
  HttpExchange& exchange_;
  const std::optional<size_t> header_length_;
  const HttpRoute route_;
  const inference::ModelInferRequest* request_ = nullptr;
  HttpInferResponse encoded_;
};

}  // namespace

HttpService::HttpService(const HttpOptions& options, InferenceApi& api,
                         RequestScheduler& scheduler, ControlAccess access)
    : options_(options),
      api_(api),
      scheduler_(scheduler),
      access_(std::move(access)),
      client_certificates_(!options.tls_client_ca_file.empty()) {}

HttpService::~HttpService() { Stop(absl::Now()); }

absl::StatusOr<std::unique_ptr<HttpService>> HttpService::Start(const HttpOptions& options,
                                                                InferenceApi& api,
                                                                RequestScheduler& scheduler,
                                                                ControlAccess access) {
  std::unique_ptr<HttpService> service(
      new HttpService(options, api, scheduler, std::move(access)));
  HttpTransportOptions transport;
  transport.address = options.address;
  transport.workers = options.threads;
  transport.max_connections = options.max_connections;
  transport.max_body_bytes = options.max_body_bytes;
  transport.max_body_buffer_bytes = options.max_body_buffer_bytes;
  transport.request_timeout = options.request_timeout;
  transport.tls_cert_file = options.tls_cert_file;
  transport.tls_key_file = options.tls_key_file;
  transport.tls_client_ca_file = options.tls_client_ca_file;
  auto started = HttpTransport::Start(transport, *service);
  if (!started.ok()) return started.status();
  service->transport_ = *std::move(started);
  return service;
}

void HttpService::Stop(absl::Time deadline) {
  if (transport_) transport_->Stop(deadline);
}

HttpAnswer HttpService::Refusal(int status, absl::string_view message) {
  return ErrorAnswer(status, message);
}

std::optional<HttpAnswer> HttpService::Screen(const HttpRequest& request) {
  const HttpRoute route = RouteOf(request.head.method, request.head.path);
  if (route.kind == HttpRoute::Kind::kServerLive) return HealthAnswer(api_.ServerLive());
  if (route.kind == HttpRoute::Kind::kServerReady) return HealthAnswer(api_.ServerReady());
  if (client_certificates_ && request.client_certificate_pem.empty()) {
    return ErrorAnswer(absl::UnauthenticatedError(
        "this server needs a client certificate signed by its client CA for every path but "
        "/v2/health/*"));
  }
  const std::string* encoding = request.head.Find("content-encoding");
  if (encoding != nullptr && *encoding != "identity") {
    return ErrorAnswer(415, absl::StrCat("Content-Encoding '", *encoding,
                                         "' is not supported: send the body uncompressed"));
  }
  const uint64_t length = request.head.content_length.value_or(0);
  if (route.kind != HttpRoute::Kind::kInfer && length > kMaxOtherBody) {
    return ErrorAnswer(413, absl::StrCat("the body is more than the ", kMaxOtherBody,
                                         " bytes this path takes (only inference bodies may be "
                                         "larger)"));
  }
  return std::nullopt;
}

void HttpService::Handle(HttpExchange& exchange) {
  const HttpRequest& request = exchange.request();
  const HttpRoute route = RouteOf(request.head.method, request.head.path);
  if (route.kind != HttpRoute::Kind::kInfer) return exchange.Answer(Answer(request, route));
  std::optional<size_t> header_length;
  if (const std::string* value = request.head.Find("inference-header-content-length")) {
    absl::StatusOr<size_t> n = ParseHeaderLength(*value, request.body.size());
    if (!n.ok()) return exchange.Answer(ErrorAnswer(n.status()));
    header_length = *n;
  }
  // The call answers the exchange from whichever thread completes it.
  auto* call = new HttpInferCall(api_, exchange, header_length, route);
  const absl::Status admitted =
      scheduler_.Submit(call, static_cast<int64_t>(request.body.size()));
  if (!admitted.ok()) {
    delete call;
    exchange.Answer(ErrorAnswer(admitted));
  }
}

absl::Status HttpService::CheckControl(const HttpRequest& request) const {
  const std::string* authorization = request.head.Find("authorization");
  return access_.CheckControlHeader(authorization ? authorization->c_str() : nullptr);
}

HttpAnswer HttpService::TraceSetting(const Routed& r) {
  const HttpRequest& request = r.http;
  // Triton's shape: {"trace_level": ["TIMESTAMPS"], "trace_rate": "1000", ...};
  // a change gives a setting a string or a list of strings, or null to
  // clear a model's own.
  RequestTracer::Changes changes;
  if (request.head.method == "POST" && !absl::StripAsciiWhitespace(request.body).empty()) {
    absl::StatusOr<Json> json = ParseJson(request.body);
    if (!json.ok()) return ErrorAnswer(json.status());
    if (!json->is_object()) {
      return ErrorAnswer(absl::InvalidArgumentError(
          "trace settings must be a JSON object of setting names to values"));
    }
    for (const auto& [name, value] : json->items()) {
      std::optional<std::vector<std::string>>& change = changes[name];
      if (value.is_null()) continue;
      change.emplace();
      if (value.is_string()) {
        change->push_back(value.get<std::string>());
        continue;
      }
      const bool strings =
          value.is_array() &&
          std::all_of(value.begin(), value.end(), [](const Json& v) { return v.is_string(); });
      if (!strings) {
        return ErrorAnswer(absl::InvalidArgumentError(absl::StrCat(
            "trace setting '", LoggedText(name, 64),
            "' must be a string, a list of strings, or null")));
      }
      for (const Json& v : value) change->push_back(v.get<std::string>());
    }
  }
  if (!changes.empty()) {
    if (absl::Status s = CheckControl(request); !s.ok()) return ErrorAnswer(s);
  }
  absl::StatusOr<RequestTracer::Settings> settings = api_.TraceSetting(r.route.model, changes);
  if (!settings.ok()) return ErrorAnswer(settings.status());
  Json reply = Json::object();
  for (const auto& [name, values] : *settings) {
    if (name == "trace_level") {
      reply[name] = values;
    } else {
      reply[name] = values.empty() ? "" : values.front();
    }
  }
  return Json200(reply);
}

HttpAnswer HttpService::Answer(const HttpRequest& request, const HttpRoute& route) {
  using K = HttpRoute::Kind;
  // What answers each route but inference's (HttpService::Handle runs it).
  static constexpr std::pair<K, Handler> kHandlers[] = {
      {K::kNotFound, &HttpService::NotFound},
      {K::kWrongMethod, &HttpService::WrongMethod},
      {K::kServerLive, &HttpService::ServerLive},
      {K::kServerReady, &HttpService::ServerReady},
      {K::kModelReady, &HttpService::ModelReady},
      {K::kServerMetadata, &HttpService::ServerMetadata},
      {K::kModelMetadata, &HttpService::ModelMetadata},
      {K::kModelStatistics, &HttpService::ModelStatistics},
      {K::kModelConfig, &HttpService::ModelConfig},
      {K::kRepositoryIndex, &HttpService::RepositoryIndex},
      {K::kModelLoad, &HttpService::ModelLoad},
      {K::kModelUnload, &HttpService::ModelUnload},
      {K::kTraceSetting, &HttpService::TraceSetting},
  };
  for (const auto& [kind, handler] : kHandlers) {
    if (kind == route.kind) return (this->*handler)({request, route});
  }
  return ErrorAnswer(absl::InternalError("this route has no handler"));
}

HttpAnswer HttpService::NotFound(const Routed& r) {
  return ErrorAnswer(absl::NotFoundError(absl::StrCat("no such path: ", r.http.head.method, " ",
                                                      r.http.head.path,
                                                      " (the KServe v2 paths start with /v2)")));
}

HttpAnswer HttpService::WrongMethod(const Routed& r) {
  return ErrorAnswer(405, absl::StrCat(r.http.head.path, " takes ", r.route.method, ", not ",
                                       r.http.head.method));
}

HttpAnswer HttpService::ServerLive(const Routed&) { return HealthAnswer(api_.ServerLive()); }

HttpAnswer HttpService::ServerReady(const Routed&) { return HealthAnswer(api_.ServerReady()); }

HttpAnswer HttpService::ModelReady(const Routed& r) {
  return HealthAnswer(api_.ModelReady(r.route.model, r.route.version));
}

HttpAnswer HttpService::ServerMetadata(const Routed&) {
  inference::ServerMetadataResponse reply;
  api_.ServerMetadata(&reply);
  return Json200(ProtoToJson(reply));
}

HttpAnswer HttpService::ModelMetadata(const Routed& r) {
  return ModelAnswer(api_, r.route, &InferenceApi::ModelMetadata);
}

HttpAnswer HttpService::ModelStatistics(const Routed& r) {
  return ModelAnswer(api_, r.route, &InferenceApi::ModelStatistics);
}

HttpAnswer HttpService::ModelConfig(const Routed& r) {
  auto reply = AskAboutModel(api_, r.route, &InferenceApi::ModelConfig);
  if (!reply.ok()) return ErrorAnswer(reply.status());
  // Triton answers the configuration itself, not wrapped.
  return Json200(ProtoToJson(reply->config()));
}

HttpAnswer HttpService::RepositoryIndex(const Routed& r) {
  inference::RepositoryIndexRequest asked;
  if (!absl::StripAsciiWhitespace(r.http.body).empty()) {
    absl::StatusOr<Json> json = ParseJson(r.http.body);
    if (!json.ok()) return ErrorAnswer(json.status());
    if (const Json* ready = JsonMember(*json, "ready")) {
      if (!ready->is_boolean()) {
        return ErrorAnswer(absl::InvalidArgumentError("\"ready\" must be true or false"));
      }
      asked.set_ready(ready->get<bool>());
    }
  }
  inference::RepositoryIndexResponse reply;
  api_.RepositoryIndex(asked, &reply);
  // Triton answers the list itself.
  return Json200(ProtoToJson(reply)["models"]);
}

HttpAnswer HttpService::ModelLoad(const Routed& r) {
  if (absl::Status s = CheckControl(r.http); !s.ok()) return ErrorAnswer(s);
  if (absl::Status s = api_.LoadModel(r.route.model); !s.ok()) return ErrorAnswer(s);
  return {200, kJson, absl::Cord(), {}};
}

HttpAnswer HttpService::ModelUnload(const Routed& r) {
  if (absl::Status s = CheckControl(r.http); !s.ok()) return ErrorAnswer(s);
  if (absl::Status s = api_.UnloadModel(r.route.model); !s.ok()) return ErrorAnswer(s);
  return {200, kJson, absl::Cord(), {}};
}

}  // namespace precompile::server
