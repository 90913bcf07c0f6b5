#include "tests/fuzz/fuzz_checks.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <system_error>
#include <type_traits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "google/protobuf/stubs/logging.h"
#include "proto/artifact.pb.h"
#include "proto/inference.pb.h"
#include "runtime/frame_dispatcher.h"
#include "runtime/guard_program.h"
#include "runtime/status_macros.h"
#include "server/tensor_codec.h"

namespace precompile::fuzz {
namespace {

namespace fs = std::filesystem;

absl::Status Violation(absl::string_view what) {
  return absl::InternalError(absl::StrCat("invariant violated: ", what));
}

// Whether [p, p + n) lies inside [begin, begin + length).
bool Within(const void* p, size_t n, const void* begin, size_t length) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  const auto b = reinterpret_cast<uintptr_t>(begin);
  return a >= b && a - b <= length && n <= length - (a - b);
}

// Reads every byte, so that ASan reports a range that is not readable.
void Touch(const void* data, size_t n) {
  const auto* bytes = static_cast<const volatile uint8_t*>(data);
  uint8_t sum = 0;
  for (size_t i = 0; i < n; ++i) sum = static_cast<uint8_t>(sum + bytes[i]);
  static volatile uint8_t sink;
  sink = sum;
}

// ---------------------------------------------------------------------------
// Request decoding
// ---------------------------------------------------------------------------

// Checks that the decoded bytes are the typed values, converted to Target.
template <typename Target, typename Source>
absl::Status CheckTypedValues(const google::protobuf::RepeatedField<Source>& values,
                              const TensorArg& t) {
  if (t.nbytes != static_cast<size_t>(values.size()) * sizeof(Target)) {
    return Violation(absl::StrCat("typed contents: ", values.size(),
                                  " values decoded into ", t.nbytes, " bytes"));
  }
  const auto* bytes = static_cast<const char*>(t.data);
  for (int i = 0; i < values.size(); ++i) {
    const Target expected = static_cast<Target>(values.Get(i));
    if (std::memcmp(&expected, bytes + i * sizeof(Target), sizeof(Target)) != 0) {
      return Violation(absl::StrCat("typed contents: value ", i,
                                    " did not round-trip"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckTypedContents(const inference::InferTensorContents& c,
                                const TensorArg& t) {
  switch (t.dtype) {
    case DType::kBool: return CheckTypedValues<bool>(c.bool_contents(), t);
    case DType::kUInt8: return CheckTypedValues<uint8_t>(c.uint_contents(), t);
    case DType::kInt8: return CheckTypedValues<int8_t>(c.int_contents(), t);
    case DType::kInt16: return CheckTypedValues<int16_t>(c.int_contents(), t);
    case DType::kInt32: return CheckTypedValues<int32_t>(c.int_contents(), t);
    case DType::kInt64: return CheckTypedValues<int64_t>(c.int64_contents(), t);
    case DType::kFloat32: return CheckTypedValues<float>(c.fp32_contents(), t);
    case DType::kFloat64: return CheckTypedValues<double>(c.fp64_contents(), t);
    case DType::kFloat16:
    case DType::kBFloat16:
      return Violation(absl::StrCat(DTypeName(t.dtype),
                                    " decoded from typed contents"));
  }
  return Violation("unknown dtype");
}

absl::Status CheckDecoded(const inference::ModelInferRequest& request, int index,
                          const std::string& storage, const TensorArg& t) {
  const auto& input = request.inputs(index);
  const std::string what = absl::StrCat("input ", index, " ('", input.name(), "'): ");
  if (server::DTypeFromDatatype(input.datatype()) != t.dtype) {
    return Violation(absl::StrCat(what, "decoded as ", DTypeName(t.dtype),
                                  " from datatype '", input.datatype(), "'"));
  }
  if (t.device != DeviceType::kCpu) {
    return Violation(absl::StrCat(what, "decoded onto a device other than cpu"));
  }
  if (!std::equal(t.shape.begin(), t.shape.end(), input.shape().begin(),
                  input.shape().end())) {
    return Violation(absl::StrCat(what, "shape [", absl::StrJoin(t.shape, ", "),
                                  "] differs from the request's [",
                                  absl::StrJoin(input.shape(), ", "), "]"));
  }
  // product(shape) * element size, in 128 bits and saturated well above any
  // size_t, so that the check itself cannot overflow.
  constexpr unsigned __int128 kSaturated = static_cast<unsigned __int128>(1) << 100;
  unsigned __int128 expected = DTypeSize(t.dtype);
  for (int64_t d : t.shape) {
    if (d < 0) {
      return Violation(absl::StrCat(what, "accepted a negative dimension ", d));
    }
    expected = std::min(expected * static_cast<uint64_t>(d), kSaturated);
  }
  if (expected != t.nbytes) {
    return Violation(absl::StrCat(
        what, "nbytes is ", t.nbytes, " but shape [", absl::StrJoin(t.shape, ", "),
        "] of ", DTypeName(t.dtype), " needs ",
        expected == kSaturated ? std::string("more than 2^64")
                               : absl::StrCat(static_cast<uint64_t>(expected))));
  }
  if (t.nbytes > 0 && t.data == nullptr) {
    return Violation(absl::StrCat(what, "null data for ", t.nbytes, " bytes"));
  }
  if (request.raw_input_contents_size() > 0) {
    const std::string& raw = request.raw_input_contents(index);
    if (!Within(t.data, t.nbytes, raw.data(), raw.size())) {
      return Violation(absl::StrCat(what, "data does not lie inside its raw contents"));
    }
  } else {
    if (!Within(t.data, t.nbytes, storage.data(), storage.size())) {
      return Violation(absl::StrCat(what, "data does not lie inside the storage"));
    }
    if (absl::Status s = CheckTypedContents(input.contents(), t); !s.ok()) {
      return Violation(absl::StrCat(what, s.message()));
    }
  }
  Touch(t.data, t.nbytes);

  // What the server would send back for this tensor.
  OutputTensor out;
  out.dtype = t.dtype;
  out.shape = t.shape;
  out.data = t.data;
  out.nbytes = t.nbytes;
  inference::ModelInferResponse response;
  server::EncodeOutput(out, input.name(), &response);
  if (response.outputs_size() != 1 || response.raw_output_contents_size() != 1 ||
      response.outputs(0).datatype() != input.datatype() ||
      response.outputs(0).name() != input.name() ||
      !std::equal(t.shape.begin(), t.shape.end(),
                  response.outputs(0).shape().begin(),
                  response.outputs(0).shape().end()) ||
      response.raw_output_contents(0) !=
          absl::string_view(static_cast<const char*>(t.data), t.nbytes)) {
    return Violation(absl::StrCat(what, "EncodeOutput does not give the tensor back"));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Guards
// ---------------------------------------------------------------------------

// Reads little-endian values from the fuzzer's bytes; past the end, zeros.
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  uint8_t U8() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint64_t U64(int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(U8()) << (8 * i);
    return v;
  }
  int64_t I64() { return static_cast<int64_t>(U64(8)); }
  double F64() {
    const uint64_t bits = U64(8);
    double v;
    std::memcpy(&v, &bits, sizeof(v));
    return v;
  }
  // Up to `n` bytes: fewer when the input ends first.
  absl::string_view Bytes(size_t n) {
    n = std::min(n, size_ - pos_);
    absl::string_view s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// One call's arguments, each tensor's sizes and each string in an allocation
// of exactly its length so that ASan sees any read past it.
struct Call {
  GlobalState state;
  std::vector<ArgView> views;
  std::vector<std::unique_ptr<int64_t[]>> sizes;
  std::vector<std::unique_ptr<char[]>> strings;
};

constexpr int kNumDTypes = 10;  // DType::kBool .. DType::kFloat64

Call ReadCall(ByteReader& in, int num_parameters) {
  Call call;
  call.state.grad_enabled = (in.U8() & 1) != 0;
  call.state.default_dtype = static_cast<DType>(in.U8() % kNumDTypes);
  call.views.resize(num_parameters);
  for (ArgView& v : call.views) {
    switch (in.U8() % 6) {
      case 0:
        v.kind = ArgView::Kind::kNone;
        break;
      case 1: {
        v.kind = ArgView::Kind::kTensor;
        v.dtype = static_cast<DType>(in.U8() % kNumDTypes);
        v.device = (in.U8() & 1) ? DeviceType::kCuda : DeviceType::kCpu;
        v.rank = in.U8() % 9;
        auto sizes = std::make_unique<int64_t[]>(v.rank);
        for (int d = 0; d < v.rank; ++d) sizes[d] = in.I64();
        v.sizes = sizes.get();
        call.sizes.push_back(std::move(sizes));
        break;
      }
      case 2:
        v.kind = ArgView::Kind::kBool;
        v.bool_value = (in.U8() & 1) != 0;
        break;
      case 3:
        v.kind = ArgView::Kind::kInt;
        v.int_value = in.I64();
        break;
      case 4:
        v.kind = ArgView::Kind::kFloat;
        v.float_value = in.F64();
        break;
      case 5: {
        v.kind = ArgView::Kind::kString;
        absl::string_view s = in.Bytes(in.U8());
        auto copy = std::make_unique<char[]>(s.size());
        std::memcpy(copy.get(), s.data(), s.size());
        v.string_value = absl::string_view(copy.get(), s.size());
        call.strings.push_back(std::move(copy));
        break;
      }
    }
  }
  return call;
}

// ---------------------------------------------------------------------------
// Manifest
// ---------------------------------------------------------------------------

constexpr char kFixtureFrames[] = "FRAMES";

std::string FixtureContent(const std::string& path) {
  return absl::StrCat("fuzz fixture: ", path, "\n");
}

// The fixture artifact directory, created on first use and removed at exit.
const std::string& FixtureDirectory() {
  static const std::string* directory = [] {
    const char* base = std::getenv("TEST_TMPDIR");
    if (base == nullptr) base = std::getenv("TMPDIR");
    std::string pattern = absl::StrCat(base ? base : "/tmp", "/manifest_fuzzer.XXXXXX");
    if (mkdtemp(pattern.data()) == nullptr) {
      std::perror("manifest fuzz fixture: mkdtemp");
      std::abort();
    }
    const fs::path root = fs::canonical(pattern);
    for (const std::string& file : ManifestFixtureFiles()) {
      fs::create_directories((root / file).parent_path());
      std::ofstream(root / file, std::ios::binary) << FixtureContent(file);
    }
    fs::create_directory(root / "dir");
    fs::create_symlink(kFixtureFrames, root / "inside");
    fs::create_symlink("..", root / "escape");
    auto* path = new std::string(root.string());
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(FixtureDirectory(), ec);
    });
    return path;
  }();
  return *directory;
}

bool IsDocumentedReaderError(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
      return true;
    default:
      return false;
  }
}

}  // namespace

absl::Status CheckRequestDecoding(const uint8_t* data, size_t size) {
  inference::ModelInferRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return absl::OkStatus();
  for (int i = 0; i < request.inputs_size(); ++i) {
    std::string storage;
    absl::StatusOr<TensorArg> decoded = server::DecodeInput(request, i, &storage);
    if (!decoded.ok()) {
      if (decoded.status().code() != absl::StatusCode::kInvalidArgument ||
          decoded.status().message().empty()) {
        return Violation(absl::StrCat("input ", i, " refused with ",
                                      decoded.status().ToString(),
                                      ", not INVALID_ARGUMENT with a message"));
      }
      continue;
    }
    RETURN_IF_ERROR(CheckDecoded(request, i, storage, *decoded));
  }
  return absl::OkStatus();
}

absl::Status CheckGuards(const uint8_t* data, size_t size) {
  ByteReader in(data, size);
  const auto frame_length = static_cast<size_t>(in.U64(2));
  artifact::v1::Frame frame;
  const absl::string_view frame_bytes = in.Bytes(frame_length);
  if (!frame.ParseFromArray(frame_bytes.data(), static_cast<int>(frame_bytes.size())) ||
      frame.parameters_size() > kMaxFuzzParameters) {
    return absl::OkStatus();
  }
  std::vector<std::string> names;
  for (const auto& p : frame.parameters()) names.push_back(p.name());

  std::vector<GuardProgram> programs;
  for (const auto& variant : frame.variants()) {
    absl::StatusOr<GuardProgram> program = GuardProgram::Compile(variant, names);
    if (program.ok()) {
      programs.push_back(*std::move(program));
    } else if (program.status().code() != absl::StatusCode::kInvalidArgument ||
               program.status().message().empty()) {
      return Violation(absl::StrCat("Compile failed with ", program.status().ToString(),
                                    ", not INVALID_ARGUMENT with a message"));
    }
  }

  const Call call = ReadCall(in, static_cast<int>(names.size()));
  const absl::Span<const ArgView> args(call.views);
  std::vector<bool> matched;
  std::vector<std::optional<GuardProgram::Mismatch>> mismatches;
  for (size_t i = 0; i < programs.size(); ++i) {
    const GuardProgram& p = programs[i];
    const bool m = p.Matches(args, call.state);
    std::optional<GuardProgram::Mismatch> e = p.ExplainMismatch(args, call.state);
    if (m == e.has_value()) {
      return Violation(absl::StrCat(
          "variant ", i, ": Matches() is ", m, " but ExplainMismatch() says ",
          e ? absl::StrCat("'", e->reason, "'") : std::string("nothing")));
    }
    if (e && (e->checks_passed < 0 || e->checks_passed >= p.num_checks() ||
              e->reason.empty())) {
      return Violation(absl::StrCat("variant ", i, ": mismatch after ",
                                    e->checks_passed, " of ", p.num_checks(),
                                    " checks, reason '", e->reason, "'"));
    }
    matched.push_back(m);
    mismatches.push_back(std::move(e));
  }

  const int n = static_cast<int>(programs.size());
  const bool any_match = std::find(matched.begin(), matched.end(), true) != matched.end();
  const bool all_match = std::find(matched.begin(), matched.end(), false) == matched.end();
  FrameDispatcher dispatcher(programs);
  // Twice: the second call starts from the variant the first one hit.
  for (int round = 0; round < 2; ++round) {
    const int hit = dispatcher.Match(args, call.state);
    if (hit < -1 || hit >= n || (hit >= 0 && !matched[hit]) ||
        (hit == -1 && any_match)) {
      return Violation(absl::StrCat("FrameDispatcher::Match returned ", hit, " of ",
                                    n, " variants (any matches: ", any_match, ")"));
    }
  }
  std::optional<FrameDispatcher::Explanation> miss =
      dispatcher.ExplainMiss(args, call.state);
  if (miss.has_value() == all_match) {
    return Violation(absl::StrCat("ExplainMiss() ", miss ? "explains" : "is empty",
                                  " with ", n, " variants, all matching: ", all_match));
  }
  if (miss) {
    if (miss->variant < 0 || miss->variant >= n || matched[miss->variant]) {
      return Violation(absl::StrCat("ExplainMiss() names variant ", miss->variant));
    }
    const auto& chosen = *mismatches[miss->variant];
    for (const auto& m : mismatches) {
      if (m && m->checks_passed > chosen.checks_passed) {
        return Violation("ExplainMiss() did not pick the closest variant");
      }
    }
    if (miss->reason != chosen.reason) {
      return Violation(absl::StrCat("ExplainMiss() says '", miss->reason,
                                    "', the variant says '", chosen.reason, "'"));
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> ManifestFixtureFiles() {
  std::vector<std::string> files = {kFixtureFrames};
  for (const char* frame : {"forward", "encoder", "scale"}) {
    for (const char* file : {"0.pt2", "1.pt2", "eager.pt"}) {
      files.push_back(absl::StrCat("frames/", frame, "/", file));
    }
  }
  return files;
}

ArtifactReaderOptions FuzzReaderOptions() {
  ArtifactReaderOptions options;
  options.torch_version = "2.11.0";
  options.cpu_supports_isa = [](absl::string_view isa) {
    return isa.empty() || isa == "DEFAULT" || isa == "AVX2";
  };
  return options;
}

absl::StatusOr<Artifact> ReadFuzzArtifact(const uint8_t* data, size_t size) {
  const std::string& directory = FixtureDirectory();
  {
    std::ofstream out(fs::path(directory) / "MANIFEST.pb",
                      std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    if (!out.flush()) {
      std::fprintf(stderr, "manifest fuzz fixture: cannot write MANIFEST.pb\n");
      std::abort();
    }
  }
  return ReadArtifact(directory, FuzzReaderOptions());
}

absl::Status CheckManifest(const uint8_t* data, size_t size) {
  absl::StatusOr<Artifact> artifact = ReadFuzzArtifact(data, size);
  if (!artifact.ok()) {
    if (!IsDocumentedReaderError(artifact.status().code()) ||
        artifact.status().message().empty()) {
      return Violation(absl::StrCat("ReadArtifact returned ",
                                    artifact.status().ToString(),
                                    ", which its header does not document"));
    }
    return absl::OkStatus();
  }
  const Artifact& a = *artifact;
  const artifact::v1::Manifest& m = a.manifest;
  if (a.directory != FixtureDirectory()) {
    return Violation(absl::StrCat("directory '", a.directory, "', expected '",
                                  FixtureDirectory(), "'"));
  }
  if (a.frames_text != FixtureContent(kFixtureFrames)) {
    return Violation(absl::StrCat("frames_text is '", a.frames_text, "'"));
  }
  bool frames_listed = false;
  absl::flat_hash_set<std::string> listed;
  for (const auto& file : m.files()) {
    std::error_code ec;
    const fs::path resolved = fs::canonical(a.PathOf(file.path()), ec);
    if (ec || !absl::StartsWith(resolved.string(), a.directory + "/") ||
        !fs::is_regular_file(resolved, ec) ||
        fs::file_size(resolved, ec) != file.size_bytes()) {
      return Violation(absl::StrCat("accepted file '", file.path(),
                                    "', which resolves to '", resolved.string(),
                                    "' (", ec.message(), ")"));
    }
    frames_listed |= file.path() == kFixtureFrames;
    listed.insert(file.path());
  }
  if (!frames_listed) return Violation("accepted without FRAMES among its files");

  const artifact::v1::Frame* entry = nullptr;
  absl::flat_hash_set<std::string> frame_names;
  for (const auto& frame : m.frames()) {
    if (!frame_names.insert(frame.name()).second) {
      return Violation(absl::StrCat("accepted frame '", frame.name(), "' twice"));
    }
    if (frame.name() == m.entry_frame()) entry = &frame;
    if (frame.eager_fallback() && !listed.contains(frame.eager_program_path())) {
      return Violation(absl::StrCat("accepted flagged frame '", frame.name(),
                                    "' without a listed eager program"));
    }
    // What the runtime does next with each frame.
    std::vector<std::string> names;
    for (const auto& p : frame.parameters()) names.push_back(p.name());
    for (const auto& v : frame.variants()) {
      if (!listed.contains(v.package_path())) {
        return Violation(absl::StrCat("accepted variant '", v.id(),
                                      "' whose package is not listed"));
      }
      absl::StatusOr<GuardProgram> program = GuardProgram::Compile(v, names);
      if (!program.ok() &&
          program.status().code() != absl::StatusCode::kInvalidArgument) {
        return Violation(absl::StrCat("Compile failed with ",
                                      program.status().ToString()));
      }
    }
  }
  if (entry == nullptr || entry->variantless_entry_fallback()) {
    return Violation(absl::StrCat("accepted entry frame '", m.entry_frame(), "'"));
  }
  return absl::OkStatus();
}

int RunFuzzCheck(absl::Status (*check)(const uint8_t*, size_t), const char* fuzzer,
                 const uint8_t* data, size_t size) {
  // Proto3 parsing logs every invalid UTF-8 string: silence it.
  static const bool quiet = [] {
    google::protobuf::SetLogHandler(nullptr);
    return true;
  }();
  (void)quiet;
  const absl::Status status = check(data, size);
  if (!status.ok()) {
    std::fprintf(stderr, "%s: %s\n", fuzzer, status.ToString().c_str());
    std::fflush(stderr);
    std::abort();
  }
  return 0;
}

}  // namespace precompile::fuzz
