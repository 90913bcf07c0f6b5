#include "runtime/artifact_reader.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <filesystem>
#include <fstream>
#include <memory>
#include <system_error>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"

namespace precompile {
namespace {

namespace fs = std::filesystem;
using artifact::v1::Frame;
using artifact::v1::Manifest;

constexpr char kManifestFile[] = "MANIFEST.pb";
constexpr char kFramesFile[] = "FRAMES";
constexpr uintmax_t kMaxManifestBytes = 64 << 20;

absl::string_view Release(absl::string_view version) {
  return version.substr(0, version.find('+'));
}

// Checks that `relative` names a regular file inside `root` (already
// canonical) and returns its canonical path.
absl::StatusOr<std::string> ConfinedPath(const fs::path& root,
                                         const std::string& relative) {
  if (relative.empty()) {
    return absl::InvalidArgumentError("the manifest lists an empty file path");
  }
  if (relative.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError("a file path in the manifest contains a NUL byte");
  }
  if (relative.front() == '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "file '", relative, "' is an absolute path; artifact paths are relative"));
  }
  for (absl::string_view part : absl::StrSplit(relative, '/')) {
    if (part == ".." || part == "." || part.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "file '", relative, "' is not a plain path inside the artifact"));
    }
  }
  std::error_code ec;
  fs::path resolved = fs::canonical(root / relative, ec);
  if (ec) {
    return absl::DataLossError(
        absl::StrCat("file '", relative, "' is missing: ", ec.message()));
  }
  const std::string prefix = root.string() + "/";
  if (!absl::StartsWith(resolved.string(), prefix)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "file '", relative, "' leads outside the artifact (to ",
        resolved.string(), ")"));
  }
  if (!fs::is_regular_file(resolved, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("file '", relative, "' is not a regular file"));
  }
  return resolved.string();
}

absl::Status ValidateFrames(const Manifest& m,
                            const absl::flat_hash_set<std::string>& listed) {
  auto require_listed = [&](const std::string& path,
                            const std::string& what) -> absl::Status {
    if (!listed.contains(path)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " '", path, "' is not among the artifact's checksummed files"));
    }
    return absl::OkStatus();
  };
  absl::flat_hash_set<std::string> names;
  const Frame* entry = nullptr;
  for (const Frame& frame : m.frames()) {
    if (frame.name().empty()) {
      return absl::InvalidArgumentError("a frame has no name");
    }
    if (!names.insert(frame.name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("frame '", frame.name(), "' appears twice"));
    }
    if (frame.name() == m.entry_frame()) entry = &frame;
    absl::flat_hash_set<std::string> params;
    for (const auto& p : frame.parameters()) {
      if (p.name().empty() || !params.insert(p.name()).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "frame '", frame.name(), "' has an empty or repeated parameter name '",
            p.name(), "'"));
      }
      if (p.has_index_range() && p.index_range().min() >= p.index_range().max()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "parameter '", p.name(), "' of frame '", frame.name(),
            "' has an empty index range"));
      }
    }
    const bool in_python = frame.has_python_program();
    if (frame.eager_fallback() && frame.eager_program_path().empty() && !in_python) {
      return absl::InvalidArgumentError(absl::StrCat(
          "frame '", frame.name(),
          "' is flagged eager_fallback but has no eager program"));
    }
    if (!frame.eager_program_path().empty() && in_python) {
      return absl::InvalidArgumentError(absl::StrCat(
          "frame '", frame.name(), "' has both a TorchScript and a Python eager program"));
    }
    if (!frame.eager_program_path().empty()) {
      RETURN_IF_ERROR(require_listed(
          frame.eager_program_path(),
          absl::StrCat("the eager program of frame '", frame.name(), "'")));
    }
    if (in_python) {
      RETURN_IF_ERROR(require_listed(
          frame.python_program().path(),
          absl::StrCat("the Python eager program of frame '", frame.name(), "'")));
      if (!m.has_python() || m.python().python_version().empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "frame '", frame.name(),
            "' has a Python eager program but the manifest names no Python version"));
      }
    }
    absl::flat_hash_set<std::string> outputs;
    int tensor_leaves = 0;
    for (const auto& leaf : frame.outputs().leaves()) {
      if (leaf.name().empty() || !outputs.insert(leaf.name()).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "frame '", frame.name(), "' has an empty or repeated output name '",
            leaf.name(), "'"));
      }
      tensor_leaves += leaf.is_tensor() ? 1 : 0;
    }
    if (tensor_leaves == 0 && (!frame.variants().empty() || frame.eager_fallback())) {
      return absl::InvalidArgumentError(
          absl::StrCat("frame '", frame.name(), "' returns no tensor"));
    }
    absl::flat_hash_set<std::string> ids;
    for (const auto& v : frame.variants()) {
      if (v.num_outputs() != static_cast<uint32_t>(frame.outputs().leaves_size())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "variant '", v.id(), "' returns ", v.num_outputs(), " values but frame '",
            frame.name(), "' has ", frame.outputs().leaves_size(), " output leaves"));
      }
      if (v.id().empty() || !ids.insert(v.id()).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "frame '", frame.name(), "' has an empty or repeated variant id '",
            v.id(), "'"));
      }
      RETURN_IF_ERROR(require_listed(
          v.package_path(), absl::StrCat("the package of variant '", v.id(), "'")));
      for (uint32_t input : v.tensor_inputs()) {
        if (input >= static_cast<uint32_t>(frame.parameters_size())) {
          return absl::InvalidArgumentError(absl::StrCat(
              "variant '", v.id(), "' takes parameter ", input, " but frame '",
              frame.name(), "' has ", frame.parameters_size()));
        }
      }
    }
  }
  if (entry == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the entry frame '", m.entry_frame(), "' is not among the frames"));
  }
  if (entry->variantless_entry_fallback()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the entry frame '", entry->name(),
        "' fell back to eager on its first call (", entry->fallback_detail(),
        ") and has no compiled variant to dispatch to"));
  }
  return absl::OkStatus();
}

}  // namespace

