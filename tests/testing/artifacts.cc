#include "tests/testing/artifacts.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include <mutex>

#include "proto/artifact.pb.h"

namespace precompile::testing {
namespace {
namespace fs = std::filesystem;
}  // namespace

void EditManifest(const std::string& directory,
                  const std::function<void(artifact::v1::Manifest&)>& edit) {
  const fs::path path = fs::path(directory) / "MANIFEST.pb";
  artifact::v1::Manifest manifest;
  {
    std::ifstream in(path, std::ios::binary);
    ASSERT_TRUE(manifest.ParseFromIstream(&in)) << path;
  }
  edit(manifest);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  ASSERT_TRUE(manifest.SerializeToOstream(&out)) << path;
}

void MarkIncomplete(const std::string& directory, const std::string& uncovered_frame) {
  EditManifest(directory, [&](artifact::v1::Manifest& manifest) {
    manifest.mutable_summary()->add_uncovered_frames(uncovered_frame);
    manifest.mutable_summary()->set_truncated(true);
    manifest.mutable_summary()->set_complete(false);
  });
}

std::string ExampleArtifact(const std::string& name) {
  static std::mutex mu;
  static auto* copies = new std::map<std::string, std::string>;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = copies->find(name); it != copies->end()) return it->second;
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  EXPECT_NE(srcdir, nullptr) << "run this test with bazel test";
  fs::path path = fs::path(srcdir ? srcdir : ".") /
                  (workspace ? workspace : "precompile_serve") / "examples" / name;
  EXPECT_TRUE(fs::exists(path / "MANIFEST.pb")) << path;
  const std::string copy = NewTempDirectory("example-" + name);
  CopyTree(path.string(), copy);
  (*copies)[name] = copy;
  return copy;
}

std::string NewTempDirectory(const std::string& prefix) {
  static std::atomic<int> counter{0};
  const char* tmp = std::getenv("TEST_TMPDIR");
  fs::path dir = fs::path(tmp ? tmp : "/tmp") /
                 (prefix + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

void CopyTree(const std::string& source, const std::string& destination) {
  fs::create_directories(destination);
  for (const auto& entry : fs::recursive_directory_iterator(
           source, fs::directory_options::follow_directory_symlink)) {
    const fs::path relative = entry.path().lexically_relative(source);
    const fs::path target = fs::path(destination) / relative;
    if (fs::is_directory(entry.path())) {
      fs::create_directories(target);
    } else {
      fs::create_directories(target.parent_path());
      fs::copy_file(fs::canonical(entry.path()), target,
                    fs::copy_options::overwrite_existing);
    }
  }
}

std::string ExampleRepository(const std::initializer_list<std::string>& names) {
  const std::string root = NewTempDirectory("repository");
  for (const std::string& name : names) {
    CopyTree(ExampleArtifact(name), root + "/" + name + "/1");
  }
  return root;
}

}  // namespace precompile::testing
