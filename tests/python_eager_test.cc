// The runtime's Python backend in process, for the sanitizer runs: a flagged
// frame's misses run its Python eager program (examples' blocks), whose
// callees run their variants, from many threads at once.
#include <ATen/TensorOperators.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "base/rate_limited_lines.h"
#include "runtime/inference_memory.h"
#include "runtime/library_errors.h"
#include "runtime/loaded_version.h"
#include "tests/testing/artifacts.h"
#include "tests/testing/reference.h"

namespace precompile {
namespace {

using ::testing::HasSubstr;

std::string RunfilesRoot() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return std::string(srcdir != nullptr ? srcdir : ".") + "/" +
         (workspace != nullptr ? workspace : "precompile_serve");
}

// Python allowed, the models' own code (examples.models, tests.gate.gated)
// from the runfiles.
LoadOptions WithPython() {
  LoadOptions options;
  options.allow_python_programs = true;
  options.python_path.push_back(RunfilesRoot());
  return options;
}

std::shared_ptr<LoadedVersion> LoadBlocks() {
  absl::StatusOr<std::shared_ptr<LoadedVersion>> model =
      LoadedVersion::Load(testing::ExampleArtifact("blocks"), WithPython());
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *model : nullptr;
}

void ExpectServed(LoadedVersion& model, const std::string& call, Outcome outcome) {
  const testing::ReferenceCall reference = testing::Reference("blocks", call);
  absl::StatusOr<CallResult> result = model.Call(reference.args);
  ASSERT_TRUE(result.ok()) << call << ": " << result.status();
  EXPECT_EQ(result->outcome, outcome) << call;
  ASSERT_EQ(result->outputs.size(), 1u);
  EXPECT_TRUE(at::allclose(testing::AsTensor(result->outputs[0]), reference.expected[0],
                              1e-5, 1e-6))
      << call;
}

TEST(PythonEager, MissesRunTheFramesPythonAndItsCalleesTheirVariants) {
  std::shared_ptr<LoadedVersion> model = LoadBlocks();
  ASSERT_NE(model, nullptr);
  ExpectServed(*model, "steps0", Outcome::kVariant);
  ExpectServed(*model, "steps1", Outcome::kEagerFallback);
  ExpectServed(*model, "steps2", Outcome::kEagerFallback);
}

TEST(PythonEager, AnExceptionIsAnInternalErrorAndTheModelKeepsServing) {
  std::shared_ptr<LoadedVersion> model = LoadBlocks();
  ASSERT_NE(model, nullptr);
  testing::ReferenceCall call = testing::Reference("blocks", "steps1");
  for (NamedValue& arg : call.args) {
    if (arg.name == "steps") arg.value = int64_t{-1};
  }
  absl::StatusOr<CallResult> result = model->Call(call.args);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(result.status().message(),
              HasSubstr("frame 'forward': its Python eager program failed: ValueError: steps "
                        "must be at least 0, not -1"));
  ExpectServed(*model, "steps1", Outcome::kEagerFallback);
}

TEST(PythonEager, AProgramPastTheMemoryLimitIsRefusedAndTheModelKeepsServing) {
  std::shared_ptr<LoadedVersion> model = LoadBlocks();
  ASSERT_NE(model, nullptr);
  ExpectServed(*model, "steps1", Outcome::kEagerFallback);  // The variants' first runs.
  // Less than the 128 bytes of one [8, 4] tensor of the program's.
  SetInferenceMemoryLimit(64);
  absl::StatusOr<CallResult> refused = model->Call(testing::Reference("blocks", "steps1").args);
  SetInferenceMemoryLimit(0);
  ASSERT_FALSE(refused.ok());
  // One tensor past the whole limit: no retry would fit it.
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(refused.status().message(),
              HasSubstr("model 'blocks': this call asked for a tensor of 128 bytes, more than "
                        "the 64 bytes"));
  EXPECT_THAT(refused.status().message(), HasSubstr("--max_inference_memory_bytes"));
  EXPECT_EQ(InferenceMemoryHeld(), 0u) << "the refused call's tensors are freed";
  ExpectServed(*model, "steps1", Outcome::kEagerFallback);
}

TEST(PythonEager, HitsAndPythonMissesFromManyThreads) {
  std::shared_ptr<LoadedVersion> model = LoadBlocks();
  ASSERT_NE(model, nullptr);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        const bool miss = (t + i) % 2 == 1;
        ExpectServed(*model, miss ? "steps1" : "steps0",
                     miss ? Outcome::kEagerFallback : Outcome::kVariant);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
}

// tests/gate's model, whose compiled code calls precompile_test::gate, an
// operator defined in Python (tests/gate/gated.py) that nothing here
// registers in C++ (no --op_library). The tests run in this order: once
// imported, the operator stays registered in the process.
std::string GatedArtifact() {
  const std::string directory = testing::NewTempDirectory("gated");
  testing::CopyTree(RunfilesRoot() + "/tests/gate/gated", directory);
  return directory;
}

// An artifact captured before manifests named the operators: AOTInductor's
// own refusal, with what to do about it.
TEST(PythonOperators, AnArtifactThatDoesNotNameThemSaysHowToServeThem) {
  const std::string directory = GatedArtifact();
  testing::EditManifest(directory, [](artifact::v1::Manifest& m) { m.clear_operators(); });
  absl::StatusOr<std::shared_ptr<LoadedVersion>> model =
      LoadedVersion::Load(directory, WithPython());
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(model.status().message(),
              HasSubstr("Could not find schema for precompile_test::gate"));
  EXPECT_THAT(model.status().message(),
              HasSubstr("load it with --op_library; or, where it is defined in Python, capture "
                        "the model again"));
}

TEST(PythonOperators, AreRefusedByNameUnlessPythonIsAllowed) {
  absl::StatusOr<std::shared_ptr<LoadedVersion>> model =
      LoadedVersion::Load(GatedArtifact(), LoadOptions{});
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(model.status().message(),
              HasSubstr("model 'gated': its compiled code calls the operator "
                        "precompile_test::gate, defined in Python by tests.gate.gated"));
  EXPECT_THAT(model.status().message(), HasSubstr("--allow_python_programs"));
}

TEST(PythonOperators, RunTheirPythonWhereAllowedFromManyThreads) {
  absl::StatusOr<std::shared_ptr<LoadedVersion>> model =
      LoadedVersion::Load(GatedArtifact(), WithPython());
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&model, t] {
      for (int i = 0; i < 10; ++i) {
        const at::Tensor x = at::full({4}, static_cast<float>(t * 10 + i));
        absl::StatusOr<CallResult> result =
            (*model)->Call({NamedValue{"x", testing::AsTensorArg(x)}});
        ASSERT_TRUE(result.ok()) << result.status();
        ASSERT_EQ(result->outputs.size(), 1u);
        // gate(x * 2) + 1, the Python gate a copy.
        EXPECT_TRUE(at::equal(testing::AsTensor(result->outputs[0]), x * 2 + 1));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
}

// AOTInductor logs the exception of a call it makes through the dispatcher
// and returns only an error code; the server's std::cerr passes its lines
// to NoteLibraryLine, as here, and the run names the exception.
TEST(PythonOperators, AnOperatorThatRaisesIsNamedInTheRefusal) {
  absl::StatusOr<std::shared_ptr<LoadedVersion>> model =
      LoadedVersion::Load(GatedArtifact(), WithPython());
  ASSERT_TRUE(model.ok()) << model.status();
  RateLimitedLines::Options options;
  options.observe = NoteLibraryLine;
  RateLimitedLines lines(options, [](absl::string_view) {});
  std::streambuf* const cerr = std::cerr.rdbuf(&lines);
  absl::StatusOr<CallResult> result =
      (*model)->Call({NamedValue{"x", testing::AsTensorArg(at::full({4}, std::nanf("")))}});
  std::cerr.rdbuf(cerr);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(result.status().message(),
              HasSubstr("the compiled code raised an error: ValueError: precompile_test::gate "
                        "refuses NaN"));
  // And the model serves on.
  const at::Tensor x = at::full({4}, 2.0f);
  absl::StatusOr<CallResult> served = (*model)->Call({NamedValue{"x", testing::AsTensorArg(x)}});
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_TRUE(at::equal(testing::AsTensor(served->outputs[0]), x * 2 + 1));
}

}  // namespace
}  // namespace precompile
