#include "client/npy.h"

#include <bit>
#include <cctype>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace precompile::client {
namespace {

static_assert(std::endian::native == std::endian::little,
              "tensor bytes are little-endian on the wire; this client assumes a "
              "little-endian host");

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;

struct Kind {
  const char* datatype;
  char kind;  // numpy's kind character
  int size;
};

constexpr Kind kKinds[] = {
    {"BOOL", 'b', 1},   {"UINT8", 'u', 1}, {"UINT16", 'u', 2}, {"UINT32", 'u', 4},
    {"UINT64", 'u', 8}, {"INT8", 'i', 1},  {"INT16", 'i', 2},  {"INT32", 'i', 4},
    {"INT64", 'i', 8},  {"FP16", 'f', 2},  {"FP32", 'f', 4},   {"FP64", 'f', 8},
};

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("not a supported .npy file: ", what));
}

// The header is a Python dict literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// Only the three keys numpy writes are understood; this reads exactly that
// subset of Python literal syntax (strings, True/False, tuples of ints).
class HeaderParser {
 public:
  explicit HeaderParser(absl::string_view text) : text_(text) {}

  absl::Status Parse(std::string* descr, bool* fortran_order, std::vector<int64_t>* shape) {
    bool saw_descr = false, saw_order = false, saw_shape = false;
    if (!Consume('{')) return Error("expected '{'");
    while (true) {
      SkipSpace();
      if (Consume('}')) break;
      std::string key;
      RETURN_IF_ERROR(ParseString(&key));
      if (!Consume(':')) return Error("expected ':'");
      if (key == "descr") {
        RETURN_IF_ERROR(ParseString(descr));
        saw_descr = true;
      } else if (key == "fortran_order") {
        RETURN_IF_ERROR(ParseBool(fortran_order));
        saw_order = true;
      } else if (key == "shape") {
        RETURN_IF_ERROR(ParseShape(shape));
        saw_shape = true;
      } else {
        return Error(absl::StrCat("unexpected key '", key, "'"));
      }
      SkipSpace();
      if (!Consume(',')) {
        if (!Consume('}')) return Error("expected ',' or '}'");
        break;
      }
    }
    if (!saw_descr || !saw_order || !saw_shape) {
      return Error("the header needs 'descr', 'fortran_order' and 'shape'");
    }
    return absl::OkStatus();
  }

 private:
  void SkipSpace() {
    while (pos_ < text_.size() && absl::ascii_isspace(static_cast<unsigned char>(text_[pos_]))) {
      ++pos_;
    }
  }
  bool Consume(char c) {
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  absl::Status Error(absl::string_view what) {
    return Invalid(absl::StrCat("header ", what, " at offset ", pos_, " in \"", text_, "\""));
  }
  absl::Status ParseString(std::string* out) {
    SkipSpace();
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) {
      return Error("expected a string");
    }
    const char quote = text_[pos_++];
    const size_t end = text_.find(quote, pos_);
    if (end == absl::string_view::npos) return Error("unterminated string");
    *out = std::string(text_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return absl::OkStatus();
  }
  absl::Status ParseBool(bool* out) {
    SkipSpace();
    for (const auto& [word, value] : {std::pair{"True", true}, std::pair{"False", false}}) {
      if (text_.substr(pos_, std::strlen(word)) == word) {
        pos_ += std::strlen(word);
        *out = value;
        return absl::OkStatus();
      }
    }
    return Error("expected True or False");
  }
  absl::Status ParseShape(std::vector<int64_t>* shape) {
    shape->clear();
    if (!Consume('(')) return Error("expected a tuple");
    while (true) {
      if (Consume(')')) return absl::OkStatus();
      SkipSpace();
      size_t end = pos_;
      while (end < text_.size() && absl::ascii_isdigit(static_cast<unsigned char>(text_[end]))) {
        ++end;
      }
      int64_t d;
      if (!absl::SimpleAtoi(text_.substr(pos_, end - pos_), &d)) {
        return Error("expected a dimension");
      }
      pos_ = end;
      // Files written under Python 2 spell dimensions as longs: "3L".
      if (pos_ < text_.size() && text_[pos_] == 'L') ++pos_;
      shape->push_back(d);
      if (!Consume(',')) {
        if (!Consume(')')) return Error("expected ',' or ')'");
        return absl::OkStatus();
      }
    }
  }

  absl::string_view text_;
  size_t pos_ = 0;
};

uint32_t ReadLittleEndian(absl::string_view bytes) {
  uint32_t value = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    value |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  }
  return value;
}

std::string ShapeTuple(const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return absl::StrCat("(", shape[0], ",)");
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

}  // namespace

absl::StatusOr<std::string> NpyDescrOf(absl::string_view datatype) {
  if (datatype == "BF16") {
    return absl::InvalidArgumentError(
        "BF16 has no .npy dtype (numpy has no bfloat16): convert the tensor to FP32 first, or "
        "read the raw bytes");
  }
  for (const Kind& k : kKinds) {
    if (datatype == k.datatype) {
      return absl::StrCat(k.size == 1 ? "|" : "<", std::string(1, k.kind), k.size);
    }
  }
  RETURN_IF_ERROR(ElementSize(datatype).status());
  return absl::InvalidArgumentError(absl::StrCat("no .npy dtype for ", datatype));
}

