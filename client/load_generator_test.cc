// The load generator (precompile_load's RunLoadTool, and LoadGenerator)
// against the real server on loopback: short bounded runs of a mix of
// variant hits, eager fallbacks and refusals, closed and open loop.
#include "client/load_generator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "base/json_text.h"
#include "client/load_tool.h"
#include "tests/testing/artifacts.h"
#include "tests/testing/test_server.h"

namespace precompile::client {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kMix[] = R"([
  {"name": "hit", "weight": 2, "model": "mlp",
   "inputs": {"x": {"shape": [8, 4], "datatype": "FP32", "fill": "random"}}, "params": {}},
  {"name": "eager", "weight": 1, "model": "loop",
   "inputs": {"x": {"shape": [8, 4], "fill": "random"}}, "params": {"n": 1}},
  {"name": "refused", "weight": 1, "model": "mlp",
   "inputs": {"x": {"shape": [1, 4], "fill": "random"}}}
])";

int64_t Count(const Json& object, const std::string& key) {
  const Json* value = JsonMember(object, key);
  return value == nullptr ? 0 : value->get<int64_t>();
}

// Member `key` of `object`, or an empty object when there is none.
const Json& Member(const Json& object, const std::string& key) {
  static const Json* const kEmpty = new Json(Json::object());
  const Json* value = JsonMember(object, key);
  return value == nullptr ? *kEmpty : *value;
}

std::vector<std::string> Keys(const Json& object) {
  std::vector<std::string> keys;
  for (const auto& [key, value] : object.items()) keys.push_back(key);
  return keys;
}

class LoadGeneratorTest : public testing::ExampleServerTest {
 protected:
  void SetUp() override {
    ASSERT_NE(server_, nullptr);
    mix_path_ = testing::WriteTempFile("mix.json", kMix);
    json_path_ = precompile::testing::NewTempDirectory("load") + "/report.json";
  }

  int Run(std::vector<std::string> args) {
    std::ostringstream out, err;
    const int code = RunLoadTool(args, out, err);
    out_ = out.str();
    err_ = err.str();
    return code;
  }

  // A client of the test's server.
  std::unique_ptr<InferenceClient> Client() {
    ClientOptions options;
    options.address = testing::AddressOf(*server_);
    return *InferenceClient::Create(options);
  }

  Json Report() {
    std::ifstream in(json_path_);
    std::stringstream text;
    text << in.rdbuf();
    absl::StatusOr<Json> json = ParseJson(text.str());
    EXPECT_TRUE(json.ok()) << json.status();
    return json.ok() ? *json : Json();
  }

  std::string mix_path_;
  std::string json_path_;
  std::string out_;
  std::string err_;
};

TEST_F(LoadGeneratorTest, ClosedLoopCountsVariantsEagerFallbacksAndRefusals) {
  ASSERT_EQ(Run({"--address=" + testing::AddressOf(*server_), "--mix=" + mix_path_,
                 "--concurrency=1,4", "--duration=1", "--json_out=" + json_path_, "--quiet"}),
            0)
      << err_;
  EXPECT_THAT(out_, HasSubstr("PHASE"));
  EXPECT_THAT(out_, HasSubstr("concurrency=4"));
  EXPECT_THAT(out_, HasSubstr("FAILED_PRECONDITION"));
  const Json report = Report();
  EXPECT_EQ(report.at("mode").get<std::string>(), "closed");
  const auto& phases = report.at("phases");
  ASSERT_EQ(phases.size(), 2u);
  for (const Json& phase : phases) {
    const std::string name = phase.at("name").get<std::string>();
    const int64_t requests = Count(phase, "requests");
    EXPECT_GT(requests, 0) << name;
    EXPECT_GT(phase.at("elapsed_s").get<double>(), 0.9) << name;
    EXPECT_LT(phase.at("elapsed_s").get<double>(), 10) << name;
    EXPECT_GT(phase.at("throughput_rps").get<double>(), 0) << name;

    const Json& codes = Member(phase, "status_codes");
    const Json& outcomes = Member(phase, "outcomes");
    EXPECT_EQ(Count(codes, "OK") + Count(codes, "FAILED_PRECONDITION"), requests) << name;
    EXPECT_EQ(Count(outcomes, "variant") + Count(outcomes, "eager_fallback"), Count(codes, "OK"))
        << name;
    EXPECT_EQ(Count(outcomes, "FAILED_PRECONDITION"), Count(codes, "FAILED_PRECONDITION"));
    EXPECT_EQ(Count(phase, "errors"), Count(codes, "FAILED_PRECONDITION"));

    // Each template gets the one outcome its request must get.
    const Json& templates = Member(phase, "templates");
    EXPECT_EQ(Count(Member(templates, "hit"), "variant"), Count(outcomes, "variant")) << name;
    EXPECT_EQ(Count(Member(templates, "eager"), "eager_fallback"),
              Count(outcomes, "eager_fallback"))
        << name;
    EXPECT_EQ(Count(Member(templates, "refused"), "FAILED_PRECONDITION"),
              Count(outcomes, "FAILED_PRECONDITION"))
        << name;
    // A thousand requests a second here, a few under sanitizers: with 40 or
    // more, all three outcomes show (a miss is 0.75^40 = 1e-5 likely).
    if (requests >= 40) {
      EXPECT_THAT(Keys(codes), ElementsAre("FAILED_PRECONDITION", "OK")) << name;
      EXPECT_THAT(Keys(outcomes), ElementsAre("FAILED_PRECONDITION", "eager_fallback", "variant"))
          << name;
      EXPECT_THAT(Keys(Member(phase, "latency_ms_by_outcome")),
                  ElementsAre("FAILED_PRECONDITION", "eager_fallback", "variant"));
    }

    const Json& latency = Member(phase, "latency_ms");
    EXPECT_THAT(Keys(latency), ElementsAre("min", "mean", "p50", "p90", "p99", "p99_9", "max"));
    if (Keys(latency).size() == 7) {
      EXPECT_GT(latency.at("p50").get<double>(), 0);
      EXPECT_LE(latency.at("p50").get<double>(), latency.at("p99").get<double>());
      EXPECT_LE(latency.at("p99_9").get<double>(), latency.at("max").get<double>());
    }
  }
  EXPECT_EQ(phases[0].at("concurrency").get<int64_t>(), 1);
  EXPECT_EQ(phases[1].at("concurrency").get<int64_t>(), 4);
}

