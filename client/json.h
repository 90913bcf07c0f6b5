// A small JSON value for the tools' inputs (inline tensors, request mixes)
// and outputs (--json, load reports). Objects keep their members in order,
// so that what the tools print has a stable shape, and numbers keep their
// literal text, so that an INT64 beyond 2^53 survives and "3" (an int) stays
// distinct from "3.0" (a float) when it becomes a request parameter.
//
// Thread safety: a Json is a value; const methods may run concurrently.
#ifndef PRECOMPILE_CLIENT_JSON_H_
#define PRECOMPILE_CLIENT_JSON_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace precompile::client {

class Json {
 public:
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };

  Json() = default;  // null
  static Json Bool(bool value);
  static Json Int(int64_t value);
  static Json Uint(uint64_t value);
  // NaN and the infinities become the strings "NaN", "Infinity" and
  // "-Infinity" (JSON has no literal for them; proto3's JSON does the same).
  static Json Double(double value, int significant_digits = 17);
  static Json String(std::string value);
  static Json Array();
  static Json Object();

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_number() const { return type_ == Type::kNumber; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_array() const { return type_ == Type::kArray; }
  bool is_object() const { return type_ == Type::kObject; }

  // REQUIRES: the matching type.
  bool bool_value() const { return bool_; }
  const std::string& string_value() const { return text_; }
  // A number's literal text ("3", "-1.5e3").
  const std::string& number_text() const { return text_; }

  // A number written without fraction or exponent.
  bool IsIntegerLiteral() const;
  // INVALID_ARGUMENT unless an integer literal that fits.
  absl::StatusOr<int64_t> AsInt64() const;
  absl::StatusOr<uint64_t> AsUint64() const;
  // REQUIRES: is_number().
  double AsDouble() const;

  // Arrays. REQUIRES: is_array().
  const std::vector<Json>& elements() const { return elements_; }
  Json& Append(Json value);

  // Objects. REQUIRES: is_object(). Keys in insertion order.
  const std::vector<std::string>& keys() const { return keys_; }
  const std::vector<Json>& values() const { return elements_; }
  // The member `key`, or null when there is none.
  const Json* Find(absl::string_view key) const;
  // Adds `key`, or replaces its value; returns the value.
  Json& Set(absl::string_view key, Json value);

  // The JSON text. Pretty: two-space indentation, one member per line, and
  // arrays of scalars on one line.
  std::string Dump(bool pretty = true) const;

  // "null", "bool", "number", ... for error messages.
  static const char* TypeName(Type type);

 private:
  void DumpTo(std::string& out, bool pretty, int indent) const;
  friend class JsonParser;

  Type type_ = Type::kNull;
  bool bool_ = false;
  std::string text_;
  std::vector<Json> elements_;  // array elements, or object values
  std::vector<std::string> keys_;
};

// Parses a JSON document (RFC 8259). INVALID_ARGUMENT says where it went
// wrong (line and column).
absl::StatusOr<Json> ParseJson(absl::string_view text);

}  // namespace precompile::client

#endif  // PRECOMPILE_CLIENT_JSON_H_