bool CpuSupportsIsa(absl::string_view isa) {
  __builtin_cpu_init();
  if (isa == "DEFAULT" || isa == "NO AVX" || isa.empty()) return true;
  if (isa == "AVX2") {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }
  if (isa == "AVX512") {
    return __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq");
  }
  return false;
}

namespace {

// Lowercase hex SHA-256 of what `fd` holds, read from its start, with its size.
absl::StatusOr<std::pair<std::string, uint64_t>> Sha256Descriptor(int fd) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(),
                                                              EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    return absl::InternalError("cannot initialise SHA-256");
  }
  std::vector<char> buffer(1 << 20);
  uint64_t size = 0;
  while (true) {
    const ssize_t n = pread(fd, buffer.data(), buffer.size(), static_cast<off_t>(size));
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::DataLossError(absl::StrCat("cannot read: ", std::strerror(errno)));
    }
    if (n == 0) break;
    EVP_DigestUpdate(ctx.get(), buffer.data(), static_cast<size_t>(n));
    size += static_cast<uint64_t>(n);
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &length);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * length);
  for (unsigned int i = 0; i < length; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 0xf]);
  }
  return std::make_pair(std::move(hex), size);
}

// Whether a file's contents may differ between two looks at it: every write
// sets its modification time. (Not its change time, which moves too when a
// deployment renames a new file over it: the open file is then unlinked, not
// written.)
bool Changed(const struct stat& before, const struct stat& after) {
  return before.st_ino != after.st_ino || before.st_size != after.st_size ||
         before.st_mtim.tv_sec != after.st_mtim.tv_sec ||
         before.st_mtim.tv_nsec != after.st_mtim.tv_nsec;
}

}  // namespace

CheckedFiles::~CheckedFiles() {
  for (const File& file : files_) close(file.fd);
}

void CheckedFiles::Hold(std::string relative, int fd, const struct stat& checked) {
  files_.push_back({std::move(relative), fd, checked});
}

std::string CheckedFiles::PathOf(const std::string& relative) const {
  for (const File& file : files_) {
    if (file.relative == relative) return absl::StrCat("/proc/self/fd/", file.fd);
  }
  return "";
}

