// Reads and validates a precompile artifact directory, without loading any
// compiled code.
//
// An artifact is accepted only if its manifest parses, its format version is
// one this runtime reads, it was captured with the same torch release as the
// runtime's libtorch, this CPU supports the instruction set its code was
// compiled for, every file it lists lies inside the directory (no absolute
// path, no "..", no symbolic link leading out) with the recorded size and
// SHA-256, every path a frame or variant names is one of those files, and its
// frames are consistent (an entry frame that exists, unique names, an eager
// program for every flagged frame, no entry frame without anything to
// dispatch to).
//
// Thread safety: ReadArtifact is a free function with no shared state.
#ifndef PRECOMPILE_RUNTIME_ARTIFACT_READER_H_
#define PRECOMPILE_RUNTIME_ARTIFACT_READER_H_

#include <functional>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "proto/artifact.pb.h"

namespace precompile {

struct ArtifactReaderOptions {
  // The runtime's torch release, e.g. "2.11.0". A manifest's torch version
  // must have the same release (a local suffix such as "+cu130" may differ).
  std::string torch_version;
  // Whether this machine runs code compiled for an instruction set named as
  // torch.backends.cpu.get_cpu_capability() names it. Default: CpuSupportsIsa.
  std::function<bool(absl::string_view)> cpu_supports_isa;
};

struct Artifact {
  // The artifact's directory, made absolute and free of symbolic links.
  std::string directory;
  artifact::v1::Manifest manifest;
  // The readable FRAMES list.
  std::string frames_text;

  // The absolute path of a file the manifest lists (already validated).
  std::string PathOf(const std::string& relative) const {
    return directory + "/" + relative;
  }
};

// Errors (the message names the artifact's file and the problem):
//   NOT_FOUND            the directory or MANIFEST.pb does not exist
//   DATA_LOSS            a file is missing, truncated, or its SHA-256 differs;
//                        MANIFEST.pb does not parse
//   INVALID_ARGUMENT     a path escapes the artifact, or frames are inconsistent
//   FAILED_PRECONDITION  another format version, torch release or CPU ISA
absl::StatusOr<Artifact> ReadArtifact(const std::string& directory,
                                      const ArtifactReaderOptions& options);

// Whether this CPU supports `isa` ("DEFAULT", "AVX2", "AVX512", ...).
bool CpuSupportsIsa(absl::string_view isa);

// Lowercase hex SHA-256 of a file's contents, with its size.
absl::StatusOr<std::pair<std::string, uint64_t>> Sha256File(
    const std::string& path);

}  // namespace precompile

#endif  // PRECOMPILE_RUNTIME_ARTIFACT_READER_H_
