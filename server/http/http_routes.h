// The KServe v2 HTTP/REST paths as one table of patterns: which route a
// request's method and path take, and the model and version the path
// names. HttpService (server/http/http_service.h) answers each route with a
// handler of its own.
//
// A pattern is literal segments plus `{model}` and `{version}`, each any
// non-empty segment; `[/versions/{version}]` is optional. A path with a
// trailing slash names what it names without one. The first pattern a path
// fits decides (so /v2/models/stats comes before /v2/models/{model}).
//
// Thread safety: free functions over a constant table.
#ifndef PRECOMPILE_SERVER_HTTP_HTTP_ROUTES_H_
#define PRECOMPILE_SERVER_HTTP_HTTP_ROUTES_H_

#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace precompile::server {

// What an HTTP request asks for, from its method and path.
struct HttpRoute {
  enum class Kind {
    kServerMetadata,
    kServerLive,
    kServerReady,
    kModelMetadata,
    kModelReady,
    kModelConfig,
    kModelStatistics,  // Of one model, or of every model at /v2/models/stats.
    kInfer,
    kRepositoryIndex,
    kModelLoad,
    kModelUnload,
    kTraceSetting,  // The server's, or one model's.
    kNotFound,
    kWrongMethod,  // A known path with another method: `method` says which.
  };
  Kind kind = Kind::kNotFound;
  std::string model;        // Empty where the path names none.
  std::string version;      // Empty: the newest served.
  const char* method = "";  // The methods the path takes, for kWrongMethod.
};

// One row of the table. `methods` is "GET", "POST" or "GET or POST"; a
// route that takes GET also takes HEAD.
struct HttpRoutePattern {
  const char* path;
  HttpRoute::Kind kind;
  const char* methods;
};

// Every route, in the order paths are matched against them.
absl::Span<const HttpRoutePattern> HttpRoutePatterns();

// `path` is decoded (no %-escapes) and without the query string.
HttpRoute RouteOf(absl::string_view method, absl::string_view path);

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_HTTP_HTTP_ROUTES_H_