absl::StatusOr<std::string> DatatypeOfNpyDescr(absl::string_view descr) {
  if (descr.size() < 2) return Invalid(absl::StrCat("dtype '", descr, "'"));
  char order = descr[0];
  absl::string_view type = descr;
  if (order == '<' || order == '>' || order == '|' || order == '=') {
    type.remove_prefix(1);
  } else {
    order = '=';
  }
  int size = 0;
  if (type.size() < 2 || !absl::SimpleAtoi(type.substr(1), &size)) {
    return Invalid(absl::StrCat("dtype '", descr,
                                "' (structured, object or string arrays cannot be tensors)"));
  }
  for (const Kind& k : kKinds) {
    if (type[0] != k.kind || size != k.size) continue;
    if (order == '>' && size > 1) {
      return Invalid(absl::StrCat("dtype '", descr, "' is big-endian: save it with ",
                                  "arr.astype(arr.dtype.newbyteorder('<'))"));
    }
    return std::string(k.datatype);
  }
  if (type[0] == 'V' && size == 2) {
    return Invalid(absl::StrCat(
        "dtype '", descr,
        "' is raw 2-byte data (how a bfloat16 array looks to numpy); bfloat16 has no .npy "
        "dtype: save it as float32"));
  }
  return Invalid(absl::StrCat("dtype '", descr,
                              "' (supported: bool, uint8/16/32/64, int8/16/32/64, "
                              "float16/32/64)"));
}

absl::StatusOr<Tensor> ParseNpy(absl::string_view bytes) {
  if (bytes.size() < kMagicSize + 4 || bytes.substr(0, kMagicSize) != kMagic) {
    return Invalid("it does not start with \\x93NUMPY");
  }
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t header_start, header_size;
  if (major == 1) {
    header_start = 10;
    header_size = ReadLittleEndian(bytes.substr(8, 2));
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return Invalid("truncated header");
    header_start = 12;
    header_size = ReadLittleEndian(bytes.substr(8, 4));
  } else {
    return Invalid(absl::StrCat("format version ", major, ".",
                                static_cast<int>(static_cast<unsigned char>(bytes[7])),
                                " (known: 1.0, 2.0, 3.0)"));
  }
  if (bytes.size() < header_start + header_size) return Invalid("truncated header");
  std::string descr;
  bool fortran_order = false;
  Tensor tensor;
  HeaderParser parser(bytes.substr(header_start, header_size));
  RETURN_IF_ERROR(parser.Parse(&descr, &fortran_order, &tensor.shape));
  ASSIGN_OR_RETURN(tensor.datatype, DatatypeOfNpyDescr(descr));
  if (fortran_order) {
    // With at most one dimension above 1 both orders have the same bytes.
    int long_dimensions = 0;
    for (int64_t d : tensor.shape) long_dimensions += d > 1;
    if (long_dimensions > 1) {
      return Invalid("Fortran-order array: save np.ascontiguousarray(arr) instead");
    }
  }
  ASSIGN_OR_RETURN(const int64_t count, ElementCount(tensor.shape));
  ASSIGN_OR_RETURN(const int size, ElementSize(tensor.datatype));
  const absl::string_view data = bytes.substr(header_start + header_size);
  if (static_cast<uint64_t>(count) > data.size() / size ||
      static_cast<int64_t>(data.size()) != count * size) {
    return Invalid(absl::StrCat("shape ", ShapeTuple(tensor.shape), " of '", descr, "' needs ",
                                static_cast<uint64_t>(count) * size,
                                " bytes of data, the file has ", data.size()));
  }
  tensor.data = std::string(data);
  return tensor;
}

absl::StatusOr<Tensor> ReadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream contents;
  contents << in.rdbuf();
  absl::StatusOr<Tensor> tensor = ParseNpy(contents.str());
  if (!tensor.ok()) {
    return absl::Status(tensor.status().code(),
                        absl::StrCat(path, ": ", tensor.status().message()));
  }
  return tensor;
}

absl::StatusOr<std::string> SerializeNpy(const Tensor& tensor) {
  ASSIGN_OR_RETURN(const std::string descr, NpyDescrOf(tensor.datatype));
  RETURN_IF_ERROR(ValidateTensor(tensor));
  std::string header =
      absl::StrCat("{'descr': '", descr,
                   "', 'fortran_order': False, 'shape': ", ShapeTuple(tensor.shape), ", }");
  // numpy pads with spaces and a newline so that the data starts on a
  // 64-byte boundary; version 2.0 only when the length needs 4 bytes.
  size_t preamble = kMagicSize + 2 + 2;
  if (header.size() + 1 + 64 > 0xffff) preamble = kMagicSize + 2 + 4;
  const size_t total = (preamble + header.size() + 1 + 63) / 64 * 64;
  header.append(total - preamble - header.size() - 1, ' ');
  header.push_back('\n');
  std::string out(kMagic, kMagicSize);
  out.push_back(preamble == 10 ? 1 : 2);
  out.push_back(0);
  const uint32_t length = static_cast<uint32_t>(header.size());
  for (size_t i = 0; i < preamble - kMagicSize - 2; ++i) {
    out.push_back(static_cast<char>((length >> (8 * i)) & 0xff));
  }
  out += header;
  out += tensor.data;
  return out;
}

absl::Status WriteNpy(const std::string& path, const Tensor& tensor) {
  absl::StatusOr<std::string> bytes = SerializeNpy(tensor);
  if (!bytes.ok()) {
    return absl::Status(bytes.status().code(),
                        absl::StrCat("cannot save ", path, ": ", bytes.status().message()));
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace precompile::client
