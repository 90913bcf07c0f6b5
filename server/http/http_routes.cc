#include "server/http/http_routes.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace precompile::server {
namespace {

using K = HttpRoute::Kind;

constexpr char kOptionalVersion[] = "[/versions/{version}]";

constexpr HttpRoutePattern kRoutes[] = {
    {"/v2", K::kServerMetadata, "GET"},
    {"/v2/health/live", K::kServerLive, "GET"},
    {"/v2/health/ready", K::kServerReady, "GET"},
    {"/v2/trace/setting", K::kTraceSetting, "GET or POST"},
    {"/v2/models/stats", K::kModelStatistics, "GET"},
    {"/v2/models/{model}[/versions/{version}]", K::kModelMetadata, "GET"},
    {"/v2/models/{model}[/versions/{version}]/ready", K::kModelReady, "GET"},
    {"/v2/models/{model}[/versions/{version}]/config", K::kModelConfig, "GET"},
    {"/v2/models/{model}[/versions/{version}]/stats", K::kModelStatistics, "GET"},
    {"/v2/models/{model}[/versions/{version}]/infer", K::kInfer, "POST"},
    {"/v2/models/{model}[/versions/{version}]/trace/setting", K::kTraceSetting, "GET or POST"},
    {"/v2/repository/index", K::kRepositoryIndex, "POST"},
    {"/v2/repository/models/{model}/load", K::kModelLoad, "POST"},
    {"/v2/repository/models/{model}/unload", K::kModelUnload, "POST"},
};

std::vector<absl::string_view> Segments(absl::string_view path) {
  std::vector<absl::string_view> segments = absl::StrSplit(path, '/');
  if (segments.size() > 2 && segments.back().empty()) segments.pop_back();
  return segments;
}

// A pattern with its optional part taken or left out, split into segments.
struct Expanded {
  const HttpRoutePattern* pattern;
  std::vector<std::string> segments;
};

// Built once: every request is matched against it.
const std::vector<Expanded>& ExpandedRoutes() {
  static const std::vector<Expanded>* const expanded = [] {
    auto* all = new std::vector<Expanded>;
    for (const HttpRoutePattern& pattern : kRoutes) {
      const absl::string_view path = pattern.path;
      all->push_back({&pattern, absl::StrSplit(absl::StrReplaceAll(path, {{kOptionalVersion, ""}}), '/')});
      if (absl::StrContains(path, kOptionalVersion)) {
        all->push_back({&pattern, absl::StrSplit(absl::StrReplaceAll(path, {{"[", ""}, {"]", ""}}), '/')});
      }
    }
    return all;
  }();
  return *expanded;
}

// The model and version `path` names if it fits `pattern`.
std::optional<HttpRoute> Fit(const std::vector<std::string>& pattern,
                             const std::vector<absl::string_view>& path) {
  if (pattern.size() != path.size()) return std::nullopt;
  HttpRoute route;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == "{model}" || pattern[i] == "{version}") {
      if (path[i].empty()) return std::nullopt;
      (pattern[i] == "{model}" ? route.model : route.version) = std::string(path[i]);
    } else if (pattern[i] != path[i]) {
      return std::nullopt;
    }
  }
  return route;
}

bool Takes(const char* methods, absl::string_view method) {
  for (absl::string_view taken : absl::StrSplit(methods, " or ")) {
    if (method == taken || (taken == "GET" && method == "HEAD")) return true;
  }
  return false;
}

}  // namespace

absl::Span<const HttpRoutePattern> HttpRoutePatterns() { return kRoutes; }

HttpRoute RouteOf(absl::string_view method, absl::string_view path) {
  const std::vector<absl::string_view> segments = Segments(path);
  for (const Expanded& expanded : ExpandedRoutes()) {
    std::optional<HttpRoute> route = Fit(expanded.segments, segments);
    if (!route) continue;
    if (Takes(expanded.pattern->methods, method)) {
      route->kind = expanded.pattern->kind;
    } else {
      route->kind = K::kWrongMethod;
      route->method = expanded.pattern->methods;
    }
    return *route;
  }
  return HttpRoute{};
}

}  // namespace precompile::server
