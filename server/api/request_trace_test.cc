#include "server/api/request_trace.h"

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/json_text.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace precompile::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return (std::filesystem::path(::testing::TempDir()) / name).string();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

RequestTracer::Changes Set(const std::string& name, std::vector<std::string> values) {
  return {{name, std::move(values)}};
}

int Sampled(RequestTracer& tracer, const std::string& model, int requests) {
  int traced = 0;
  for (int i = 0; i < requests; ++i) traced += tracer.Sample(model) != 0;
  return traced;
}

TEST(RequestTracerTest, OffByDefaultTracesNothing) {
  RequestTracer tracer(TempPath("off.json"), {});
  EXPECT_EQ(Sampled(tracer, "m", 5000), 0);
  EXPECT_THAT(tracer.Get("")["trace_level"], ElementsAre("OFF"));
  EXPECT_THAT(tracer.Get("")["trace_rate"], ElementsAre("1000"));
  EXPECT_THAT(tracer.Get("")["trace_count"], ElementsAre("-1"));
}

TEST(RequestTracerTest, EveryNthRequestUntilTheCountRunsOut) {
  RequestTracer tracer(TempPath("rate.json"), {});
  ASSERT_TRUE(tracer.Update("", {{"trace_level", {{"TIMESTAMPS"}}},
                                 {"trace_rate", {{"3"}}},
                                 {"trace_count", {{"2"}}}}).ok());
  EXPECT_EQ(tracer.Sample("m"), 0u);
  EXPECT_EQ(tracer.Sample("m"), 0u);
  EXPECT_EQ(tracer.Sample("m"), 1u);
  EXPECT_THAT(tracer.Get("")["trace_count"], ElementsAre("1"));
  EXPECT_EQ(Sampled(tracer, "m", 3), 1);
  EXPECT_THAT(tracer.Get("")["trace_count"], ElementsAre("0"));
  EXPECT_EQ(Sampled(tracer, "m", 30), 0);
}

TEST(RequestTracerTest, AModelsOwnSettingsOverrideAndClearBackToTheServers) {
  RequestTracer tracer(TempPath("model.json"), {});
  auto changed =
      tracer.Update("bert", {{"trace_level", {{"TIMESTAMPS"}}}, {"trace_rate", {{"1"}}}});
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_THAT((*changed)["trace_level"], ElementsAre("TIMESTAMPS"));
  EXPECT_EQ(Sampled(tracer, "bert", 4), 4);
  EXPECT_EQ(Sampled(tracer, "mlp", 4000), 0);  // The server's level is still OFF.
  EXPECT_THAT(tracer.Get("mlp")["trace_level"], ElementsAre("OFF"));

  changed = tracer.Update("bert", {{"trace_level", std::nullopt}, {"trace_rate", std::nullopt}});
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_THAT((*changed)["trace_level"], ElementsAre("OFF"));
  EXPECT_EQ(Sampled(tracer, "bert", 4000), 0);
}