TEST_F(LoadGeneratorTest, OpenLoopSendsAtTheRate) {
  ASSERT_EQ(Run({"--address=" + testing::AddressOf(*server_), "--mix=" + mix_path_, "--rate=200",
                 "--arrivals=constant", "--requests=100", "--json_out=" + json_path_, "--quiet"}),
            0)
      << err_;
  const Json report = Report();
  EXPECT_EQ(report.at("mode").get<std::string>(), "open");
  EXPECT_EQ(report.at("arrivals").get<std::string>(), "constant");
  const Json& phase = report.at("phases").at(0);
  EXPECT_EQ(phase.at("name").get<std::string>(), "rate=200/s");
  EXPECT_EQ(Count(phase, "requests"), 100);
  EXPECT_EQ(Count(phase, "skipped"), 0);
  // 100 requests 5 ms apart: the last leaves 495 ms after the first, so an
  // open loop never exceeds its rate (however slowly the server answers).
  EXPECT_GT(phase.at("elapsed_s").get<double>(), 0.49);
  EXPECT_LT(phase.at("throughput_rps").get<double>(), 203);
}

TEST_F(LoadGeneratorTest, OpenLoopSkipsArrivalsOverTheOutstandingCap) {
  ASSERT_EQ(Run({"--address=" + testing::AddressOf(*server_), "--mix=" + mix_path_, "--rate=50000",
                 "--max_outstanding=2", "--duration=0.3", "--json_out=" + json_path_, "--quiet"}),
            0)
      << err_;
  const Json report = Report();
  const Json& phase = report.at("phases").at(0);
  EXPECT_GT(Count(phase, "skipped"), 0);
  EXPECT_GT(Count(phase, "requests"), 0);
}

TEST_F(LoadGeneratorTest, RecordsAFixedNumberOfRequestsAndReportsProgress) {
  auto mix = ParseRequestMix(kMix, 1);
  ASSERT_TRUE(mix.ok()) << mix.status();
  auto client = Client();
  std::ostringstream progress;
  LoadOptions options;
  options.concurrency = {3};
  options.requests = 150;
  options.warmup = absl::Milliseconds(200);
  options.progress = &progress;
  options.progress_interval = absl::Milliseconds(50);
  LoadGenerator generator(*client, *std::move(mix), options);
  absl::StatusOr<LoadReport> report = generator.Run();
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->phases.size(), 1u);
  EXPECT_EQ(report->phases[0].requests, 150);
  EXPECT_EQ(report->phases[0].latency.count(), 150);
  EXPECT_THAT(progress.str(), HasSubstr("[concurrency=3]"));
  EXPECT_THAT(progress.str(), HasSubstr("warmup"));
  std::ostringstream table;
  PrintLoadReport(*report, table);
  EXPECT_THAT(table.str(), HasSubstr("concurrency=3"));
}

