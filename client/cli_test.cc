// precompile_client (RunCli, in-process) against the real server on
// loopback: inference output in text and JSON checked against the reference
// outputs, .npy inputs and outputs, the admin commands, and exit statuses.
#include "client/cli.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/json_text.h"
#include "client/npy.h"
#include "tests/testing/artifacts.h"
#include "tests/testing/test_server.h"

namespace precompile::client {
namespace {

using testing::CompareFloats;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::ReferenceInputs;
using testing::ReferenceOutput;

struct Result {
  int code;
  std::string out;
  std::string err;
};

std::vector<float> JsonFloats(const Json& array) {
  std::vector<float> values;
  for (const Json& v : array) values.push_back(v.get<float>());
  return values;
}

std::vector<std::string> Keys(const Json& object) {
  std::vector<std::string> keys;
  for (const auto& [key, value] : object.items()) keys.push_back(key);
  return keys;
}

// The values on the line after "<output>: ..." in text output.
std::vector<float> PrintedValues(const std::string& out, const std::string& output) {
  std::vector<std::string> lines = absl::StrSplit(out, '\n');
  for (size_t i = 0; i + 1 < lines.size(); ++i) {
    if (!absl::StartsWith(lines[i], output + ":")) continue;
    absl::string_view values = absl::StripAsciiWhitespace(lines[i + 1]);
    values = absl::StripPrefix(absl::StripSuffix(values, "]"), "[");
    std::vector<float> parsed;
    for (absl::string_view v : absl::StrSplit(values, ", ")) {
      float f;
      EXPECT_TRUE(absl::SimpleAtof(v, &f)) << v;
      parsed.push_back(f);
    }
    return parsed;
  }
  ADD_FAILURE() << "no " << output << " in:\n" << out;
  return {};
}

class CliTest : public testing::ExampleServerTest {
 protected:
  void SetUp() override { ASSERT_NE(server_, nullptr); }

  Result Run(std::vector<std::string> args) {
    args.push_back("--address=" + testing::AddressOf(*server_));
    std::ostringstream out, err;
    const int code = RunCli(args, out, err);
    return {code, out.str(), err.str()};
  }

