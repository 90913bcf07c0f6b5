#include "tests/fuzz/fuzz_checks.h"

#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <system_error>
#include <type_traits>

#include <grpcpp/support/proto_buffer_reader.h>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "base/half_float.h"
#include "base/json_text.h"
#include "base/status_macros.h"
#include "google/protobuf/stubs/logging.h"
#include "proto/artifact.pb.h"
#include "proto/inference.pb.h"
#include "runtime/frame_dispatcher.h"
#include "runtime/guard_program.h"
#include "server/api/tensor_codec.h"
#include "server/grpc/http2_stream_ledger.h"
#include "server/grpc/http2_test_frames.h"
#include "server/grpc/infer_response.h"
#include "server/http/http_codec.h"
#include "server/http/http_head.h"
#include "server/http/http_routes.h"

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
  // Volatile reads: the compiler may not drop them.
  const auto* bytes = static_cast<const volatile uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) (void)bytes[i];
}

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

// ---------------------------------------------------------------------------
// Request decoding
// ---------------------------------------------------------------------------

// Checks that the decoded bytes are the typed values, converted to Target.
template <typename Target, typename Source>
absl::Status CheckTypedValues(const google::protobuf::RepeatedField<Source>& values,
                              const TensorArg& t) {
  if (t.nbytes != static_cast<size_t>(values.size()) * sizeof(Target)) {
    return Violation(absl::StrCat("typed contents: ", values.size(), " values decoded into ",
                                  t.nbytes, " bytes"));
  }
  const auto* bytes = static_cast<const char*>(t.data);
  for (int i = 0; i < values.size(); ++i) {
    const Target expected = static_cast<Target>(values.Get(i));
    if (std::memcmp(&expected, bytes + i * sizeof(Target), sizeof(Target)) != 0) {
      return Violation(absl::StrCat("typed contents: value ", i, " did not round-trip"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckTypedContents(const inference::InferTensorContents& c, const TensorArg& t) {
  switch (t.dtype) {
    case DType::kBool:
      return CheckTypedValues<bool>(c.bool_contents(), t);
    case DType::kUInt8:
      return CheckTypedValues<uint8_t>(c.uint_contents(), t);
    case DType::kInt8:
      return CheckTypedValues<int8_t>(c.int_contents(), t);
    case DType::kInt16:
      return CheckTypedValues<int16_t>(c.int_contents(), t);
    case DType::kInt32:
      return CheckTypedValues<int32_t>(c.int_contents(), t);
    case DType::kInt64:
      return CheckTypedValues<int64_t>(c.int64_contents(), t);
    case DType::kFloat32:
      return CheckTypedValues<float>(c.fp32_contents(), t);
    case DType::kFloat64:
      return CheckTypedValues<double>(c.fp64_contents(), t);
    case DType::kFloat16:
    case DType::kBFloat16:
      return Violation(absl::StrCat(DTypeName(t.dtype), " decoded from typed contents"));
  }
  return Violation("unknown dtype");
}

// The values a structurally built request's dimensions are drawn from: edges
// of the integer types and products that wrap around 2^64.
// clang-format off
constexpr int64_t kInterestingSizes[] = {
    0, 1, 2, 3, 4, 8, 16, 255, 256, 4096, 65536,
    std::numeric_limits<int32_t>::max(), int64_t{1} << 31,
    int64_t{1} << 32, (int64_t{1} << 32) + 1,
    int64_t{1} << 60, int64_t{1} << 61, (int64_t{1} << 61) + 1,
    int64_t{1} << 62, (int64_t{1} << 62) + 1,
    std::numeric_limits<int64_t>::max(), -1, std::numeric_limits<int64_t>::min()};
// clang-format on
constexpr int kNumInteresting = sizeof(kInterestingSizes) / sizeof(kInterestingSizes[0]);

constexpr const char* kDatatypeNames[] = {"BOOL", "UINT8", "INT8", "INT16", "INT32", "INT64",
                                          "FP16", "BF16",  "FP32", "FP64",  "BYTES", "UINT64"};

// Builds a request from `in` (the structural mode of CheckRequestDecoding).
inference::ModelInferRequest BuildRequest(ByteReader& in) {
  inference::ModelInferRequest request;
  const int num_inputs = in.U8() % 5;
  const uint8_t flags = in.U8();
  const bool raw = (flags & 1) != 0;
  for (int i = 0; i < num_inputs; ++i) {
    auto* input = request.add_inputs();
    input->set_name(absl::StrCat("input", i));
    input->set_datatype(kDatatypeNames[in.U8() % std::size(kDatatypeNames)]);
    const std::optional<DType> dtype = server::DTypeFromDatatype(input->datatype());
    // The byte count a decoder that multiplies in 64 bits without checking
    // would expect: the size that slips through an overflow.
    uint64_t wrapped_bytes = dtype ? DTypeSize(*dtype) : 1;
    const int rank = in.U8() % 9;
    for (int d = 0; d < rank; ++d) {
      const uint8_t selector = in.U8();
      const int64_t size = selector < kNumInteresting ? kInterestingSizes[selector]
                           : selector < 128           ? selector - kNumInteresting
                                                      : in.I64();
      input->add_shape(size);
      wrapped_bytes *= static_cast<uint64_t>(size);
    }
    const uint8_t content = in.U8();
    if (content & 1) {
      auto* c = input->mutable_contents();
      const int field = (content >> 1) % 7;
      const int count = in.U8();
      for (int k = 0; k < count; ++k) {
        const int64_t v = in.I64();
        switch (field) {
          case 0:
            c->add_bool_contents(v & 1);
            break;
          case 1:
            c->add_int_contents(static_cast<int32_t>(v));
            break;
          case 2:
            c->add_int64_contents(v);
            break;
          case 3:
            c->add_uint_contents(static_cast<uint32_t>(v));
            break;
          case 4:
            c->add_uint64_contents(static_cast<uint64_t>(v));
            break;
          case 5:
            c->add_fp32_contents(static_cast<float>(v));
            break;
          case 6:
            c->add_fp64_contents(static_cast<double>(v));
            break;
        }
      }
    }
    if (raw) {
      const size_t length =
          (content & 0x80) || wrapped_bytes > 4096 ? in.U8() : static_cast<size_t>(wrapped_bytes);
      std::string bytes(in.Bytes(length));
      bytes.resize(length);  // Zeros past the end of the input.
      request.add_raw_input_contents(std::move(bytes));
    }
  }
  if (raw && (flags & 2)) request.add_raw_input_contents("");  // One too many.
  return request;
}

absl::Status CheckDecoded(const inference::ModelInferRequest& request, int index,
                          const std::string& storage, const TensorArg& t) {
  const auto& input = request.inputs(index);
  const std::string what = absl::StrCat("input ", index, " ('", input.name(), "'): ");
  if (server::DTypeFromDatatype(input.datatype()) != t.dtype) {
    return Violation(absl::StrCat(what, "decoded as ", DTypeName(t.dtype), " from datatype '",
                                  input.datatype(), "'"));
  }
  if (t.device != DeviceType::kCpu) {
    return Violation(absl::StrCat(what, "decoded onto a device other than cpu"));
  }
  if (!std::equal(t.shape.begin(), t.shape.end(), input.shape().begin(), input.shape().end())) {
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
    const auto size = static_cast<uint64_t>(d);
    expected = (size != 0 && expected > kSaturated / size) ? kSaturated : expected * size;
  }
  if (expected != t.nbytes) {
    return Violation(absl::StrCat(what, "nbytes is ", t.nbytes, " but shape [",
                                  absl::StrJoin(t.shape, ", "), "] of ", DTypeName(t.dtype),
                                  " needs ",
                                  expected > std::numeric_limits<uint64_t>::max()
                                      ? std::string("more than 2^64")
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
  // An owner that owns nothing (the bytes outlive the check), so that large
  // tensors take the referenced path.
  out.owner = std::shared_ptr<const void>(std::shared_ptr<void>(), t.data);
  inference::ModelInferResponse header;
  server::DescribeOutput(out, input.name(), &header);
  grpc::ByteBuffer wire = server::SerializeInferResponse(header, {out});
  inference::ModelInferResponse response;
  grpc::ProtoBufferReader reader(&wire);
  if (!response.ParseFromZeroCopyStream(&reader) || response.outputs_size() != 1 ||
      response.raw_output_contents_size() != 1 ||
      response.outputs(0).datatype() != input.datatype() ||
      response.outputs(0).name() != input.name() ||
      !std::equal(t.shape.begin(), t.shape.end(), response.outputs(0).shape().begin(),
                  response.outputs(0).shape().end()) ||
      response.raw_output_contents(0) !=
          absl::string_view(static_cast<const char*>(t.data), t.nbytes)) {
    return Violation(
        absl::StrCat(what, "DescribeOutput and SerializeInferResponse do not give it back"));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Guards
// ---------------------------------------------------------------------------

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

// The fixture artifact directory, created on first use and removed at exit:
// <temporary>/artifact, beside <temporary>/outside/FRAMES, a copy of the
// artifact's FRAMES that only its "escape" link leads to.
const std::string& FixtureDirectory() {
  static const std::string* directory = [] {
    const char* tmp = std::getenv("TEST_TMPDIR");
    if (tmp == nullptr) tmp = std::getenv("TMPDIR");
    std::string pattern = absl::StrCat(tmp ? tmp : "/tmp", "/manifest_fuzzer.XXXXXX");
    if (mkdtemp(pattern.data()) == nullptr) {
      std::perror("manifest fuzz fixture: mkdtemp");
      std::abort();
    }
    static const fs::path* base = new fs::path(fs::canonical(pattern));
    const fs::path root = *base / "artifact";
    for (const std::string& file : ManifestFixtureFiles()) {
      fs::create_directories((root / file).parent_path());
      std::ofstream(root / file, std::ios::binary) << FixtureContent(file);
    }
    fs::create_directory(root / "dir");
    fs::create_symlink(kFixtureFrames, root / "inside");
    fs::create_symlink("../outside", root / "escape");
    fs::create_directory(*base / "outside");
    std::ofstream(*base / "outside" / kFixtureFrames, std::ios::binary)
        << FixtureContent(kFixtureFrames);
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(*base, ec);
    });
    return new std::string(root.string());
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
  if (size > 0 && data[0] == 0) {
    ByteReader in(data + 1, size - 1);
    request = BuildRequest(in);
  } else if (!request.ParseFromArray(data, static_cast<int>(size))) {
    return absl::OkStatus();
  }
  for (int i = 0; i < request.inputs_size(); ++i) {
    std::string storage;
    absl::StatusOr<TensorArg> decoded = server::DecodeInput(request, i, &storage);
    if (!decoded.ok()) {
      if (decoded.status().code() != absl::StatusCode::kInvalidArgument ||
          decoded.status().message().empty()) {
        return Violation(absl::StrCat("input ", i, " refused with ", decoded.status().ToString(),
                                      ", not INVALID_ARGUMENT with a message"));
      }
      continue;
    }
    RETURN_IF_ERROR(CheckDecoded(request, i, storage, *decoded));
  }
  return absl::OkStatus();
}

namespace {

// True when `t` holds a float NaN, which JSON carries as the string "NaN":
// its payload and sign do not come back.
bool HasNaN(const TensorArg& t) {
  const char* p = static_cast<const char*>(t.data);
  const size_t n = t.nbytes / std::max<size_t>(1, DTypeSize(t.dtype));
  for (size_t i = 0; i < n; ++i) {
    float f = 0;
    double d = 0;
    uint16_t h = 0;
    switch (t.dtype) {
      case DType::kFloat32:
        std::memcpy(&f, p + 4 * i, 4);
        if (std::isnan(f)) return true;
        break;
      case DType::kFloat64:
        std::memcpy(&d, p + 8 * i, 8);
        if (std::isnan(d)) return true;
        break;
      case DType::kFloat16:
        std::memcpy(&h, p + 2 * i, 2);
        if (std::isnan(HalfToFloat(h))) return true;
        break;
      case DType::kBFloat16:
        std::memcpy(&h, p + 2 * i, 2);
        if (std::isnan(BFloat16ToFloat(h))) return true;
        break;
      default: break;
    }
  }
  return false;
}

}  // namespace

absl::Status CheckHttpRequest(const uint8_t* data, size_t size) {
  if (size == 0) return absl::OkStatus();
  ByteReader in(data + 1, size - 1);
  std::optional<size_t> header_length;
  if (data[0] & 1) header_length = static_cast<size_t>(in.U64(2));
  const absl::string_view body = in.Bytes(size);
  if (header_length) *header_length %= body.size() + 1;

  // The same bytes as an HTTP head: refused with a message, or parsed into
  // what the transport relies on.
  const absl::string_view head_bytes = body.substr(server::SkipEmptyLines(body));
  if (std::optional<size_t> end = server::FindHeadEnd(head_bytes)) {
    constexpr size_t kMaxFields = 8;
    absl::StatusOr<server::HttpHead> head =
        server::ParseHttpHead(head_bytes.substr(0, *end), kMaxFields);
    if (!head.ok()) {
      const absl::StatusCode code = head.status().code();
      if (head.status().message().empty() ||
          (code != absl::StatusCode::kInvalidArgument && code != absl::StatusCode::kUnimplemented &&
           code != absl::StatusCode::kResourceExhausted)) {
        return Violation(absl::StrCat("ParseHttpHead refused with ", head.status().ToString()));
      }
    } else {
      if (head->method.empty() || head->fields.size() > kMaxFields) {
        return Violation("ParseHttpHead gave no method or too many fields");
      }
      for (const auto& [name, value] : head->fields) {
        if (name.empty() || name != absl::AsciiStrToLower(name) ||
            value.find_first_of("\r\n") != std::string::npos) {
          return Violation(absl::StrCat("ParseHttpHead gave the field '", name, "'"));
        }
      }
    }
  }

  for (const char* method : {"GET", "POST"}) {
    const server::HttpRoute route = server::RouteOf(method, body);
    if (!route.model.empty() && route.model.find('/') != std::string::npos) {
      return Violation(absl::StrCat("RouteOf named the model '", route.model, "'"));
    }
  }

  inference::ModelInferRequest request;
  const absl::Status decoded = server::DecodeInferRequest(body, header_length, "m", "", &request);
  if (!decoded.ok()) {
    if (decoded.code() != absl::StatusCode::kInvalidArgument || decoded.message().empty()) {
      return Violation(absl::StrCat("DecodeInferRequest refused with ", decoded.ToString(),
                                    ", not INVALID_ARGUMENT with a message"));
    }
    return absl::OkStatus();
  }
  if (request.raw_input_contents_size() != request.inputs_size()) {
    return Violation(absl::StrCat(request.inputs_size(), " inputs but ",
                                  request.raw_input_contents_size(), " raw_input_contents"));
  }
  // The decoded inputs, sent back as outputs of a response.
  inference::ModelInferResponse response;
  std::vector<OutputTensor> outputs;
  std::vector<std::string> storage(request.inputs_size());
  bool nan = false;
  for (int i = 0; i < request.inputs_size(); ++i) {
    absl::StatusOr<TensorArg> t = server::DecodeInput(request, i, &storage[i]);
    if (!t.ok()) {
      return Violation(absl::StrCat("input ", i, " was accepted but DecodeInput refuses it: ",
                                    t.status().ToString()));
    }
    nan = nan || HasNaN(*t);
    OutputTensor out;
    out.dtype = t->dtype;
    out.shape = t->shape;
    out.data = t->data;
    out.nbytes = t->nbytes;
    server::DescribeOutput(out, request.inputs(i).name(), &response);
    outputs.push_back(out);
  }
  for (bool binary : {false, true}) {
    inference::ModelInferRequest asked;
    (*asked.mutable_parameters())["binary_data_output"].set_bool_param(binary);
    const server::HttpInferResponse encoded =
        server::EncodeInferResponse(asked, response, outputs);
    const std::string body(encoded.body);
    const absl::string_view json_text =
        absl::string_view(body).substr(0, encoded.header_length.value_or(body.size()));
    absl::StatusOr<Json> json = ParseJson(json_text);
    if (!json.ok()) return Violation(absl::StrCat("the response is not JSON: ", json.status().ToString()));
    // A response with no outputs has no binary part, so nothing to announce
    // with a header length: it is plain JSON.
    if (binary && outputs.empty() && encoded.header_length) {
      return Violation("a response without outputs announces a binary part");
    }
    if (binary && !outputs.empty()) {
      size_t total = 0;
      for (const OutputTensor& o : outputs) total += o.nbytes;
      if (!encoded.header_length || encoded.body.size() != *encoded.header_length + total) {
        return Violation("the binary response does not carry every output's bytes after its JSON");
      }
      size_t offset = *encoded.header_length;
      for (const OutputTensor& o : outputs) {
        if (o.nbytes > 0 && std::memcmp(body.data() + offset, o.data, o.nbytes) != 0) {
          return Violation("a binary output's bytes are not the tensor's");
        }
        offset += o.nbytes;
      }
      continue;
    }
    if (nan) continue;
    // The JSON outputs, read back as the inputs of a request.
    Json again = Json::object();
    again["inputs"] = (*json)["outputs"];
    inference::ModelInferRequest reread;
    const absl::Status back =
        server::DecodeInferRequest(DumpJson(again, false), std::nullopt, "m", "", &reread);
    if (!back.ok()) {
      return Violation(absl::StrCat("the JSON response does not decode back: ", back.ToString()));
    }
    for (int i = 0; i < request.inputs_size(); ++i) {
      if (reread.raw_input_contents(i) != std::string_view(static_cast<const char*>(outputs[i].data),
                                                           outputs[i].nbytes)) {
        return Violation(absl::StrCat("input ", i, " did not survive a round trip through JSON"));
      }
    }
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
      return Violation(
          absl::StrCat("variant ", i, ": Matches() is ", m, " but ExplainMismatch() says ",
                       e ? absl::StrCat("'", e->reason, "'") : std::string("nothing")));
    }
    if (e && (e->checks_passed < 0 || e->checks_passed >= p.num_checks() || e->reason.empty())) {
      return Violation(absl::StrCat("variant ", i, ": mismatch after ", e->checks_passed, " of ",
                                    p.num_checks(), " checks, reason '", e->reason, "'"));
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
    if (hit < -1 || hit >= n || (hit >= 0 && !matched[hit]) || (hit == -1 && any_match)) {
      return Violation(absl::StrCat("FrameDispatcher::Match returned ", hit, " of ", n,
                                    " variants (any matches: ", any_match, ")"));
    }
  }
  std::optional<FrameDispatcher::Explanation> miss = dispatcher.ExplainMiss(args, call.state);
  if (miss.has_value() == all_match) {
    return Violation(absl::StrCat("ExplainMiss() ", miss ? "explains" : "is empty", " with ", n,
                                  " variants, all matching: ", all_match));
  }
  if (miss) {
    if (miss->variant < 0 || miss->variant >= n || matched[miss->variant]) {
      return Violation(absl::StrCat("ExplainMiss() names variant ", miss->variant));
    }
    // The closest: among the variants that take the most of the inputs the
    // call sent, the one whose checks held longest.
    const auto& chosen = *mismatches[miss->variant];
    const int chosen_differ = programs[miss->variant].InputsNotAsTaken(args);
    for (int i = 0; i < n; ++i) {
      if (!mismatches[i]) continue;
      const int differ = programs[i].InputsNotAsTaken(args);
      if (differ < chosen_differ ||
          (differ == chosen_differ && mismatches[i]->checks_passed > chosen.checks_passed)) {
        return Violation("ExplainMiss() did not pick the closest variant");
      }
    }
    if (miss->reason != chosen.reason) {
      return Violation(absl::StrCat("ExplainMiss() says '", miss->reason, "', the variant says '",
                                    chosen.reason, "'"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int>> EvaluateGuards(const uint8_t* data, size_t size) {
  ByteReader in(data, size);
  const auto frame_length = static_cast<size_t>(in.U64(2));
  artifact::v1::Frame frame;
  const absl::string_view frame_bytes = in.Bytes(frame_length);
  if (!frame.ParseFromArray(frame_bytes.data(), static_cast<int>(frame_bytes.size()))) {
    return absl::InvalidArgumentError("the frame does not parse");
  }
  std::vector<std::string> names;
  for (const auto& p : frame.parameters()) names.push_back(p.name());
  const Call call = ReadCall(in, static_cast<int>(names.size()));
  std::vector<int> results;
  for (const auto& variant : frame.variants()) {
    absl::StatusOr<GuardProgram> program = GuardProgram::Compile(variant, names);
    results.push_back(!program.ok() ? -1 : program->Matches(call.views, call.state) ? 1 : 0);
  }
  return results;
}

std::vector<std::string> ManifestFixtureFiles() {
  std::vector<std::string> files = {kFixtureFrames};
  for (const char* frame : {"forward", "encoder", "scale"}) {
    for (const char* file : {"0.pt2", "1.pt2", "eager.pt", "python.pt"}) {
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
    std::ofstream out(fs::path(directory) / "MANIFEST.pb", std::ios::binary | std::ios::trunc);
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
    if (!IsDocumentedReaderError(artifact.status().code()) || artifact.status().message().empty()) {
      return Violation(absl::StrCat("ReadArtifact returned ", artifact.status().ToString(),
                                    ", which its header does not document"));
    }
    return absl::OkStatus();
  }
  const Artifact& a = *artifact;
  const artifact::v1::Manifest& m = a.manifest;
  if (a.directory != FixtureDirectory()) {
    return Violation(
        absl::StrCat("directory '", a.directory, "', expected '", FixtureDirectory(), "'"));
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
        !fs::is_regular_file(resolved, ec) || fs::file_size(resolved, ec) != file.size_bytes()) {
      return Violation(absl::StrCat("accepted file '", file.path(), "', which resolves to '",
                                    resolved.string(), "' (", ec.message(), ")"));
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
    // Exactly one eager program per flagged frame, TorchScript or Python.
    const bool torchscript = listed.contains(frame.eager_program_path());
    const bool python = frame.has_python_program() && listed.contains(frame.python_program().path());
    if (frame.eager_fallback() && torchscript == python) {
      return Violation(absl::StrCat("accepted flagged frame '", frame.name(),
                                    "' without exactly one listed eager program"));
    }
    if (python && m.python().python_version().empty()) {
      return Violation(absl::StrCat("accepted the Python eager program of frame '", frame.name(),
                                    "' with no Python version"));
    }
    absl::flat_hash_set<std::string> outputs;
    for (const auto& leaf : frame.outputs().leaves()) {
      if (!outputs.insert(leaf.name()).second) {
        return Violation(absl::StrCat("accepted output '", leaf.name(), "' of frame '",
                                      frame.name(), "' twice"));
      }
    }
    for (const auto& v : frame.variants()) {
      if (v.num_outputs() != static_cast<uint32_t>(frame.outputs().leaves_size())) {
        return Violation(absl::StrCat("accepted variant '", v.id(), "' returning ",
                                      v.num_outputs(), " values for ",
                                      frame.outputs().leaves_size(), " output leaves"));
      }
    }
    // What the runtime does next with each frame.
    std::vector<std::string> names;
    for (const auto& p : frame.parameters()) names.push_back(p.name());
    for (const auto& v : frame.variants()) {
      if (!listed.contains(v.package_path())) {
        return Violation(
            absl::StrCat("accepted variant '", v.id(), "' whose package is not listed"));
      }
      absl::StatusOr<GuardProgram> program = GuardProgram::Compile(v, names);
      if (!program.ok() && program.status().code() != absl::StatusCode::kInvalidArgument) {
        return Violation(absl::StrCat("Compile failed with ", program.status().ToString()));
      }
    }
  }
  if (entry == nullptr || entry->variantless_entry_fallback()) {
    return Violation(absl::StrCat("accepted entry frame '", m.entry_frame(), "'"));
  }
  return absl::OkStatus();
}

absl::Status CheckHttp2Ledger(const uint8_t* data, size_t size) {
  using Breach = server::Http2StreamLedger::Breach;
  ByteReader in(data, size);
  const server::Http2StreamLimits limits{in.U8() % 17, in.U8() % 9};
  const uint8_t opening = in.U8();
  const bool send_preface = (opening & 1) == 0;
  // The front's GoAway has written its PING ("goaway!!"): the ledgers watch
  // for the client's acknowledgement.
  const bool expect_ping_ack = (opening & 2) != 0;
  absl::Time now = absl::FromUnixSeconds(1000);
  server::Http2StreamLedger ledger(limits, now);
  server::Http2StreamLedger bytewise(limits, now);
  if (expect_ping_ack) {
    for (auto* l : {&ledger, &bytewise}) l->ExpectPingAck("goaway!!");
  }
  absl::Status status;
  absl::Status bytewise_status;
  auto from_client = [&](absl::string_view bytes) {
    status = ledger.FromClient(bytes, now);
    for (char byte : bytes) bytewise_status = bytewise.FromClient({&byte, 1}, now);
  };
  if (send_preface) from_client(server::testing::kPreface);
  // How far the clock has moved forward in all: the reset budget's refills.
  absl::Duration forward = absl::ZeroDuration();
  const double rate = limits.resets_per_second;
  for (int chunk = 0; chunk < 4096; ++chunk) {
    const uint8_t c = in.U8();
    const absl::string_view bytes = in.Bytes(in.U8());
    if (bytes.empty() && c == 0) break;
    const absl::Duration step = absl::Milliseconds(((c >> 1) - 8) * 50);
    now += step;
    if (step > absl::ZeroDuration()) forward += step;
    const absl::Status before = status;
    const absl::Time opened_before = ledger.last_opened();
    if (c & 1) {
      ledger.FromServer(bytes);
      for (char byte : bytes) bytewise.FromServer({&byte, 1});
    } else {
      from_client(bytes);
    }
    const std::string at = absl::StrCat(" (after chunk ", chunk, ")");
    if (!before.ok() && status != before) {
      return Violation(absl::StrCat("a refusal changed from '", before.ToString(), "' to '",
                                    status.ToString(), "'", at));
    }
    if (status.ok() != (ledger.breach() == Breach::kNone)) {
      return Violation(absl::StrCat("status '", status.ToString(), "' with breach ",
                                    static_cast<int>(ledger.breach()), at));
    }
    if (!status.ok()) {
      const absl::StatusCode expected = ledger.breach() == Breach::kNotHttp2
                                            ? absl::StatusCode::kInvalidArgument
                                            : absl::StatusCode::kResourceExhausted;
      if (status.code() != expected || status.message().empty()) {
        return Violation(absl::StrCat("refusal '", status.ToString(), "' for breach ",
                                      static_cast<int>(ledger.breach()), at));
      }
    }
    // Once closed, the server's frames may still end streams.
    const int max_streams = before.ok() ? limits.max_open_streams : 0;
    if (max_streams > 0 && ledger.open_streams() > max_streams &&
        !(ledger.breach() == Breach::kStreams && ledger.open_streams() == max_streams + 1)) {
      return Violation(absl::StrCat(ledger.open_streams(), " streams open against a bound of ",
                                    max_streams, at));
    }
    if (before.ok() && ledger.breach() == Breach::kStreams &&
        ledger.open_streams() != max_streams + 1) {
      return Violation(
          absl::StrCat("closed for streams with ", ledger.open_streams(), " open", at));
    }
    if (rate > 0) {
      const double budget = 2 * rate + rate * absl::ToDoubleSeconds(forward);
      // The reset that breaches is counted too.
      const double allowed = ledger.breach() == Breach::kResets ? budget + 1 : budget;
      if (static_cast<double>(ledger.resets()) > allowed + 1e-6) {
        return Violation(
            absl::StrCat(ledger.resets(), " resets allowed within a budget of ", budget, at));
      }
      if (ledger.breach() == Breach::kResets && ledger.resets() <= 2 * rate) {
        return Violation(absl::StrCat("closed for resets after only ", ledger.resets(),
                                      ", within the burst of ", 2 * rate, at));
      }
    }
    if (ledger.last_opened() != opened_before && ledger.last_opened() != now) {
      return Violation(absl::StrCat("last_opened moved to another time than the chunk's", at));
    }
    if (ledger.ping_acked() && !expect_ping_ack) {
      return Violation(absl::StrCat("a PING acknowledged that nobody waited for", at));
    }
    if (status.code() != bytewise_status.code() || ledger.breach() != bytewise.breach() ||
        ledger.open_streams() != bytewise.open_streams() || ledger.resets() != bytewise.resets() ||
        ledger.last_opened() != bytewise.last_opened() ||
        ledger.ping_acked() != bytewise.ping_acked() ||
        ledger.ServerBetweenFrames() != bytewise.ServerBetweenFrames()) {
      return Violation(absl::StrCat(
          "fed a byte at a time, the ledger reads otherwise: ", bytewise.open_streams(),
          " streams open against ", ledger.open_streams(), ", ", bytewise.resets(),
          " resets against ", ledger.resets(), ", breach ", static_cast<int>(bytewise.breach()),
          " against ", static_cast<int>(ledger.breach()), ", PING acknowledged ",
          bytewise.ping_acked(), " against ", ledger.ping_acked(), ", between the server's frames ",
          bytewise.ServerBetweenFrames(), " against ", ledger.ServerBetweenFrames(), at));
    }
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
