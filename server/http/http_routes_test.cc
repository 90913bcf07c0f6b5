// Which route each KServe v2 path takes.
#include "server/http/http_routes.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <string>

namespace precompile::server {
namespace {

using K = HttpRoute::Kind;

TEST(RouteOf, NamesEveryKServePathAndItsModelAndVersion) {
  EXPECT_EQ(RouteOf("GET", "/v2").kind, K::kServerMetadata);
  EXPECT_EQ(RouteOf("GET", "/v2/health/live").kind, K::kServerLive);
  EXPECT_EQ(RouteOf("HEAD", "/v2/health/ready").kind, K::kServerReady);
  EXPECT_EQ(RouteOf("GET", "/v2/models/stats").kind, K::kModelStatistics);
  EXPECT_EQ(RouteOf("POST", "/v2/repository/index").kind, K::kRepositoryIndex);

  HttpRoute infer = RouteOf("POST", "/v2/models/bert/versions/3/infer");
  EXPECT_EQ(infer.kind, K::kInfer);
  EXPECT_EQ(infer.model, "bert");
  EXPECT_EQ(infer.version, "3");
  HttpRoute meta = RouteOf("GET", "/v2/models/bert/");
  EXPECT_EQ(meta.kind, K::kModelMetadata);
  EXPECT_EQ(meta.model, "bert");
  EXPECT_EQ(meta.version, "");
  EXPECT_EQ(RouteOf("GET", "/v2/models/bert/versions/2/config").kind, K::kModelConfig);
  EXPECT_EQ(RouteOf("GET", "/v2/models/bert/ready").kind, K::kModelReady);
  EXPECT_EQ(RouteOf("GET", "/v2/models/bert/stats").model, "bert");
  HttpRoute load = RouteOf("POST", "/v2/repository/models/mlp/unload");
  EXPECT_EQ(load.kind, K::kModelUnload);
  EXPECT_EQ(load.model, "mlp");
  EXPECT_EQ(RouteOf("GET", "/v2/trace/setting").kind, K::kTraceSetting);
  EXPECT_EQ(RouteOf("POST", "/v2/trace/setting").model, "");
  HttpRoute trace = RouteOf("POST", "/v2/models/bert/trace/setting");
  EXPECT_EQ(trace.kind, K::kTraceSetting);
  EXPECT_EQ(trace.model, "bert");
}

TEST(RouteOf, RefusesUnknownPathsAndNamesTheMethodAKnownOneTakes) {
  for (const char* path : {"/", "/v1/models/m", "/v2/models", "/v2/models/m/explain",
                           "/v2/health", "/v2/models//infer", "/v2/repository/models/m/reload"}) {
    EXPECT_EQ(RouteOf("GET", path).kind, K::kNotFound) << path;
  }
  HttpRoute wrong = RouteOf("GET", "/v2/models/m/infer");
  EXPECT_EQ(wrong.kind, K::kWrongMethod);
  EXPECT_STREQ(wrong.method, "POST");
  EXPECT_EQ(RouteOf("POST", "/v2/health/live").kind, K::kWrongMethod);
  HttpRoute put = RouteOf("PUT", "/v2/models/m/trace/setting");
  EXPECT_EQ(put.kind, K::kWrongMethod);
  EXPECT_STREQ(put.method, "GET or POST");
  EXPECT_EQ(RouteOf("GET", "/v2/trace/settings").kind, K::kNotFound);
}

TEST(RouteOf, TakesTheVersionedFormOfEveryModelPath) {
  for (const char* tail : {"", "/ready", "/config", "/stats", "/infer", "/trace/setting"}) {
    const std::string plain = std::string("/v2/models/m") + tail;
    const std::string versioned = std::string("/v2/models/m/versions/7") + tail;
    for (const char* method : {"GET", "POST"}) {
      const HttpRoute a = RouteOf(method, plain);
      const HttpRoute b = RouteOf(method, versioned);
      EXPECT_EQ(a.kind, b.kind) << versioned;
      EXPECT_EQ(b.model, "m") << versioned;
      EXPECT_EQ(b.version, "7") << versioned;
      EXPECT_EQ(a.version, "") << plain;
    }
  }
  // A model may be called "versions" or "stats" where the path says so.
  EXPECT_EQ(RouteOf("GET", "/v2/models/versions/ready").model, "versions");
  EXPECT_EQ(RouteOf("GET", "/v2/models/stats/ready").model, "stats");
  EXPECT_EQ(RouteOf("GET", "/v2/models/stats").model, "");
}

TEST(HttpRoutePatterns, EveryRouteIsReachableAndNoneIsHiddenByAnEarlierOne) {
  std::set<K> kinds;
  for (const HttpRoutePattern& pattern : HttpRoutePatterns()) {
    kinds.insert(pattern.kind);
    // The pattern itself, its parameters filled in, takes its own route.
    std::string path = pattern.path;
    for (auto [from, to] : {std::pair<std::string, std::string>{"[/versions/{version}]", ""},
                            {"{model}", "m"}}) {
      for (size_t at; (at = path.find(from)) != std::string::npos;) path.replace(at, from.size(), to);
    }
    const char* method = std::string(pattern.methods).rfind("POST", 0) == 0 ? "POST" : "GET";
    EXPECT_EQ(RouteOf(method, path).kind, pattern.kind) << pattern.path;
  }
  EXPECT_EQ(kinds.size(), 12u);  // Every kind but kNotFound and kWrongMethod.
}

}  // namespace
}  // namespace precompile::server