  // The first input of a reference call, saved as a .npy file.
  std::string ReferenceNpy(const std::string& model, const std::string& call) {
    Tensor x = ReferenceInputs(model, call)[0];
    const std::string path =
        absl::StrCat(precompile::testing::NewTempDirectory("npy"), "/", model, "-", call, ".npy");
    EXPECT_TRUE(WriteNpy(path, x).ok());
    return path;
  }
};

TEST_F(CliTest, InferPrintsTheReferenceOutputs) {
  Result r = Run({"infer", "mlp", "--input", "x=" + ReferenceNpy("mlp", "batch8"), "--max_values",
                  "0", "--id", "req-1"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("model:    mlp (version 1)\n"));
  EXPECT_THAT(r.out, HasSubstr("id:       req-1\n"));
  EXPECT_THAT(r.out, HasSubstr("outcome:  variant (forward#0)\n"));
  EXPECT_THAT(r.out, HasSubstr("output0: FP32 [8, 3]\n"));
  EXPECT_EQ(CompareFloats(PrintedValues(r.out, "output0"), ReferenceOutput("mlp", "batch8")), "");
}

TEST_F(CliTest, InferTruncatesLongOutputs) {
  Result r = Run({"infer", "mlp", "--input", "x=" + ReferenceNpy("mlp", "batch16")});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr(", ...]  (48 values, first 16 shown)"));
}

TEST_F(CliTest, InferPrintsJsonWithStableKeys) {
  Result r = Run({"infer", "mlp", "--input", "x=" + ReferenceNpy("mlp", "batch16"), "--json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  absl::StatusOr<Json> json = ParseJson(r.out);
  ASSERT_TRUE(json.ok()) << json.status() << "\n" << r.out;
  EXPECT_THAT(Keys(*json),
              ElementsAre("model_name", "model_version", "id", "outcome", "variant", "outputs"));
  EXPECT_EQ(json->at("outcome").get<std::string>(), "variant");
  EXPECT_EQ(json->at("variant").get<std::string>(), "forward#1");
  const Json& output = json->at("outputs").at(0);
  EXPECT_THAT(Keys(output), ElementsAre("name", "datatype", "shape", "data", "file"));
  EXPECT_EQ(output.at("name").get<std::string>(), "output0");
  EXPECT_EQ(output.at("datatype").get<std::string>(), "FP32");
  EXPECT_EQ(DumpJson(output.at("shape"), false), "[16,3]");
  EXPECT_TRUE(output.at("file").is_null());
  EXPECT_EQ(CompareFloats(JsonFloats(output.at("data")), ReferenceOutput("mlp", "batch16")), "");
}

TEST_F(CliTest, InferTakesInlineTensorsAndScalarParameters) {
  const Tensor x = ReferenceInputs("loop", "n1")[0];
  std::vector<std::string> values;
  for (float v : testing::FloatsOf(x)) values.push_back(absl::StrFormat("%.9g", v));
  const std::string spec = absl::StrCat(R"({"shape": [8, 4], "datatype": "FP32", "data": [)",
                                        absl::StrJoin(values, ", "), "]}");
  Result r = Run({"infer", "loop", "--input", "x=" + spec, "--param", "n=1", "--json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  absl::StatusOr<Json> json = ParseJson(r.out);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(json->at("outcome").get<std::string>(), "eager_fallback");
  EXPECT_EQ(json->at("variant").get<std::string>(), "");
  EXPECT_EQ(
      CompareFloats(JsonFloats(json->at("outputs")[0].at("data")), ReferenceOutput("loop", "n1")),
      "");

  // A float where the model takes an int: the server's message comes through.
  r = Run({"infer", "loop", "--input", "x=" + spec, "--param", "n=1.5"});
  EXPECT_EQ(r.code, kExitFailed);
  EXPECT_THAT(r.err, HasSubstr("error: INVALID_ARGUMENT: "));
  EXPECT_THAT(r.err, HasSubstr("'n'"));
}

TEST(Cli, AnInlineInputWithoutADatatypeTakesTheModelsOwn) {
  // dtypes takes one input of each datatype: FP16 to BOOL.
  std::unique_ptr<server::Server> server =
      testing::StartExampleServer([](server::ServerOptions& o) {
        o.model_repository = precompile::testing::ExampleRepository({"dtypes"});
      });
  ASSERT_NE(server, nullptr);
  std::vector<std::string> args = {"infer", "dtypes", "--json",
                                   "--address=" + testing::AddressOf(*server)};
  for (const char* name : {"f16", "bf16", "f32", "f64", "u8", "i8", "i16", "i32", "i64", "b"}) {
    args.insert(args.end(), {"--input", absl::StrCat(name, R"(={"shape": [2, 3], "fill": 1})")});
  }
  std::ostringstream out, err;
  ASSERT_EQ(RunCli(args, out, err), kExitOk) << err.str();
  absl::StatusOr<Json> json = ParseJson(out.str());
  ASSERT_TRUE(json.ok()) << out.str();
  std::vector<std::string> datatypes;
  std::vector<double> firsts;
  for (const Json& output : json->at("outputs")) {
    datatypes.push_back(output.at("datatype").get<std::string>());
    firsts.push_back(output.at("data")[0].is_boolean() ? output.at("data")[0].get<bool>()
                                                       : output.at("data")[0].get<double>());
  }
  EXPECT_THAT(datatypes, ElementsAre("FP16", "BF16", "FP32", "FP64", "UINT8", "INT8", "INT16",
                                     "INT32", "INT64", "BOOL"));
  // 1 * 2 + 1 for the floats, 1 + 3, 1 - 3, 1 * 3 for the integers, not 1.
  EXPECT_THAT(firsts, ElementsAre(3, 3, 3, 3, 4, -2, 3, 3, 3, 0));

  // A datatype given is the one sent: the server names the mismatch.
  std::ostringstream out2, err2;
  args[5] = R"(f16={"shape": [2, 3], "fill": 1, "datatype": "FP32"})";
  EXPECT_EQ(RunCli(args, out2, err2), kExitFailed);
  EXPECT_THAT(err2.str(), HasSubstr("f16.dtype: expected float16, got float32"));
}

TEST_F(CliTest, InferSavesOutputsAsNpy) {
  const std::string dir = precompile::testing::NewTempDirectory("outputs") + "/saved";
  Result r = Run({"infer", "mlp", "--input", "x=" + ReferenceNpy("mlp", "batch8"), "--output_dir",
                  dir, "--json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const std::string path = dir + "/output0.npy";
  absl::StatusOr<Json> json = ParseJson(r.out);
  ASSERT_TRUE(json.ok());
  EXPECT_EQ(json->at("outputs")[0].at("file").get<std::string>(), path);
  absl::StatusOr<Tensor> saved = ReadNpy(path);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->datatype, "FP32");
  EXPECT_THAT(saved->shape, ElementsAre(8, 3));
  EXPECT_EQ(CompareFloats(testing::FloatsOf(*saved), ReferenceOutput("mlp", "batch8")), "");
  // What was saved is exactly what was printed.
  EXPECT_EQ(testing::FloatsOf(*saved), JsonFloats(json->at("outputs")[0].at("data")));

  r = Run({"infer", "mlp", "--input", "x=" + ReferenceNpy("mlp", "batch8"), "--output_dir", dir});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("saved to " + path));
}

TEST_F(CliTest, AServerErrorExitsOneWithItsCodeAndMessage) {
  Result r = Run({"infer", "mlp", "--input", "x=" + ReferenceNpy("mlp", "batch1")});
  EXPECT_EQ(r.code, kExitFailed);
  EXPECT_THAT(r.err, HasSubstr("error: FAILED_PRECONDITION: no captured variant matches this "
                               "call of frame 'forward'"));
  EXPECT_EQ(r.out, "");

  r = Run({"infer", "mlp", "--input", "x=" + ReferenceNpy("mlp", "batch1"), "--json"});
  EXPECT_EQ(r.code, kExitFailed);
  absl::StatusOr<Json> json = ParseJson(r.out);
  ASSERT_TRUE(json.ok()) << r.out;
  EXPECT_EQ(json->at("error").at("code").get<std::string>(), "FAILED_PRECONDITION");
  EXPECT_THAT(json->at("error").at("message").get<std::string>(), HasSubstr("x.size(0)"));

  r = Run({"summary", "nope"});
  EXPECT_EQ(r.code, kExitFailed);
  EXPECT_THAT(r.err, HasSubstr("error: NOT_FOUND: "));
}

TEST_F(CliTest, UsageErrorsExitTwo) {
  const std::string npy = ReferenceNpy("mlp", "batch8");
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{}, "no command given"},
      {{"predict", "mlp"}, "unknown command 'predict'"},
      {{"infer"}, "infer: MODEL is required"},
      {{"summary", "mlp", "loop"}, "unexpected argument 'loop'"},
      {{"infer", "mlp", "--bogus"}, "unknown flag --bogus"},
      {{"infer", "mlp", "--input", "x"}, "expected NAME=FILE.npy or NAME={JSON}"},
      {{"infer", "mlp", "--input", "x={\"shape\": [2,"}, "invalid JSON at line 1"},
      {{"infer", "mlp", "--input", "x={\"shape\": [2], \"data\": [1]}"},
       "shape [2] needs 2 values, \"data\" has 1"},
      {{"infer", "mlp", "--input", "x=/no/such/file.npy"}, "cannot read /no/such/file.npy"},
      {{"infer", "mlp", "--input", "x=" + npy, "--input", "x=" + npy},
       "input 'x' is given more than once"},
      {{"infer", "mlp", "--param", "n"}, "expected NAME=VALUE"},
      {{"summary", "mlp", "--input", "x=" + npy}, "--input applies to infer only"},
      {{"summary", "mlp", "--model_version=1"},
       "--model_version applies to infer, metadata, config and misses only"},
      {{"--input", "x=" + npy, "infer", "mlp"}, "--input goes after the command infer"},
      {{"health", "--timeout=-1"}, "--timeout: expected a number > 0, got '-1'"},
      {{"health", "--timeout=soon"}, "--timeout: expected a number > 0, got 'soon'"},
      {{"health", "--max_attempts=6"}, "--max_attempts: Value 6 not in range 1 to 5"},
      {{"infer", "mlp", "--max_values=-1"}, "--max_values: expected a number >= 0, got '-1'"},
      {{"health", "--tls_cert=a.pem"}, "--tls_cert and --tls_key go together"},
      {{"models", "--admin_token_file=/no/such/token"}, "cannot read the token file"},
  };
  for (const auto& [args, message] : cases) {
    Result r = Run(args);
    EXPECT_EQ(r.code, kExitUsage) << absl::StrJoin(args, " ");
    EXPECT_THAT(r.err, HasSubstr(message)) << absl::StrJoin(args, " ");
  }
}

TEST_F(CliTest, PrintsHelp) {
  Result r = Run({"--help"});
  EXPECT_EQ(r.code, kExitOk);
  EXPECT_THAT(r.out, HasSubstr("Usage: precompile_client [OPTIONS] [SUBCOMMAND]"));
  EXPECT_THAT(r.out, HasSubstr("  coverage MODEL "));
  EXPECT_THAT(r.out, HasSubstr("  health [MODEL] "));
  EXPECT_THAT(r.out, HasSubstr("--admin_token_file TEXT     file holding the admin token"));
  EXPECT_EQ(Run({"help"}).out, r.out);

  // A command's help describes its own flags.
  r = Run({"infer", "--help"});
  EXPECT_EQ(r.code, kExitOk);
  EXPECT_THAT(r.out, HasSubstr("Usage: precompile_client infer [OPTIONS] MODEL"));
  EXPECT_THAT(r.out, HasSubstr("--input TEXT ..."));
  EXPECT_THAT(r.out, HasSubstr("a tensor argument, NAME=FILE.npy or NAME={JSON spec}"));
  EXPECT_THAT(r.out, HasSubstr("--max_values INT=16"));
}

TEST_F(CliTest, DescribesAModel) {
  Result r = Run({"metadata", "mlp"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("platform:  precompile_serve"));
  EXPECT_THAT(r.out, HasSubstr("  x  FP32  [-1, 4]"));

  r = Run({"metadata", "mlp", "--json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  absl::StatusOr<Json> json = ParseJson(r.out);
  ASSERT_TRUE(json.ok());
  EXPECT_THAT(Keys(*json), ElementsAre("name", "versions", "platform", "inputs", "outputs"));
  EXPECT_EQ(DumpJson(json->at("inputs")[0].at("shape"), false), "[-1,4]");

  r = Run({"config", "loop"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("  argument:n"));
  EXPECT_THAT(r.out, HasSubstr("instance group:  loop KIND_CPU x2"));
  r = Run({"config", "loop", "--json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  json = ParseJson(r.out);
  ASSERT_TRUE(json.ok());
  EXPECT_EQ(DumpJson(json->at("config").at("max_batch_size")), "0");
}

TEST_F(CliTest, ReportsSummaryFramesCoverageAndWarnings) {
  Result r = Run({"summary", "loop"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("entry frame:       forward\n"));
  EXPECT_THAT(r.out, HasSubstr("complete:          yes\n"));
  EXPECT_THAT(r.out, HasSubstr("eager fallbacks:   forward"));

  r = Run({"summary", "loop", "--json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  absl::StatusOr<Json> json = ParseJson(r.out);
  ASSERT_TRUE(json.ok());
  EXPECT_THAT(Keys(*json),
              ElementsAre("name", "version", "frames", "variants_per_frame", "eager_fallbacks",
                          "uncovered_frames", "truncated", "complete", "entry_frame",
                          "torch_version", "device", "cpu_isa"));
  EXPECT_EQ(DumpJson(json->at("version")), "1");
  EXPECT_EQ(DumpJson(json->at("variants_per_frame"), false), "{\"forward\":1}");

  r = Run({"frames", "loop"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("# eager fallback"));

  // An eager call, then its trace in coverage and warnings.
  const std::string x = ReferenceNpy("loop", "n3");
  ASSERT_EQ(Run({"infer", "loop", "--input", "x=" + x, "--param", "n=3"}).code, kExitOk);
  r = Run({"coverage", "loop", "--json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  json = ParseJson(r.out);
  ASSERT_TRUE(json.ok());
  const Json& frame = json->at("frames").at(0);
  EXPECT_EQ(frame.at("frame").get<std::string>(), "forward");
  EXPECT_TRUE(frame.at("eager_fallback").get<bool>());
  EXPECT_GE(frame.at("eager_fallback_calls").get<int64_t>(), 1);
  r = Run({"coverage", "loop"});
  EXPECT_THAT(r.out, HasSubstr("FRAME    FLAGGED  VARIANT  EAGER  REFUSED  ERROR  HITS"));

  r = Run({"warnings", "loop"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("  forward\n  model 'loop': frame 'forward' runs eagerly"));
  r = Run({"warnings", "mlp", "--json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(r.out, "{\n  \"warnings\": []\n}\n");
}

TEST_F(CliTest, ListsLoadsUnloadsAndRescans) {
  Result r = Run({"models"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("MODEL  VERSIONS  STATE  REASON\n"));
  EXPECT_THAT(r.out, HasSubstr("mlp    1         READY"));

  r = Run({"unload", "mlp"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(r.out, "mlp: UNAVAILABLE (version 1): unloaded on request\n");
  r = Run({"infer", "mlp", "--input", "x=" + ReferenceNpy("mlp", "batch8")});
  EXPECT_EQ(r.code, kExitFailed);
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND: model 'mlp' is unloaded"));
  r = Run({"health", "mlp"});
  EXPECT_EQ(r.code, kExitFailed);

  r = Run({"load", "mlp", "--json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  absl::StatusOr<Json> json = ParseJson(r.out);
  ASSERT_TRUE(json.ok());
  EXPECT_EQ(json->at("status").at("state").get<std::string>(), "READY");

  r = Run({"rescan", "--json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  json = ParseJson(r.out);
  ASSERT_TRUE(json.ok());
  EXPECT_EQ(json->at("models").size(), 2u);
}

TEST_F(CliTest, ChecksHealth) {
  Result r = Run({"health"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(r.out, "live:    yes\nready:   yes\nhealth:  SERVING\n");
  r = Run({"health", "loop", "--json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  absl::StatusOr<Json> json = ParseJson(r.out);
  ASSERT_TRUE(json.ok());
  EXPECT_THAT(Keys(*json), ElementsAre("live", "ready", "service", "status"));
  EXPECT_EQ(json->at("status").get<std::string>(), "SERVING");
  r = Run({"health", "nope"});
  EXPECT_EQ(r.code, kExitFailed);
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND"));
}

TEST(CliUnreachableTest, ReportsUnavailable) {
  // A loopback port bound but not listening: connections are refused.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  socklen_t size = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size);
  std::ostringstream out, err;
  const int code = RunCli({"health", absl::StrCat("--address=127.0.0.1:", ntohs(address.sin_port)),
                           "--max_attempts=2", "--timeout=5"},
                          out, err);
  close(fd);
  EXPECT_EQ(code, kExitFailed);
  EXPECT_THAT(err.str(), HasSubstr("error: UNAVAILABLE: "));
  EXPECT_THAT(err.str(), HasSubstr("(after up to 2 attempts)"));
}

}  // namespace
}  // namespace precompile::client
