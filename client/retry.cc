#include "client/retry.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "proto/admin.grpc.pb.h"
#include "proto/health.grpc.pb.h"
#include "proto/inference.grpc.pb.h"

namespace precompile::client {
namespace {

// gRPC's duration syntax: seconds with a fraction and an "s".
std::string Seconds(absl::Duration d) {
  d = std::clamp(d, absl::Milliseconds(1), absl::Hours(1));
  return absl::StrFormat("%.3fs", absl::ToDoubleSeconds(d));
}

}  // namespace

absl::StatusOr<std::string> RetryServiceConfig(const RetryPolicy& policy) {
  if (policy.max_attempts < 1 || policy.max_attempts > kMaxAttempts) {
    return absl::InvalidArgumentError(absl::StrCat("max_attempts is ", policy.max_attempts,
                                                   ": from 1 to ", kMaxAttempts,
                                                   ", the most gRPC retries a call"));
  }
  nlohmann::json config = nlohmann::json::object();
  if (policy.max_attempts == 1) return config.dump();
  nlohmann::json names = nlohmann::json::array();
  auto add = [&names](const char* service, std::initializer_list<const char*> methods) {
    for (const char* method : methods) names.push_back({{"service", service}, {"method", method}});
  };
  add(inference::GRPCInferenceService::service_full_name(),
      {"ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer",
       "ModelConfig", "ModelStatistics", "RepositoryIndex"});
  add(grpc::health::v1::Health::service_full_name(), {"Check"});
  add(precompile::v1::PrecompileAdmin::service_full_name(),
      {"ListModels", "GetSummary", "GetFrames", "GetCoverage", "ListWarnings"});
  config["methodConfig"] = {{
      {"name", std::move(names)},
      {"retryPolicy",
       {
           {"maxAttempts", policy.max_attempts},
           {"initialBackoff", Seconds(policy.initial_backoff)},
           {"maxBackoff", Seconds(policy.max_backoff)},
           {"backoffMultiplier", std::max(1.0, policy.multiplier)},
           {"retryableStatusCodes", nlohmann::json::array({"UNAVAILABLE"})},
       }},
  }};
  return config.dump();
}

absl::Status RetriedResult(const grpc::Status& status, int max_attempts) {
  absl::Status result = FromGrpcStatus(status);
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE || max_attempts <= 1) return result;
  return absl::Status(result.code(),
                      absl::StrCat(result.message(), " (after up to ", max_attempts, " attempts)"));
}

}  // namespace precompile::client