absl::Status CheckedFiles::CheckUnchanged() const {
  for (const File& file : files_) {
    struct stat now {};
    if (fstat(file.fd, &now) != 0 || Changed(file.checked, now)) {
      return absl::DataLossError(absl::StrCat(
          "file '", file.relative,
          "' was written while the model loaded (a copy still under way?); it is not loaded: "
          "load it again once the artifact is complete"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::pair<std::string, uint64_t>> Sha256File(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::DataLossError(absl::StrCat("cannot open ", path));
  auto digest = Sha256Descriptor(fd);
  close(fd);
  if (!digest.ok()) return absl::DataLossError(absl::StrCat(path, ": ", digest.status().message()));
  return digest;
}

absl::StatusOr<Artifact> ReadArtifact(const std::string& directory,
                                      const ArtifactReaderOptions& options) {
  std::error_code ec;
  const fs::path root = fs::canonical(directory, ec);
  if (ec || !fs::is_directory(root)) {
    return absl::NotFoundError(
        absl::StrCat("artifact directory '", directory, "' does not exist"));
  }
  auto fail = [&](const absl::Status& status) {
    return absl::Status(status.code(), absl::StrCat("artifact ", root.string(),
                                                    ": ", status.message()));
  };

  const fs::path manifest_path = root / kManifestFile;
  const uintmax_t manifest_size = fs::file_size(manifest_path, ec);
  if (ec) {
    return fail(absl::NotFoundError(
        absl::StrCat(kManifestFile, " is missing: ", ec.message())));
  }
  if (manifest_size > kMaxManifestBytes) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        kManifestFile, " is ", manifest_size, " bytes, more than the limit of ",
        kMaxManifestBytes)));
  }
  Artifact artifact;
  artifact.directory = root.string();
  {
    std::ifstream in(manifest_path, std::ios::binary);
    if (!artifact.manifest.ParseFromIstream(&in)) {
      return fail(absl::DataLossError(
          absl::StrCat(kManifestFile, " is not a valid manifest (truncated or corrupted)")));
    }
  }
  const Manifest& m = artifact.manifest;
  if (m.format_version() != artifact::v1::FORMAT_VERSION_2) {
    return fail(absl::FailedPreconditionError(absl::StrCat(
        "format version ", m.format_version(),
        " is not supported; this runtime reads format version 2 (recapture the "
        "model with this version's precompile_capture)")));
  }
  if (Release(m.torch_version()) != Release(options.torch_version)) {
    return fail(absl::FailedPreconditionError(absl::StrCat(
        "captured with torch ", m.torch_version(), " but this runtime runs torch ",
        options.torch_version, "; recapture the model with torch ",
        Release(options.torch_version))));
  }
  if (m.device() != "cpu" && m.device() != "cuda") {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("unknown device '", m.device(), "'")));
  }
  auto supports = options.cpu_supports_isa ? options.cpu_supports_isa
                                           : std::function<bool(absl::string_view)>(CpuSupportsIsa);
  if (!supports(m.cpu_isa())) {
    return fail(absl::FailedPreconditionError(absl::StrCat(
        "its compiled code needs the CPU instruction set ", m.cpu_isa(),
        ", which this machine does not support")));
  }

  absl::flat_hash_set<std::string> listed;
  artifact.files = std::make_shared<CheckedFiles>();
  for (const auto& file : m.files()) {
    absl::StatusOr<std::string> path = ConfinedPath(root, file.path());
    if (!path.ok()) return fail(path.status());
    // Non-blocking: opening a FIFO for reading would wait for a writer.
    const int fd = open(path->c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
      return fail(absl::DataLossError(absl::StrCat("file '", file.path(), "' cannot be opened: ",
                                                   std::strerror(errno))));
    }
    struct stat before {};
    if (fstat(fd, &before) != 0 || !S_ISREG(before.st_mode)) {
      close(fd);
      return fail(absl::InvalidArgumentError(
          absl::StrCat("file '", file.path(), "' is not a regular file")));
    }
    artifact.files->Hold(file.path(), fd, before);
    absl::StatusOr<std::pair<std::string, uint64_t>> digest = Sha256Descriptor(fd);
    if (!digest.ok()) {
      return fail(absl::DataLossError(
          absl::StrCat("file '", file.path(), "': ", digest.status().message())));
    }
    struct stat after {};
    if (fstat(fd, &after) != 0 || Changed(before, after)) {
      return fail(absl::DataLossError(absl::StrCat(
          "file '", file.path(), "' was written while its checksum was computed (a copy still "
          "under way?)")));
    }
    if (digest->second != file.size_bytes()) {
      return fail(absl::DataLossError(absl::StrCat(
          "file '", file.path(), "' has ", digest->second, " bytes, expected ",
          file.size_bytes(), " (truncated or replaced)")));
    }
    if (digest->first != file.sha256()) {
      return fail(absl::DataLossError(absl::StrCat(
          "file '", file.path(), "' fails its checksum: SHA-256 ", digest->first,
          ", expected ", file.sha256())));
    }
    listed.insert(file.path());
  }
  if (!listed.contains(kFramesFile)) {
    return fail(absl::InvalidArgumentError(
        "the FRAMES list is not among the artifact's checksummed files"));
  }
  if (absl::Status s = ValidateFrames(m, listed); !s.ok()) return fail(s);
  {
    std::ifstream in(artifact.PathOf(kFramesFile), std::ios::binary);
    artifact.frames_text.assign(std::istreambuf_iterator<char>(in), {});
  }
  return artifact;
}

}  // namespace precompile