constexpr char kSequenceMix[] = R"([
  {"name": "generate", "model": "decoder",
   "inputs": {"ids": {"shape": [1, 6], "datatype": "INT64", "fill": "zeros"},
              "mask": {"shape": [1, 6], "datatype": "INT64", "fill": "ones"}},
   "sequence": {"requests": 3,
                "next_inputs": {"ids": {"shape": [1, 1], "datatype": "INT64", "fill": "zeros"}},
                "grow": {"mask": 2}}}
])";

std::vector<int64_t> ShapeOf(const inference::ModelInferRequest& request, const std::string& name) {
  for (const auto& input : request.inputs()) {
    if (input.name() == name) return {input.shape().begin(), input.shape().end()};
  }
  return {};
}

TEST(RequestMixTest, ASequenceTemplateBuildsItsRequestsInOrder) {
  auto mix = ParseRequestMix(kSequenceMix, 1);
  ASSERT_TRUE(mix.ok()) << mix.status();
  const std::vector<std::shared_ptr<const inference::ModelInferRequest>>& sequence =
      (*mix)[0].sequence;
  ASSERT_EQ(sequence.size(), 3u);
  EXPECT_EQ((*mix)[0].request, sequence[0]);
  // The first is the template's; then next_inputs, and the mask grown by 2 each.
  EXPECT_THAT(ShapeOf(*sequence[0], "ids"), ElementsAre(1, 6));
  EXPECT_THAT(ShapeOf(*sequence[1], "ids"), ElementsAre(1, 1));
  EXPECT_THAT(ShapeOf(*sequence[2], "ids"), ElementsAre(1, 1));
  EXPECT_THAT(ShapeOf(*sequence[0], "mask"), ElementsAre(1, 6));
  EXPECT_THAT(ShapeOf(*sequence[1], "mask"), ElementsAre(1, 8));
  EXPECT_THAT(ShapeOf(*sequence[2], "mask"), ElementsAre(1, 10));
  // Started by the first, ended by the last; the sender names the sequence.
  for (size_t k = 0; k < sequence.size(); ++k) {
    const auto& parameters = sequence[k]->parameters();
    EXPECT_EQ(parameters.count("sequence_start"), k == 0 ? 1u : 0u) << k;
    EXPECT_EQ(parameters.count("sequence_end"), k == 2 ? 1u : 0u) << k;
    EXPECT_EQ(parameters.count("sequence_id"), 0u) << k;
  }
  EXPECT_TRUE(ParseRequestMix(kMix, 1)->front().sequence.empty());
}

TEST(RequestMixTest, RefusesSequencesItCannotBuild) {
  const std::string head = R"([{"name": "g", "model": "decoder",
      "inputs": {"mask": {"shape": [1, 6], "datatype": "INT64", "fill": "ones"},
                 "ids": {"shape": [1, 6], "datatype": "INT64", "data": [1, 2, 3, 4, 5, 6]}},
      "sequence": )";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"requests": 1})", "\"requests\" must be an integer from 2 to 1024"},
      {R"({"requests": 1025})", "\"requests\" must be an integer from 2 to 1024"},
      {R"({"requests": 2, "grow": {"mask": 0}})", "must grow by an integer from 1 to 4096"},
      {R"({"requests": 2, "grow": {"absent": 1}})",
       "input 'absent' must be an input with a \"shape\" and a \"fill\""},
      // Values given one by one cannot grow.
      {R"({"requests": 2, "grow": {"ids": 1}})", "input 'ids' must be an input with"},
      {R"({"requests": 2, "steps": 3})", "unknown field \"steps\""},
      // Every request is built ahead: their bytes are bounded.
      {R"({"requests": 1024, "grow": {"mask": 4096}})",
       "more than the 268435456 its requests may take built ahead"},
  };
  for (const auto& [sequence, message] : cases) {
    auto mix = ParseRequestMix(head + sequence + "}]", 1);
    EXPECT_EQ(mix.status().code(), absl::StatusCode::kInvalidArgument) << sequence;
    EXPECT_THAT(mix.status().message(), HasSubstr(message)) << sequence;
  }
}

