// Replays the fuzzers' committed inputs through the same checks the fuzz
// targets run: the seed corpus (tests/fuzz/corpus/<fuzzer>/) and the
// regressions (tests/fuzz/regressions/<fuzzer>/): every crash a fuzzer found,
// minimized, and inputs that once showed a bug found otherwise. Every fuzzer
// has some. A regression's name can say what the component must answer too:
// a guard call named *.holds or *.misses, a manifest named ok_* or refused_*.
// Built with the ordinary toolchain; `bazel test --config=asan` adds the
// memory checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/fuzz/fuzz_checks.h"

namespace precompile::fuzz {
namespace {

namespace fs = std::filesystem;

struct Target {
  const char* fuzzer;
  absl::Status (*check)(const uint8_t*, size_t);
};

void PrintTo(const Target& target, std::ostream* os) { *os << target.fuzzer; }

fs::path FuzzDirectory() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr) return "tests/fuzz";
  return fs::path(srcdir) / (workspace ? workspace : "precompile_serve") / "tests" / "fuzz";
}

// The regular files under `directory`, sorted; none if it does not exist.
std::vector<fs::path> FilesIn(const fs::path& directory) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(directory, ec)) {
    if (entry.is_regular_file()) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string Contents(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Runs the target's check on `file`; the error names the file.
absl::Status Replay(const Target& target, const fs::path& file) {
  const std::string bytes = Contents(file);
  absl::Status status = target.check(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(file.lexically_relative(FuzzDirectory()).string(),
                                                  ": ", status.message()));
}

class FuzzRegressionTest : public ::testing::TestWithParam<Target> {};

TEST_P(FuzzRegressionTest, SeedCorpusHoldsTheInvariants) {
  const fs::path dir = FuzzDirectory() / "corpus" / GetParam().fuzzer;
  const std::vector<fs::path> files = FilesIn(dir);
  ASSERT_FALSE(files.empty()) << "no seeds in " << dir;
  for (const fs::path& file : files) {
    const absl::Status status = Replay(GetParam(), file);
    EXPECT_TRUE(status.ok()) << status;
  }
}

TEST_P(FuzzRegressionTest, RegressionsHoldTheInvariants) {
  const fs::path dir = FuzzDirectory() / "regressions" / GetParam().fuzzer;
  const std::vector<fs::path> files = FilesIn(dir);
  ASSERT_FALSE(files.empty()) << "no regressions in " << dir;
  for (const fs::path& file : files) {
    const absl::Status status = Replay(GetParam(), file);
    EXPECT_TRUE(status.ok()) << status;
  }
}

TEST(GuardRegressions, TheRuntimeAnswersWhatTheirNamesSay) {
  int checked = 0;
  for (const fs::path& file : FilesIn(FuzzDirectory() / "regressions" / "guard_fuzzer")) {
    const std::string extension = file.extension().string();
    if (extension != ".holds" && extension != ".misses") continue;
    ++checked;
    const std::string bytes = Contents(file);
    absl::StatusOr<std::vector<int>> answers =
        EvaluateGuards(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    ASSERT_TRUE(answers.ok()) << file << ": " << answers.status();
    ASSERT_FALSE(answers->empty()) << file;
    for (int answer : *answers) EXPECT_EQ(answer, extension == ".holds" ? 1 : 0) << file;
  }
  EXPECT_GT(checked, 0);
}

INSTANTIATE_TEST_SUITE_P(Fuzzers, FuzzRegressionTest,
                         ::testing::Values(Target{"request_decoding_fuzzer", CheckRequestDecoding},
                                           Target{"guard_fuzzer", CheckGuards},
                                           Target{"manifest_fuzzer", CheckManifest},
                                           Target{"http_request_fuzzer", CheckHttpRequest},
                                           Target{"http2_ledger_fuzzer", CheckHttp2Ledger}),
                         [](const ::testing::TestParamInfo<Target>& info) {
                           return std::string(info.param.fuzzer);
                         });

// The manifest seeds named ok_* are accepted and those named refused_* are
// refused, so that the fuzzer starts from manifests that get through every
// check of the reader and from one that fails each (this fails when the
// fixture in fuzz_checks.cc and make_seeds.py drift apart).
TEST(ManifestSeeds, OkSeedsAreAcceptedAndRefusedSeedsRefused) {
  int ok = 0;
  int refused = 0;
  std::vector<fs::path> files = FilesIn(FuzzDirectory() / "corpus" / "manifest_fuzzer");
  for (const fs::path& file : FilesIn(FuzzDirectory() / "regressions" / "manifest_fuzzer")) {
    files.push_back(file);
  }
  for (const fs::path& file : files) {
    const std::string name = file.filename().string();
    const std::string bytes = Contents(file);
    absl::StatusOr<Artifact> artifact =
        ReadFuzzArtifact(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    if (absl::StartsWith(name, "ok_")) {
      ++ok;
      EXPECT_TRUE(artifact.ok()) << name << ": " << artifact.status();
    } else if (absl::StartsWith(name, "refused_")) {
      ++refused;
      EXPECT_FALSE(artifact.ok()) << name << " was accepted";
    }
  }
  EXPECT_GT(ok, 0);
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace precompile::fuzz
