// Where tests find the bundled example artifacts, and scratch copies of them.
#ifndef PRECOMPILE_TESTS_TESTING_ARTIFACTS_H_
#define PRECOMPILE_TESTS_TESTING_ARTIFACTS_H_

#include <functional>
#include <string>

#include "proto/artifact.pb.h"

namespace precompile::testing {

// A bundled example artifact ("mlp", "loop", "branch", "nested"), built by
// //examples and passed to the test as data, copied once per process into
// the test's temporary directory: the runfiles tree is made of symbolic links
// leading out of the artifact, which the loader rightly refuses.
std::string ExampleArtifact(const std::string& name);

// A fresh directory under the test's temporary directory.
std::string NewTempDirectory(const std::string& prefix);

// Copies `source` (a directory tree of regular files) to `destination`,
// following symbolic links so that the copy holds plain files.
void CopyTree(const std::string& source, const std::string& destination);

// Rewrites the MANIFEST.pb of the artifact in `directory` (a copy) so that
// its summary reports `uncovered_frame` uncovered and the capture truncated:
// an incomplete artifact, as require_complete=False saves one. (The summary
// is not checksummed: a manifest lists the other files' digests.)
void MarkIncomplete(const std::string& directory, const std::string& uncovered_frame);

// Rewrites the MANIFEST.pb of the artifact in `directory` (a copy) by `edit`.
void EditManifest(const std::string& directory,
                  const std::function<void(artifact::v1::Manifest&)>& edit);

// A model repository in a new temporary directory: each named example
// artifact copied to <repository>/<name>/1/. Returns the repository root.
std::string ExampleRepository(const std::initializer_list<std::string>& names);

}  // namespace precompile::testing

#endif  // PRECOMPILE_TESTS_TESTING_ARTIFACTS_H_
