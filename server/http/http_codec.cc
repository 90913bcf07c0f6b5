#include "server/http/http_codec.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/half_float.h"
#include "base/json_text.h"
#include "base/log_text.h"
#include "runtime/dtype.h"
#include "server/api/tensor_codec.h"

namespace precompile::server {
namespace {

absl::Status Invalid(absl::string_view what) { return absl::InvalidArgumentError(what); }

// Refuses members of `object` other than `known`: a misspelt key would
// otherwise be ignored silently.
absl::Status OnlyKnownKeys(const Json& object, std::initializer_list<const char*> known,
                           absl::string_view where) {
  for (const auto& item : object.items()) {
    const std::string& key = item.key();
    if (std::none_of(known.begin(), known.end(), [&key](const char* k) { return key == k; })) {
      return Invalid(absl::StrCat(where, " has an unknown member \"", key, "\" (known: ",
                                  absl::StrJoin(known, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<inference::InferParameter> ParameterOf(const std::string& key, const Json& v,
                                                      absl::string_view where) {
  inference::InferParameter p;
  if (v.is_boolean()) {
    p.set_bool_param(v.get<bool>());
  } else if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      p.set_uint64_param(u);
    } else {
      p.set_int64_param(static_cast<int64_t>(u));
    }
  } else if (v.is_number_integer()) {
    p.set_int64_param(v.get<int64_t>());
  } else if (v.is_number_float()) {
    p.set_double_param(v.get<double>());
  } else if (v.is_string()) {
    p.set_string_param(v.get<std::string>());
  } else {
    return Invalid(absl::StrCat(where, ": parameter \"", key,
                                "\" must be a bool, a number or a string"));
  }
  return p;
}

absl::Status DecodeParameters(const Json& json, absl::string_view where,
                              google::protobuf::Map<std::string, inference::InferParameter>* out) {
  if (!json.is_object()) return Invalid(absl::StrCat(where, ": \"parameters\" must be an object"));
  for (const auto& [key, value] : json.items()) {
    absl::StatusOr<inference::InferParameter> p = ParameterOf(key, value, where);
    if (!p.ok()) return p.status();
    (*out)[key] = *std::move(p);
  }
  return absl::OkStatus();
}

// The number of leaves of a (possibly nested) JSON array; a leaf is any
// value that is not an array.
uint64_t LeafCount(const Json& data) {
  if (!data.is_array()) return 1;
  uint64_t n = 0;
  for (const Json& item : data) n += LeafCount(item);
  return n;
}

// Appends each leaf of `data` to `*out` as a value of `dtype`.
class LeafWriter {
 public:
  LeafWriter(DType dtype, std::string input, std::string* out)
      : dtype_(dtype), input_(std::move(input)), out_(out) {}

  absl::Status Write(const Json& data) {
    if (data.is_array()) {
      for (const Json& item : data) {
        if (absl::Status s = Write(item); !s.ok()) return s;
      }
      return absl::OkStatus();
    }
    absl::Status s = WriteLeaf(data);
    ++index_;
    return s;
  }

 private:
  template <typename T>
  void Put(T value) {
    out_->append(reinterpret_cast<const char*>(&value), sizeof(T));
  }

  absl::Status Bad(const Json& v, absl::string_view why) const {
    return Invalid(absl::StrCat("input '", input_, "': value ", DumpJson(v, false),
                                " at index ", index_, " ", why));
  }

  template <typename T>
  absl::Status PutInteger(const Json& v) {
    if (!v.is_number_integer()) return Bad(v, absl::StrCat("is not an integer (", DatatypeOf(dtype_), ")"));
    bool fits;
    int64_t i = 0;
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      fits = u <= static_cast<uint64_t>(std::numeric_limits<T>::max());
      i = static_cast<int64_t>(std::min<uint64_t>(u, std::numeric_limits<int64_t>::max()));
    } else {
      i = v.get<int64_t>();
      fits = i >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
             i <= static_cast<int64_t>(std::numeric_limits<T>::max());
    }
    if (!fits) return Bad(v, absl::StrCat("does not fit ", DatatypeOf(dtype_)));
    Put(static_cast<T>(i));
    return absl::OkStatus();
  }

  // A float from a number or from "NaN", "Infinity", "-Infinity".
  absl::StatusOr<double> Floating(const Json& v) const {
    if (v.is_number()) return v.get<double>();
    if (v.is_string()) {
      const std::string& s = v.get_ref<const std::string&>();
      if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
      if (s == "Infinity") return std::numeric_limits<double>::infinity();
      if (s == "-Infinity") return -std::numeric_limits<double>::infinity();
    }
    return Bad(v, absl::StrCat("is not a number (", DatatypeOf(dtype_), ")"));
  }

  absl::Status WriteLeaf(const Json& v) {
    switch (dtype_) {
      case DType::kBool:
        if (!v.is_boolean()) return Bad(v, "is not true or false (BOOL)");
        Put<uint8_t>(v.get<bool>() ? 1 : 0);
        return absl::OkStatus();
      case DType::kUInt8: return PutInteger<uint8_t>(v);
      case DType::kInt8: return PutInteger<int8_t>(v);
      case DType::kInt16: return PutInteger<int16_t>(v);
      case DType::kInt32: return PutInteger<int32_t>(v);
      case DType::kInt64: return PutInteger<int64_t>(v);
      case DType::kFloat64: {
        absl::StatusOr<double> d = Floating(v);
        if (!d.ok()) return d.status();
        Put(*d);
        return absl::OkStatus();
      }
      case DType::kFloat32:
      case DType::kFloat16:
      case DType::kBFloat16: {
        absl::StatusOr<double> d = Floating(v);
        if (!d.ok()) return d.status();
        // Rounded to nearest: the shortest text of the largest float reads
        // back as a double a little above it.
        const float f = static_cast<float>(*d);
        if (std::isfinite(*d) && !std::isfinite(f)) {
          return Bad(v, absl::StrCat("does not fit ", DatatypeOf(dtype_)));
        }
        if (dtype_ == DType::kFloat32) {
          Put(f);
        } else {
          const uint16_t bits = dtype_ == DType::kFloat16 ? FloatToHalf(f) : FloatToBFloat16(f);
          if (std::isfinite(f) && (bits & 0x7fff) == (dtype_ == DType::kFloat16 ? 0x7c00 : 0x7f80)) {
            return Bad(v, absl::StrCat("does not fit ", DatatypeOf(dtype_)));
          }
          Put(bits);
        }
        return absl::OkStatus();
      }
    }
    return Bad(v, "has an unknown datatype");
  }

  const DType dtype_;
  const std::string input_;
  std::string* out_;
  uint64_t index_ = 0;
};

absl::StatusOr<std::vector<int64_t>> ShapeOf(const Json& json, const std::string& input) {
  if (!json.is_array()) {
    return Invalid(absl::StrCat("input '", input, "': \"shape\" must be an array of integers"));
  }
  std::vector<int64_t> shape;
  for (const Json& d : json) {
    if (!d.is_number_integer() ||
        (d.is_number_unsigned() &&
         d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))) {
      return Invalid(absl::StrCat("input '", input, "': \"shape\" must be an array of integers, not ",
                                  DumpJson(json, false)));
    }
    shape.push_back(d.get<int64_t>());
  }
  return shape;
}

// Values of the request's JSON outside the inputs' "data": names, shapes,
// parameters, outputs. A parsed value costs many times its text (a tree node
// of 16 bytes and more for "1,"), so they are counted.
constexpr int64_t kMaxValuesOutsideData = 100000;
// Values of one input's "data" kept as JSON because its "datatype" or
// "shape" came after it (every client library sends them first).
constexpr uint64_t kMaxKeptValues = uint64_t{1} << 20;

// An input's "data" array as the parse met it.
struct DataValues {
  uint64_t count = 0;
  // With a writer, the values were written as they streamed by (the
  // input's datatype and shape came first): the first `numel` of them, raw,
  // in `bytes`. Without one, they are kept as JSON, flattened.
  std::unique_ptr<LeafWriter> writer;
  uint64_t numel = 0;
  std::string bytes;
  Json kept = Json::array();
};

// nlohmann keeps the text read since the last number, string or literal,
// for its error messages: a run of nothing but brackets, commas and blanks
// costs up to three times its length while that buffer grows. No request
// needs a long one.
constexpr size_t kMaxStructuralRun = 64 << 10;

absl::Status CheckStructuralRuns(absl::string_view json) {
  size_t run = 0;
  for (const char c : json) {
    switch (c) {
      case '[': case ']': case '{': case '}': case ',': case ':':
      case ' ': case '\t': case '\r': case '\n':
        if (++run > kMaxStructuralRun) {
          return Invalid(absl::StrCat("the request's JSON has more than ", kMaxStructuralRun,
                                      " bytes of brackets, commas and blanks in a row"));
        }
        break;
      default: run = 0;
    }
  }
  return absl::OkStatus();
}

// Parses an inference request's JSON into a tree, except for the inputs'
// "data" arrays: each value there is written into its tensor's bytes as it
// streams by, so that a request costs the memory of its tensors, not of a
// tree many times its text. An array of arrays adds nothing either. The same
// checks as ParseJson (duplicate keys, nesting), and the counts above.
// Members are appended without nlohmann's search for the key, which costs
// time in the square of an object's size: duplicates are refused already.
class InferJsonParser final : public nlohmann::json_sax<Json> {
 public:
  absl::StatusOr<Json> Parse(absl::string_view text) {
    bool parsed = false;
    try {
      parsed = Json::sax_parse(text.begin(), text.end(), this);
    } catch (const nlohmann::json::exception& e) {
      if (refused_.ok()) refused_ = Invalid(JsonParseErrorText(e));
    }
    if (!refused_.ok()) return refused_;
    if (!parsed) return Invalid("invalid JSON");
    return std::move(root_);
  }

  // The "data" array of input `index`, if it had one.
  DataValues* data(size_t index) {
    auto it = data_.find(static_cast<int>(index));
    return it == data_.end() ? nullptr : &it->second;
  }

  bool null() override { return Value(Json(nullptr)); }
  bool boolean(bool value) override { return Value(Json(value)); }
  bool number_integer(number_integer_t value) override { return Value(Json(value)); }
  bool number_unsigned(number_unsigned_t value) override { return Value(Json(value)); }
  bool number_float(number_float_t value, const string_t&) override { return Value(Json(value)); }
  bool string(string_t& value) override { return Value(Json(std::move(value))); }
  bool binary(binary_t&) override { return Refuse(Invalid("invalid JSON: binary values")); }
  bool start_object(std::size_t) override { return Start(/*object=*/true); }
  bool end_object() override { return End(); }
  bool start_array(std::size_t) override { return Start(/*object=*/false); }
  bool end_array() override { return End(); }
  bool key(string_t& key) override {
    Frame& frame = stack_.back();
    frame.key = key;
    if (!frame.keys.insert(key).second) {
      return Refuse(Invalid(absl::StrCat("invalid JSON: the key \"", key,
                                         "\" is given twice in one object")));
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&,
                   const nlohmann::detail::exception& e) override {
    return Refuse(Invalid(JsonParseErrorText(e)));
  }

 private:
  enum class Role { kRoot, kInputs, kInput, kShape, kData, kDataNested, kOther };
  struct Frame {
    Role role;
    int input = -1;
    Json* container = nullptr;   // null in "data"
    std::string key;             // an object's: the member being read
    std::set<std::string> keys;  // an object's: those read
    int children = 0;            // the inputs array's: inputs so far
  };
  // What the parse knows of an input when its "data" starts.
  struct InputSoFar {
    std::string name;
    std::optional<std::string> datatype;
    std::vector<int64_t> shape;
    bool shape_ok = false;
  };

  bool Refuse(absl::Status status) {
    if (refused_.ok()) refused_ = std::move(status);
    return false;
  }

  bool InData() const {
    return !stack_.empty() &&
           (stack_.back().role == Role::kData || stack_.back().role == Role::kDataNested);
  }

  bool CountOutsideData() {
    if (++outside_data_ <= kMaxValuesOutsideData) return true;
    return Refuse(Invalid(absl::StrCat(
        "the request's JSON has more than ", kMaxValuesOutsideData,
        " values outside the inputs' \"data\" (names, shapes, parameters, outputs)")));
  }

  // Adds `value` to the innermost container (which is not in "data").
  Json* Insert(Json value) {
    Frame& frame = stack_.back();
    if (frame.container->is_array()) {
      auto& array = frame.container->get_ref<Json::array_t&>();
      array.push_back(std::move(value));
      return &array.back();
    }
    // ordered_map is a vector of pairs: append, as the key is new.
    auto& members = static_cast<std::vector<std::pair<const std::string, Json>>&>(
        frame.container->get_ref<Json::object_t&>());
    members.emplace_back(frame.key, std::move(value));
    return &members.back().second;
  }

  // The role of a container starting now, from where it is.
  Role RoleOfNew(bool object) {
    if (stack_.empty()) return object ? Role::kRoot : Role::kOther;
    const Frame& parent = stack_.back();
    switch (parent.role) {
      case Role::kRoot: return !object && parent.key == "inputs" ? Role::kInputs : Role::kOther;
      case Role::kInputs: return object ? Role::kInput : Role::kOther;
      case Role::kInput:
        if (!object && parent.key == "shape") return Role::kShape;
        if (!object && parent.key == "data") return Role::kData;
        return Role::kOther;
      case Role::kShape: inputs_[parent.input].shape_ok = false; return Role::kOther;
      case Role::kData:
      case Role::kDataNested: return Role::kDataNested;
      case Role::kOther: return Role::kOther;
    }
    return Role::kOther;
  }

  std::string InputName(int input) {
    const std::string& name = inputs_[input].name;
    return name.empty() ? absl::StrCat("inputs[", input, "]") : name;
  }

  bool Start(bool object) {
    if (stack_.size() >= static_cast<size_t>(kMaxJsonDepth)) {
      return Refuse(Invalid(absl::StrCat("invalid JSON: nested more than ", kMaxJsonDepth, " deep")));
    }
    if (object && InData()) {
      const int input = stack_.back().input;
      return Refuse(Invalid(absl::StrCat("input '", InputName(input), "': value at index ",
                                         data_[input].count,
                                         " is an object; \"data\" holds values and arrays of them")));
    }
    Frame frame{RoleOfNew(object)};
    frame.input = stack_.empty() ? -1 : stack_.back().input;
    if (frame.role == Role::kInput) frame.input = stack_.back().children++;
    if (frame.role == Role::kShape) {
      inputs_[frame.input].shape.clear();
      inputs_[frame.input].shape_ok = true;
    }
    if (frame.role == Role::kData) StartData(frame.input);
    if (frame.role != Role::kData && frame.role != Role::kDataNested) {
      if (!CountOutsideData()) return false;
      Json container = object ? Json::object() : Json::array();
      if (stack_.empty()) {
        root_ = std::move(container);
        frame.container = &root_;
      } else {
        frame.container = Insert(std::move(container));
      }
    } else if (frame.role == Role::kData) {
      // Where the values were: present, and decoded from data_.
      Insert(Json::array());
    }
    stack_.push_back(std::move(frame));
    return true;
  }

  bool End() {
    stack_.pop_back();
    return true;
  }

  bool Value(Json value) {
    if (stack_.empty()) {
      root_ = std::move(value);
      return true;
    }
    if (InData()) return AddDataValue(stack_.back().input, value);
    if (!CountOutsideData()) return false;
    const Frame& frame = stack_.back();
    if (frame.role == Role::kInput && value.is_string()) {
      if (frame.key == "name") inputs_[frame.input].name = value.get<std::string>();
      if (frame.key == "datatype") inputs_[frame.input].datatype = value.get<std::string>();
    } else if (frame.role == Role::kShape) {
      InputSoFar& input = inputs_[frame.input];
      if (value.is_number_integer() &&
          !(value.is_number_unsigned() &&
            value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))) {
        input.shape.push_back(value.get<int64_t>());
      } else {
        input.shape_ok = false;
      }
    }
    Insert(std::move(value));
    return true;
  }

  // Typed when the input's datatype and shape are known and good; kept as
  // JSON otherwise (decoding refuses it later, naming why, or writes it).
  void StartData(int input) {
    DataValues& data = data_[input];
    const InputSoFar& so_far = inputs_[input];
    std::optional<DType> dtype;
    if (so_far.datatype) dtype = DTypeFromDatatype(*so_far.datatype);
    if (!dtype || !so_far.shape_ok) return;
    const std::string name = InputName(input);
    absl::StatusOr<uint64_t> numel =
        ElementCount(so_far.shape, DTypeSize(*dtype), absl::StrCat("input '", name, "'"));
    if (!numel.ok()) return;
    data.numel = *numel;
    data.writer = std::make_unique<LeafWriter>(*dtype, name, &data.bytes);
  }

  bool AddDataValue(int input, const Json& value) {
    DataValues& data = data_[input];
    ++data.count;
    if (data.writer != nullptr) {
      // Past the shape's count, values are only counted: the error says how
      // many there were.
      if (data.count > data.numel) return true;
      if (absl::Status s = data.writer->Write(value); !s.ok()) return Refuse(s);
      return true;
    }
    if (data.kept.size() >= kMaxKeptValues) {
      return Refuse(Invalid(absl::StrCat(
          "input '", InputName(input), "' has more than ", kMaxKeptValues,
          " values in \"data\" before its \"datatype\" and \"shape\": send those first")));
    }
    data.kept.push_back(value);
    return true;
  }

  Json root_;
  std::vector<Frame> stack_;
  std::map<int, InputSoFar> inputs_;
  std::map<int, DataValues> data_;
  int64_t outside_data_ = 0;
  absl::Status refused_;
};

// One input's fields, checked; its values are written after every input's
// byte count is known.
struct PendingInput {
  const Json* data = nullptr;      // JSON values (a value, or an array read
  DataValues* values = nullptr;    // into these), or
  std::optional<uint64_t> binary;  // this many bytes of binary data.
  DType dtype = DType::kFloat32;
  uint64_t numel = 0;
};

absl::StatusOr<PendingInput> DecodeInputHeader(const Json& json, int index, DataValues* values,
                                               inference::ModelInferRequest* request) {
  const std::string where = absl::StrCat("inputs[", index, "]");
  if (!json.is_object()) return Invalid(absl::StrCat(where, " must be an object"));
  if (absl::Status s = OnlyKnownKeys(json, {"name", "shape", "datatype", "parameters", "data"}, where);
      !s.ok()) {
    return s;
  }
  const Json* name = JsonMember(json, "name");
  if (name == nullptr || !name->is_string()) {
    return Invalid(absl::StrCat(where, " needs a \"name\" (a string)"));
  }
  inference::ModelInferRequest::InferInputTensor* input = request->add_inputs();
  input->set_name(name->get<std::string>());
  const std::string& input_name = input->name();
  const Json* datatype = JsonMember(json, "datatype");
  if (datatype == nullptr || !datatype->is_string()) {
    return Invalid(absl::StrCat("input '", input_name, "' needs a \"datatype\" (a string)"));
  }
  input->set_datatype(datatype->get<std::string>());
  PendingInput pending;
  std::optional<DType> dtype = DTypeFromDatatype(input->datatype());
  if (!dtype) {
    return Invalid(absl::StrCat("input '", input_name, "' has datatype '", input->datatype(),
                                "', which is not one of BOOL, UINT8, INT8, INT16, INT32, INT64, "
                                "FP16, BF16, FP32, FP64"));
  }
  pending.dtype = *dtype;
  const Json* shape_json = JsonMember(json, "shape");
  if (shape_json == nullptr) return Invalid(absl::StrCat("input '", input_name, "' needs a \"shape\""));
  absl::StatusOr<std::vector<int64_t>> shape = ShapeOf(*shape_json, input_name);
  if (!shape.ok()) return shape.status();
  for (int64_t d : *shape) input->add_shape(d);
  absl::StatusOr<uint64_t> numel =
      ElementCount(*shape, DTypeSize(*dtype), absl::StrCat("input '", input_name, "'"));
  if (!numel.ok()) return numel.status();
  pending.numel = *numel;

  if (const Json* params = JsonMember(json, "parameters")) {
    if (absl::Status s = DecodeParameters(*params, absl::StrCat("input '", input_name, "'"),
                                          input->mutable_parameters());
        !s.ok()) {
      return s;
    }
    auto it = input->parameters().find("binary_data_size");
    if (it != input->parameters().end()) {
      if (it->second.parameter_choice_case() != inference::InferParameter::kInt64Param ||
          it->second.int64_param() < 0) {
        return Invalid(absl::StrCat("input '", input_name,
                                    "': \"binary_data_size\" must be a non-negative integer"));
      }
      pending.binary = static_cast<uint64_t>(it->second.int64_param());
    }
  }
  pending.data = JsonMember(json, "data");
  if (pending.binary && pending.data) {
    return Invalid(absl::StrCat("input '", input_name,
                                "' has both \"data\" and binary data (binary_data_size)"));
  }
  if (!pending.binary && !pending.data) {
    return Invalid(absl::StrCat("input '", input_name,
                                "' has no \"data\" and no binary_data_size parameter"));
  }
  if (pending.data) {
    if (pending.data->is_array()) pending.values = values;
    const uint64_t count = pending.values ? pending.values->count : LeafCount(*pending.data);
    if (count != pending.numel) {
      return Invalid(absl::StrCat("input '", input_name, "' has ", count, " values but shape [",
                                  absl::StrJoin(*shape, ", "), "] needs ", pending.numel));
    }
  } else if (*pending.binary != pending.numel * DTypeSize(*dtype)) {
    return Invalid(absl::StrCat("input '", input_name, "' has binary_data_size ", *pending.binary,
                                " but shape [", absl::StrJoin(*shape, ", "), "] of ",
                                input->datatype(), " needs ", pending.numel * DTypeSize(*dtype),
                                " bytes"));
  }
  return pending;
}

absl::Status DecodeOutputs(const Json& json, inference::ModelInferRequest* request) {
  if (!json.is_array()) return Invalid("\"outputs\" must be an array");
  int index = 0;
  for (const Json& out : json) {
    const std::string where = absl::StrCat("outputs[", index++, "]");
    if (!out.is_object()) return Invalid(absl::StrCat(where, " must be an object"));
    if (absl::Status s = OnlyKnownKeys(out, {"name", "parameters"}, where); !s.ok()) return s;
    const Json* name = JsonMember(out, "name");
    if (name == nullptr || !name->is_string()) {
      return Invalid(absl::StrCat(where, " needs a \"name\" (a string)"));
    }
    auto* output = request->add_outputs();
    output->set_name(name->get<std::string>());
    if (const Json* params = JsonMember(out, "parameters")) {
      if (absl::Status s = DecodeParameters(*params, absl::StrCat("output '", output->name(), "'"),
                                            output->mutable_parameters());
          !s.ok()) {
        return s;
      }
      if (output->parameters().contains("classification")) {
        return Invalid(absl::StrCat("output '", output->name(),
                                    "': the classification extension is not supported"));
      }
    }
  }
  return absl::OkStatus();
}

bool WantsBinary(const inference::ModelInferRequest& request, const std::string& output) {
  auto flag = [](const google::protobuf::Map<std::string, inference::InferParameter>& params,
                 const char* key) -> std::optional<bool> {
    auto it = params.find(key);
    if (it == params.end() ||
        it->second.parameter_choice_case() != inference::InferParameter::kBoolParam) {
      return std::nullopt;
    }
    return it->second.bool_param();
  };
  for (const auto& out : request.outputs()) {
    if (out.name() != output) continue;
    if (std::optional<bool> b = flag(out.parameters(), "binary_data")) return *b;
  }
  return flag(request.parameters(), "binary_data_output").value_or(false);
}

template <typename T>
T Load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// The shortest decimal that reads back as `value` (0.1f is 0.1, not
// 0.100000001), as a JSON number.
Json FloatJson(float value) {
  if (!std::isfinite(value)) return JsonDouble(value);
  char text[32];
  const std::to_chars_result printed = std::to_chars(text, text + sizeof(text), value);
  double shortest = value;
  std::from_chars(text, printed.ptr, shortest);
  return shortest;
}

// The values of `tensor` as a flat JSON array.
Json ValuesJson(const OutputTensor& tensor) {
  Json values = Json::array();
  const char* p = static_cast<const char*>(tensor.data);
  const size_t size = DTypeSize(tensor.dtype);
  const size_t n = size == 0 ? 0 : tensor.nbytes / size;
  auto& array = values.get_ref<Json::array_t&>();
  array.reserve(n);
  for (size_t i = 0; i < n; ++i, p += size) {
    switch (tensor.dtype) {
      case DType::kBool: array.emplace_back(Load<uint8_t>(p) != 0); break;
      case DType::kUInt8: array.emplace_back(Load<uint8_t>(p)); break;
      case DType::kInt8: array.emplace_back(Load<int8_t>(p)); break;
      case DType::kInt16: array.emplace_back(Load<int16_t>(p)); break;
      case DType::kInt32: array.emplace_back(Load<int32_t>(p)); break;
      case DType::kInt64: array.emplace_back(Load<int64_t>(p)); break;
      case DType::kFloat16: array.push_back(JsonDouble(HalfToFloat(Load<uint16_t>(p)), 5)); break;
      case DType::kBFloat16:
        array.push_back(JsonDouble(BFloat16ToFloat(Load<uint16_t>(p)), 4));
        break;
      case DType::kFloat32: array.push_back(FloatJson(Load<float>(p))); break;
      case DType::kFloat64: array.push_back(JsonDouble(Load<double>(p), 17)); break;
    }
  }
  return values;
}

Json ParameterJson(const inference::InferParameter& p) {
  switch (p.parameter_choice_case()) {
    case inference::InferParameter::kBoolParam: return p.bool_param();
    case inference::InferParameter::kInt64Param: return p.int64_param();
    case inference::InferParameter::kUint64Param: return p.uint64_param();
    case inference::InferParameter::kDoubleParam: return JsonDouble(p.double_param());
    case inference::InferParameter::kStringParam: return p.string_param();
    default: return nullptr;
  }
}

Json ParametersJson(const google::protobuf::Map<std::string, inference::InferParameter>& params) {
  // Sorted, so that the same response prints the same bytes.
  std::map<std::string, const inference::InferParameter*> sorted;
  for (const auto& [key, value] : params) sorted[key] = &value;
  Json json = Json::object();
  for (const auto& [key, value] : sorted) json[key] = ParameterJson(*value);
  return json;
}

}  // namespace

int HttpStatusOf(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk: return 200;
    case absl::StatusCode::kCancelled: return 499;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange: return 400;
    case absl::StatusCode::kDeadlineExceeded: return 504;
    case absl::StatusCode::kNotFound: return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted: return 409;
    case absl::StatusCode::kPermissionDenied: return 403;
    case absl::StatusCode::kUnauthenticated: return 401;
    case absl::StatusCode::kResourceExhausted: return 429;
    case absl::StatusCode::kUnimplemented: return 501;
    case absl::StatusCode::kUnavailable: return 503;
    default: return 500;
  }
}

std::string ErrorBody(absl::string_view message) {
  Json body = Json::object();
  body["error"] = ClientMessage(message);
  return DumpJson(body, /*pretty=*/false);
}

absl::StatusOr<size_t> ParseHeaderLength(absl::string_view value, size_t body_size) {
  uint64_t n = 0;
  if (value.empty() || !std::all_of(value.begin(), value.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(value, &n)) {
    return Invalid(absl::StrCat("the Inference-Header-Content-Length header must be a byte "
                                "count, not \"", value, "\""));
  }
  if (n > body_size) {
    return Invalid(absl::StrCat("the Inference-Header-Content-Length header says ", n,
                                " bytes of JSON but the body has ", body_size));
  }
  return static_cast<size_t>(n);
}

absl::Status DecodeInferRequest(absl::string_view body, std::optional<size_t> header_length,
                                const std::string& model, const std::string& version,
                                inference::ModelInferRequest* request) {
  const absl::string_view header = header_length ? body.substr(0, *header_length) : body;
  const absl::string_view binary =
      header_length ? body.substr(*header_length) : absl::string_view();
  if (absl::Status s = CheckStructuralRuns(header); !s.ok()) return s;
  InferJsonParser parser;
  absl::StatusOr<Json> parsed = parser.Parse(header);
  if (!parsed.ok()) return parsed.status();
  const Json& json = *parsed;
  if (!json.is_object()) return Invalid("the request must be a JSON object");
  if (absl::Status s = OnlyKnownKeys(json, {"id", "parameters", "inputs", "outputs"}, "the request");
      !s.ok()) {
    return s;
  }
  request->set_model_name(model);
  request->set_model_version(version);
  if (const Json* id = JsonMember(json, "id")) {
    if (!id->is_string()) return Invalid("\"id\" must be a string");
    request->set_id(id->get<std::string>());
  }
  if (const Json* params = JsonMember(json, "parameters")) {
    if (absl::Status s = DecodeParameters(*params, "the request", request->mutable_parameters());
        !s.ok()) {
      return s;
    }
  }
  const Json* inputs = JsonMember(json, "inputs");
  if (inputs == nullptr || !inputs->is_array()) {
    return Invalid("the request needs \"inputs\" (an array)");
  }
  std::vector<PendingInput> pending;
  uint64_t binary_total = 0;
  for (size_t i = 0; i < inputs->size(); ++i) {
    absl::StatusOr<PendingInput> input =
        DecodeInputHeader((*inputs)[i], static_cast<int>(i), parser.data(i), request);
    if (!input.ok()) return input.status();
    // Compared before it is added: sizes near 2^64 would wrap the sum.
    if (input->binary && *input->binary > binary.size() - binary_total) {
      return Invalid(absl::StrCat("input '", request->inputs(static_cast<int>(i)).name(),
                                  "' has binary_data_size ", *input->binary, ", but only ",
                                  binary.size() - binary_total,
                                  " bytes of binary data follow the JSON for it "
                                  "(Inference-Header-Content-Length)"));
    }
    if (input->binary) binary_total += *input->binary;
    pending.push_back(*input);
  }
  if (binary_total != binary.size()) {
    return Invalid(absl::StrCat("the inputs' binary_data_size add up to ", binary_total,
                                " bytes but ", binary.size(),
                                " bytes follow the JSON (Inference-Header-Content-Length)"));
  }
  if (const Json* outputs = JsonMember(json, "outputs")) {
    if (absl::Status s = DecodeOutputs(*outputs, request); !s.ok()) return s;
  }
  // Every size agrees: now the bytes.
  size_t offset = 0;
  for (size_t i = 0; i < pending.size(); ++i) {
    std::string* raw = request->add_raw_input_contents();
    if (pending[i].binary) {
      raw->assign(binary.data() + offset, *pending[i].binary);
      offset += *pending[i].binary;
      continue;
    }
    DataValues* values = pending[i].values;
    if (values != nullptr && values->writer != nullptr) {
      *raw = std::move(values->bytes);
      continue;
    }
    raw->reserve(pending[i].numel * DTypeSize(pending[i].dtype));
    LeafWriter writer(pending[i].dtype, request->inputs(static_cast<int>(i)).name(), raw);
    if (absl::Status s = writer.Write(values ? values->kept : *pending[i].data); !s.ok()) return s;
  }
  return absl::OkStatus();
}

HttpInferResponse EncodeInferResponse(const inference::ModelInferRequest& request,
                                      const inference::ModelInferResponse& response,
                                      const std::vector<OutputTensor>& outputs) {
  Json json = Json::object();
  json["model_name"] = response.model_name();
  json["model_version"] = response.model_version();
  if (!response.id().empty()) json["id"] = response.id();
  json["parameters"] = ParametersJson(response.parameters());
  Json& outs = json["outputs"] = Json::array();
  absl::Cord binary;
  for (int i = 0; i < response.outputs_size() && i < static_cast<int>(outputs.size()); ++i) {
    const auto& described = response.outputs(i);
    const OutputTensor& tensor = outputs[i];
    Json out = Json::object();
    out["name"] = described.name();
    out["datatype"] = described.datatype();
    out["shape"] = Json::array();
    for (int64_t d : described.shape()) out["shape"].push_back(d);
    if (WantsBinary(request, described.name())) {
      out["parameters"] = Json::object();
      out["parameters"]["binary_data_size"] = tensor.nbytes;
      const absl::string_view bytes(static_cast<const char*>(tensor.data), tensor.nbytes);
      if (SentFromTensor(tensor)) {
        binary.Append(absl::MakeCordFromExternal(bytes, [owner = tensor.owner] {}));
      } else {
        binary.Append(bytes);
      }
    } else {
      out["data"] = ValuesJson(tensor);
    }
    outs.push_back(std::move(out));
  }
  HttpInferResponse encoded;
  encoded.body = absl::Cord(DumpJson(json, /*pretty=*/false));
  if (!binary.empty() || std::any_of(response.outputs().begin(), response.outputs().end(),
                                     [&](const auto& o) { return WantsBinary(request, o.name()); })) {
    encoded.header_length = encoded.body.size();
    encoded.body.Append(std::move(binary));
  }
  return encoded;
}

}  // namespace precompile::server