TEST_F(LoadGeneratorTest, SequencesRunInTheClosedLoopOnly) {
  auto mix = ParseRequestMix(kSequenceMix, 1);
  ASSERT_TRUE(mix.ok()) << mix.status();
  auto client = Client();
  LoadOptions options;
  options.rate = 100;
  options.requests = 10;
  absl::StatusOr<LoadReport> report = LoadGenerator(*client, *std::move(mix), options).Run();
  EXPECT_EQ(report.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(report.status().message(),
              HasSubstr("template 'generate' sends sequences, whose requests go one after the "
                        "answer to the other: run it in the closed loop"));
}

TEST_F(LoadGeneratorTest, RefusesRemoteTargetsAndBadArguments) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--address=192.0.2.1:8001", "--mix=" + mix_path_}, "pass --allow_remote"},
      {{"--address=dns:///example.com:8001", "--mix=" + mix_path_}, "not a loopback address"},
      {{"--address=" + testing::AddressOf(*server_)}, "give --mix or --misses"},
      {{"--address=" + testing::AddressOf(*server_), "--mix=a.json", "--misses=b.json"},
       "excludes"},
      {{"--address=" + testing::AddressOf(*server_), "--misses=/nonexistent/misses.json"},
       "cannot read the misses file /nonexistent/misses.json"},
      {{"--address=" + testing::AddressOf(*server_),
        "--misses=" + testing::WriteTempFile("notmisses.json", R"([{"name": "a"}])")},
       "notmisses.json: not a misses file"},
      {{"--address=" + testing::AddressOf(*server_), "--mix=" + mix_path_, "--rate=10",
        "--concurrency=2"},
       "--concurrency excludes --rate"},
      {{"--address=" + testing::AddressOf(*server_), "--mix=" + mix_path_, "--concurrency=0"},
       "--concurrency: Value 0 not in range 1 to 10000"},
      {{"--address=" + testing::AddressOf(*server_), "--mix=" + mix_path_, "--duration=1",
        "--requests=5"},
       "--duration excludes --requests"},
      {{"--address=" + testing::AddressOf(*server_), "--mix=" + mix_path_, "--arrivals=sometimes"},
       "--arrivals: sometimes not in {poisson,constant}"},
      {{"--address=" + testing::AddressOf(*server_), "--mix=" + mix_path_, "--bogus"},
       "unknown flag --bogus"},
      {{"--address=" + testing::AddressOf(*server_), "--mix=" + mix_path_, "extra"},
       "unexpected argument 'extra'"},
      {{"--address=" + testing::AddressOf(*server_),
        "--mix=" + testing::WriteTempFile("bad.json", R"([{"name": "a", "model": "mlp",
          "inputs": {"x": {"shape": [2], "fill": "sometimes"}}}])")},
       "mix template 0 (\"a\"): input 'x': \"fill\" is"},
      {{"--address=" + testing::AddressOf(*server_),
        "--mix=" + testing::WriteTempFile("bad2.json", R"([{"name": "a"}])")},
       "\"model\" must be a non-empty string"},
  };
  for (const auto& [args, message] : cases) {
    EXPECT_EQ(Run(args), 2) << args[0];
    EXPECT_THAT(err_, HasSubstr(message)) << args[0];
  }
}

TEST(LoadToolTest, PrintsHelp) {
  std::ostringstream out, err;
  EXPECT_EQ(RunLoadTool({"--help"}, out, err), 0);
  EXPECT_THAT(out.str(), HasSubstr("usage: precompile_load (--mix=FILE | --misses=FILE)"));
  EXPECT_THAT(out.str(), HasSubstr("--concurrency INT"));
  EXPECT_THAT(out.str(), HasSubstr("closed loop: comma-separated concurrency levels"));
  // The load tool's own defaults: one attempt, 10 s.
  EXPECT_THAT(out.str(), ::testing::ContainsRegex("--max_attempts INT[^\n]*=1\\s"));
  EXPECT_THAT(out.str(), HasSubstr("--timeout FLOAT=10 "));
  EXPECT_THAT(out.str(), HasSubstr("mix file:"));
}

TEST(LoopbackTest, KnowsLoopbackTargets) {
  for (const char* target :
       {"127.0.0.1:8001", "127.1.2.3:80", "localhost:8001", "LOCALHOST:1", "[::1]:8001", "::1",
        "[::ffff:127.0.0.1]:80", "ipv4:127.0.0.1:80,127.0.0.2:81", "ipv6:[::1]:80",
        "dns:///localhost:8001", "dns:127.0.0.1:8001", "unix:/tmp/socket"}) {
    EXPECT_TRUE(IsLoopbackTarget(target)) << target;
  }
  for (const char* target :
       {"10.0.0.1:8001", "128.0.0.1:80", "example.com:8001", "localhost.example.com:1", "[::2]:80",
        "[::ffff:10.0.0.1]:80", "ipv4:127.0.0.1:80,10.0.0.1:80", "dns://8.8.8.8/localhost:80",
        "0.0.0.0:8001", "", "xds:///svc"}) {
    EXPECT_FALSE(IsLoopbackTarget(target)) << target;
  }
}

}  // namespace
}  // namespace precompile::client
