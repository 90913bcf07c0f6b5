// Reads and validates a precompile artifact directory, without loading any
// compiled code.
//
// An artifact is accepted only if its manifest parses, its format version is
// one this runtime reads, it was captured with the same torch release as the
// runtime's libtorch, this CPU supports the instruction set its code was
// compiled for, every file it lists lies inside the directory (no absolute
// path, no "..", no symbolic link leading out) with the recorded size and
// SHA-256 (regular files only: a FIFO would block the reader), every path a
// frame or variant names is one of those files, and its
// frames are consistent (an entry frame that exists, unique names, an eager
// program for every flagged frame, no entry frame without anything to
// dispatch to).
//
// What is loaded is what was checked: each file is held open from its
// checksum until the loaders have read it, through that descriptor
// (Artifact::PathOf). A file replaced meanwhile (renamed over, as deployments
// do) is still read as it was checked; one written in place is caught by
// Artifact::ReleaseFiles. So a copy into the repository that is still under
// way is never loaded half-written.
//
// Thread safety: ReadArtifact is a free function with no shared state.
#ifndef PRECOMPILE_RUNTIME_ARTIFACT_READER_H_
#define PRECOMPILE_RUNTIME_ARTIFACT_READER_H_

#include <sys/stat.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
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

// The files of an artifact, open since their checksums were computed.
class CheckedFiles {
 public:
  CheckedFiles() = default;
  ~CheckedFiles();
  CheckedFiles(const CheckedFiles&) = delete;
  CheckedFiles& operator=(const CheckedFiles&) = delete;

  // Takes `fd`, open on `relative`, as it was when its checksum was
  // computed (`checked`).
  void Hold(std::string relative, int fd, const struct stat& checked);
  // A path that opens the checked file itself ("/proc/self/fd/N"), or "" for
  // a file not among them.
  std::string PathOf(const std::string& relative) const;
  // DATA_LOSS naming the first file written since its check.
  absl::Status CheckUnchanged() const;

 private:
  struct File {
    std::string relative;
    int fd;
    struct stat checked;
  };
  std::vector<File> files_;
};

struct Artifact {
  // The artifact's directory, made absolute and free of symbolic links.
  std::string directory;
  artifact::v1::Manifest manifest;
  // The readable FRAMES list.
  std::string frames_text;
  // Until ReleaseFiles.
  std::shared_ptr<CheckedFiles> files;

  // A path to read a file the manifest lists (already validated): the
  // checked file while it is held, else the file in the directory.
  std::string PathOf(const std::string& relative) const {
    if (files != nullptr) {
      if (std::string checked = files->PathOf(relative); !checked.empty()) return checked;
    }
    return directory + "/" + relative;
  }
  // Once everything is loaded: closes the files, DATA_LOSS if one was
  // written since its check (what was loaded may not be what was checked).
  absl::Status ReleaseFiles() {
    if (files == nullptr) return absl::OkStatus();
    absl::Status unchanged = files->CheckUnchanged();
    files.reset();
    return unchanged;
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