TEST(RequestTracerTest, RefusesWhatItCannotDoAndChangesNothing) {
  RequestTracer tracer(TempPath("refuse.json"), {});
  const struct {
    RequestTracer::Changes changes;
    const char* model;
    const char* message;
  } cases[] = {
      {Set("trace_level", {"TENSORS"}), "", "TENSORS is not traced"},
      {Set("trace_rate", {"0"}), "", "trace_rate takes one integer of at least 1"},
      {Set("trace_rate", {"99999999999999999999"}), "", "trace_rate takes one integer"},
      {Set("trace_count", {"-2"}), "", "trace_count takes one integer of at least -1"},
      {Set("trace_rate", {"1", "2"}), "", "takes one integer"},
      {Set("trace_file", {"/etc/passwd"}), "", "set only by the server's --trace_file"},
      {Set("log_frequency", {"5"}), "m", "log_frequency is the server's"},
      {Set("colour", {"red"}), "", "unknown trace setting 'colour'"},
      {{{"trace_rate", std::nullopt}}, "", "cannot be cleared"},
  };
  for (const auto& c : cases) {
    auto changed = tracer.Update(c.model, c.changes);
    ASSERT_FALSE(changed.ok()) << c.message;
    EXPECT_EQ(changed.status().code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(std::string(changed.status().message()), HasSubstr(c.message));
  }
  EXPECT_THAT(tracer.Get("")["trace_rate"], ElementsAre("1000"));
  EXPECT_THAT(tracer.Get("")["trace_file"], ElementsAre(TempPath("refuse.json")));
}

TEST(RequestTracerTest, WithoutAFileNoLevelButOffIsTaken) {
  RequestTracer tracer("", {});
  auto changed = tracer.Update("m", Set("trace_level", {"TIMESTAMPS"}));
  ASSERT_FALSE(changed.ok());
  EXPECT_EQ(changed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(changed.status().message()), HasSubstr("--trace_file"));
  EXPECT_EQ(Sampled(tracer, "m", 2000), 0);
}

RequestTrace TraceOf(uint64_t id, const std::string& request_id) {
  RequestTrace t;
  t.id = id;
  t.model = "mlp";
  t.version = 3;
  t.request_id = request_id;
  t.outcome = "variant";
  const absl::Time start = absl::FromUnixNanos(1000);
  t.timestamps = {{"REQUEST_START", start}, {"REQUEST_END", start + absl::Nanoseconds(500)}};
  FrameCallEvent frame;
  frame.frame = "forward";
  frame.is_entry = true;
  frame.variant_id = "v0";
  frame.dispatch_time = absl::Nanoseconds(70);
  frame.run_time = absl::Nanoseconds(300);
  t.frame_calls.push_back(frame);
  return t;
}

TEST(RequestTracerTest, WritesTritonsArrayOfObjectsWithClientTextEscaped) {
  const std::string path = TempPath("written.json");
  {
    RequestTracer tracer(path, {true, 1, -1, 0});
    tracer.Write(TraceOf(1, "a\"b\\c\n"));
    tracer.Write(TraceOf(2, std::string(10000, 'x')));
    // Not UTF-8: the file must stay JSON all the same.
    tracer.Write(TraceOf(3, "\xff\xfe]}"));
    // Still open: every object so far is there, the array not yet closed.
    EXPECT_THAT(ReadFile(path), HasSubstr("{\"id\":3,\"frames\":"));
  }
  const std::string text = ReadFile(path);
  EXPECT_EQ(text.substr(0, 2), "[\n");
  EXPECT_EQ(text.substr(text.size() - 3), "\n]\n");
  absl::StatusOr<Json> parsed = ParseJson(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << text;
  ASSERT_TRUE(parsed->is_array());
  ASSERT_EQ(parsed->size(), 9u);
  const Json& header = (*parsed)[0];
  EXPECT_EQ(header, Json({{"id", 1},
                          {"model_name", "mlp"},
                          {"model_version", 3},
                          {"request_id", "a\"b\\c\n"},
                          {"outcome", "variant"}}));
  EXPECT_EQ((*parsed)[1], Json({{"id", 1},
                                {"timestamps",
                                 {{{"name", "REQUEST_START"}, {"ns", 1000}},
                                  {{"name", "REQUEST_END"}, {"ns", 1500}}}}}));
  EXPECT_EQ((*parsed)[2], Json({{"id", 1},
                                {"frames",
                                 {{{"frame", "forward"},
                                   {"entry", true},
                                   {"outcome", "variant"},
                                   {"variant", "v0"},
                                   {"guards_ns", 70},
                                   {"run_ns", 300}}}}}));
  // A client's request id is cut, not copied whole.
  EXPECT_EQ((*parsed)[3]["request_id"], std::string(256, 'x'));
  // Bytes that are not UTF-8 become U+FFFD; the rest stays.
  EXPECT_EQ((*parsed)[6]["request_id"], "\xef\xbf\xbd\xef\xbf\xbd]}");
}

TEST(RequestTracerTest, LogFrequencyStartsAFileEveryNTraces) {
  const std::string path = TempPath("rotated.json");
  {
    RequestTracer tracer(path, {true, 1, -1, 2});
    for (uint64_t id = 1; id <= 5; ++id) tracer.Write(TraceOf(id, "r"));
  }
  const std::string first = ReadFile(path + ".0");
  EXPECT_THAT(first, HasSubstr("{\"id\":1,"));
  EXPECT_THAT(first, HasSubstr("{\"id\":2,"));
  EXPECT_EQ(first.substr(first.size() - 3), "\n]\n");
  EXPECT_THAT(ReadFile(path + ".1"), HasSubstr("{\"id\":4,"));
  const std::string last = ReadFile(path + ".2");
  EXPECT_THAT(last, HasSubstr("{\"id\":5,"));
  EXPECT_EQ(last.substr(last.size() - 3), "\n]\n");
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(RequestTracerTest, SamplesWritesAndUpdatesConcurrently) {
  const std::string path = TempPath("concurrent.json");
  std::atomic<int> written{0};
  {
    RequestTracer tracer(path, {true, 2, -1, 3});
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < 200; ++i) {
          if (const uint64_t id = tracer.Sample(i % 2 ? "a" : "b"); id != 0) {
            tracer.Write(TraceOf(id, "r"));
            written.fetch_add(1);
          }
        }
      });
    }
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        ASSERT_TRUE(tracer.Update("a", Set("trace_rate", {i % 2 ? "1" : "3"})).ok());
        tracer.Get("a");
      }
    });
    for (std::thread& t : threads) t.join();
  }
  // Every trace went to exactly one file, each file a closed array.
  int found = 0;
  for (int index = 0; std::filesystem::exists(path + "." + std::to_string(index)); ++index) {
    const std::string text = ReadFile(path + "." + std::to_string(index));
    EXPECT_EQ(text.substr(text.size() - 3), "\n]\n");
    for (size_t at = text.find(",\"frames\":"); at != std::string::npos;
         at = text.find(",\"frames\":", at + 1)) {
      ++found;
    }
  }
  EXPECT_GT(written.load(), 0);
  EXPECT_EQ(found, written.load());
}

}  // namespace
}  // namespace precompile::server
