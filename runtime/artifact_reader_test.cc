// Broken artifacts are refused with a reason that names the file and the
// problem. Each test damages a fresh copy of a real example artifact.
#include "runtime/artifact_reader.h"

#include <gmock/gmock.h>
#include <sys/stat.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "runtime/loaded_version.h"
#include "tests/testing/artifacts.h"

namespace precompile {
namespace {

namespace fs = std::filesystem;
using ::precompile::testing::CopyTree;
using ::precompile::testing::ExampleArtifact;
using ::precompile::testing::NewTempDirectory;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr char kTorchVersion[] = "2.11.0";

ArtifactReaderOptions Options() {
  ArtifactReaderOptions options;
  options.torch_version = kTorchVersion;
  return options;
}

std::string FreshCopy(const std::string& example) {
  const std::string dir = NewTempDirectory("broken-" + example);
  CopyTree(ExampleArtifact(example), dir);
  return dir;
}

artifact::v1::Manifest ReadManifest(const std::string& dir) {
  artifact::v1::Manifest m;
  std::ifstream in(dir + "/MANIFEST.pb", std::ios::binary);
  EXPECT_TRUE(m.ParseFromIstream(&in));
  return m;
}

void WriteManifest(const std::string& dir, const artifact::v1::Manifest& m) {
  std::ofstream out(dir + "/MANIFEST.pb", std::ios::binary | std::ios::trunc);
  ASSERT_TRUE(m.SerializeToOstream(&out));
}

// Applies `edit` to the manifest of a fresh copy of `example`.
std::string WithManifest(const std::string& example,
                         const std::function<void(artifact::v1::Manifest&)>& edit) {
  const std::string dir = FreshCopy(example);
  artifact::v1::Manifest m = ReadManifest(dir);
  edit(m);
  WriteManifest(dir, m);
  return dir;
}

void ExpectRefused(const std::string& dir, absl::StatusCode code,
                   const std::string& message) {
  absl::StatusOr<Artifact> artifact = ReadArtifact(dir, Options());
  ASSERT_FALSE(artifact.ok()) << "accepted: " << dir;
  EXPECT_EQ(artifact.status().code(), code) << artifact.status();
  EXPECT_THAT(artifact.status().message(), HasSubstr(message));
}

TEST(ArtifactReader, AcceptsEveryExampleArtifact) {
  for (const char* example : {"mlp", "loop", "branch", "nested", "passthrough"}) {
    absl::StatusOr<Artifact> artifact = ReadArtifact(ExampleArtifact(example), Options());
    ASSERT_TRUE(artifact.ok()) << example << ": " << artifact.status();
    EXPECT_EQ(artifact->manifest.model_name(), example);
    EXPECT_THAT(artifact->frames_text, HasSubstr("forward"));
  }
}

TEST(ArtifactReader, RefusesAMissingDirectoryOrManifest) {
  ExpectRefused("/nonexistent/artifact", absl::StatusCode::kNotFound, "does not exist");
  const std::string dir = FreshCopy("mlp");
  fs::remove(dir + "/MANIFEST.pb");
  ExpectRefused(dir, absl::StatusCode::kNotFound, "MANIFEST.pb is missing");
}

TEST(ArtifactReader, RefusesATruncatedManifest) {
  const std::string dir = FreshCopy("mlp");
  // Without its last byte: whichever field ends the file, it now ends early
  // (a cut elsewhere may fall between fields and leave a shorter valid one).
  fs::resize_file(dir + "/MANIFEST.pb", fs::file_size(dir + "/MANIFEST.pb") - 1);
  ExpectRefused(dir, absl::StatusCode::kDataLoss, "MANIFEST.pb is not a valid manifest");
}

TEST(ArtifactReader, RefusesAFileThatFailsItsChecksum) {
  const std::string dir = FreshCopy("loop");
  const std::string program = dir + "/" + ReadManifest(dir).frames(0).eager_program_path();
  {
    std::fstream f(program, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x7f');
  }
  ExpectRefused(dir, absl::StatusCode::kDataLoss, "fails its checksum");
}

TEST(ArtifactReader, RefusesATruncatedFile) {
  const std::string dir = FreshCopy("mlp");
  const std::string package = dir + "/" + ReadManifest(dir).frames(0).variants(0).package_path();
  fs::resize_file(package, 10);
  ExpectRefused(dir, absl::StatusCode::kDataLoss, "truncated or replaced");
}

TEST(ArtifactReader, RefusesAMissingFile) {
  const std::string dir = FreshCopy("mlp");
  fs::remove(dir + "/FRAMES");
  ExpectRefused(dir, absl::StatusCode::kDataLoss, "file 'FRAMES' is missing");
}

TEST(ArtifactReader, RefusesPathsThatEscapeTheArtifact) {
  ExpectRefused(WithManifest("mlp", [](auto& m) { m.mutable_files(0)->set_path("../x"); }),
                absl::StatusCode::kInvalidArgument, "not a plain path inside the artifact");
  ExpectRefused(WithManifest("mlp", [](auto& m) { m.mutable_files(0)->set_path("/etc/passwd"); }),
                absl::StatusCode::kInvalidArgument, "is an absolute path");
  // A symbolic link inside the artifact that leads out of it.
  const std::string dir = FreshCopy("mlp");
  fs::remove(dir + "/FRAMES");
  fs::create_symlink("/etc/hostname", dir + "/FRAMES");
  ExpectRefused(dir, absl::StatusCode::kInvalidArgument, "leads outside the artifact");
}

TEST(ArtifactReader, RefusesAPackageThatIsNotAmongTheChecksummedFiles) {
  ExpectRefused(WithManifest("mlp",
                             [](auto& m) {
                               m.mutable_frames(0)->mutable_variants(0)->set_package_path(
                                   "elsewhere.pt2");
                             }),
                absl::StatusCode::kInvalidArgument,
                "package of variant 'forward#0' 'elsewhere.pt2' is not among");
}

TEST(ArtifactReader, RefusesAnotherFormatOrTorchVersion) {
  ExpectRefused(WithManifest("mlp",
                             [](auto& m) {
                               m.set_format_version(
                                   static_cast<artifact::v1::FormatVersion>(7));
                             }),
                absl::StatusCode::kFailedPrecondition, "format version 7 is not supported");
  ExpectRefused(WithManifest("mlp", [](auto& m) { m.set_torch_version("2.9.1+cpu"); }),
                absl::StatusCode::kFailedPrecondition,
                "captured with torch 2.9.1+cpu but this runtime runs torch 2.11.0");
}

TEST(ArtifactReader, RefusesAnInstructionSetThisCpuLacks) {
  ArtifactReaderOptions options = Options();
  options.cpu_supports_isa = [](absl::string_view) { return false; };
  absl::StatusOr<Artifact> artifact = ReadArtifact(ExampleArtifact("mlp"), options);
  ASSERT_EQ(artifact.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(artifact.status().message(), HasSubstr("needs the CPU instruction set"));
  EXPECT_FALSE(CpuSupportsIsa("AMX_EVERYTHING"));
  EXPECT_TRUE(CpuSupportsIsa("DEFAULT"));
}

TEST(ArtifactReader, RefusesAFlaggedFrameWithoutAnEagerProgram) {
  ExpectRefused(
      WithManifest("loop", [](auto& m) { m.mutable_frames(0)->clear_eager_program_path(); }),
      absl::StatusCode::kInvalidArgument,
      "frame 'forward' is flagged eager_fallback but has no eager program");
}

TEST(ArtifactReader, RefusesPythonEagerProgramsTheManifestDoesNotBackUp) {
  // loop's eager program is TorchScript; its file stands in for a Python one.
  auto python_instead = [](auto& m) {
    auto* frame = m.mutable_frames(0);
    frame->mutable_python_program()->set_path(frame->eager_program_path());
    frame->clear_eager_program_path();
    m.mutable_python()->set_python_version("3.11.7");
  };
  ExpectRefused(WithManifest("loop",
                             [&](auto& m) {
                               python_instead(m);
                               m.mutable_frames(0)->set_eager_program_path(
                                   m.frames(0).python_program().path());
                             }),
                absl::StatusCode::kInvalidArgument,
                "frame 'forward' has both a TorchScript and a Python eager program");
  ExpectRefused(WithManifest("loop",
                             [&](auto& m) {
                               python_instead(m);
                               m.mutable_frames(0)->mutable_python_program()->set_path("nope.pt");
                             }),
                absl::StatusCode::kInvalidArgument,
                "the Python eager program of frame 'forward' 'nope.pt' is not among the "
                "artifact's checksummed files");
  ExpectRefused(WithManifest("loop",
                             [&](auto& m) {
                               python_instead(m);
                               m.clear_python();
                             }),
                absl::StatusCode::kInvalidArgument,
                "frame 'forward' has a Python eager program but the manifest names no Python "
                "version");
}

TEST(ArtifactReader, RefusesAnEntryFrameWithNothingToDispatchTo) {
  ExpectRefused(WithManifest("loop",
                             [](auto& m) {
                               m.mutable_frames(0)->set_variantless_entry_fallback(true);
                             }),
                absl::StatusCode::kInvalidArgument, "fell back to eager on its first call");
  ExpectRefused(WithManifest("loop", [](auto& m) { m.set_entry_frame("missing"); }),
                absl::StatusCode::kInvalidArgument, "entry frame 'missing' is not among");
}

TEST(ArtifactReader, AModelThatFailsToLoadLeavesNothingBehind) {
  // A package whose bytes are garbage but whose checksum is recorded as such:
  // the checks pass and AOTInductor's loader refuses it.
  const std::string dir = FreshCopy("mlp");
  artifact::v1::Manifest m = ReadManifest(dir);
  const std::string package = m.frames(0).variants(1).package_path();
  {
    std::ofstream out(dir + "/" + package, std::ios::binary | std::ios::trunc);
    out << "not a zip file";
  }
  for (auto& file : *m.mutable_files()) {
    if (file.path() == package) {
      auto digest = Sha256File(dir + "/" + package);
      ASSERT_TRUE(digest.ok());
      file.set_sha256(digest->first);
      file.set_size_bytes(digest->second);
    }
  }
  WriteManifest(dir, m);
  absl::StatusOr<std::shared_ptr<LoadedVersion>> model = LoadedVersion::Load(dir, {});
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(model.status().message(),
              AllOf(HasSubstr("model 'mlp'"), HasSubstr("loading variant forward#1")));
  // The intact artifact still loads and serves.
  EXPECT_TRUE(LoadedVersion::Load(ExampleArtifact("mlp"), {}).ok());
}

// The bytes read through PathOf, as Sha256File sees them.
std::string Sha256Of(const std::string& path) {
  auto digest = Sha256File(path);
  EXPECT_TRUE(digest.ok()) << digest.status();
  return digest.ok() ? digest->first : "";
}

TEST(ArtifactReader, LoadsTheBytesItCheckedWhenAFileIsReplacedAfterTheCheck) {
  const std::string dir = FreshCopy("mlp");
  const artifact::v1::Manifest manifest = ReadManifest(dir);
  const auto& file = manifest.files(0);
  absl::StatusOr<Artifact> artifact = ReadArtifact(dir, Options());
  ASSERT_TRUE(artifact.ok()) << artifact.status();
  // A deployment renames a new file over the old one after the check.
  {
    std::ofstream replacement(dir + "/replacement", std::ios::binary);
    replacement << std::string(file.size_bytes(), 'x');
  }
  fs::rename(dir + "/replacement", dir + "/" + file.path());
  EXPECT_NE(Sha256Of(dir + "/" + file.path()), file.sha256());
  EXPECT_EQ(Sha256Of(artifact->PathOf(file.path())), file.sha256());
  EXPECT_TRUE(artifact->ReleaseFiles().ok());
  // Once released, the directory's file is what a path names.
  EXPECT_EQ(artifact->PathOf(file.path()), dir + "/" + file.path());
}

TEST(ArtifactReader, CatchesAFileWrittenInPlaceAfterItsCheck) {
  const std::string dir = FreshCopy("mlp");
  const std::string package = ReadManifest(dir).frames(0).variants(0).package_path();
  absl::StatusOr<Artifact> artifact = ReadArtifact(dir, Options());
  ASSERT_TRUE(artifact.ok()) << artifact.status();
  {
    std::fstream f(dir + "/" + package, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x7f');
  }
  const absl::Status released = artifact->ReleaseFiles();
  EXPECT_EQ(released.code(), absl::StatusCode::kDataLoss) << released;
  EXPECT_THAT(released.message(), AllOf(HasSubstr(package), HasSubstr("written while")));
}

TEST(ArtifactReader, RefusesAFileThatIsNotARegularFileWithoutWaitingOnIt) {
  const std::string dir = FreshCopy("mlp");
  const std::string frames = dir + "/FRAMES";
  fs::remove(frames);
  ASSERT_EQ(mkfifo(frames.c_str(), 0600), 0);
  ExpectRefused(dir, absl::StatusCode::kInvalidArgument, "'FRAMES' is not a regular file");
}

}  // namespace
}  // namespace precompile
