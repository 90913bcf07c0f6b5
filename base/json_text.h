// JSON text in and out, through nlohmann::ordered_json: what the client tools
// read (inline tensors, request mixes) and print (--json, load reports), and
// the server's KServe v2 HTTP/REST bodies. Ordered, so that what is printed
// keeps the order it was built in; nlohmann keeps integers as int64 or
// uint64, so an INT64 beyond 2^53 survives and 3 (an int) stays apart from
// 3.0 (a float).
//
// nlohmann throws; these functions do not, so that no exception leaves the
// modules that use them.
//
// Thread safety: free functions without shared state.
#ifndef PRECOMPILE_BASE_JSON_TEXT_H_
#define PRECOMPILE_BASE_JSON_TEXT_H_

#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace precompile {

using Json = nlohmann::ordered_json;

// Parses a JSON document (RFC 8259). INVALID_ARGUMENT says where it went
// wrong ("invalid JSON at line 2, column 8: ..."). Also refused, where
// nlohmann would accept them: a key given twice in one object (nlohmann
// keeps the last silently) and nesting deeper than 200 (the tools walk
// values recursively).
absl::StatusOr<Json> ParseJson(absl::string_view text);

// The deepest nesting ParseJson accepts.
inline constexpr int kMaxJsonDepth = 200;

// What ParseJson answers for nlohmann's parse error `e` ("invalid JSON at
// line 2, column 8: ..."): for parsers of its kind elsewhere.
std::string JsonParseErrorText(const nlohmann::json::exception& e);

// The member `key` of `object`, or null when it has none (or is no object).
const Json* JsonMember(const Json& object, const std::string& key);

// The JSON text: two-space indentation when `pretty`, else compact. Bytes
// that are not UTF-8 (a server's message may hold any) become U+FFFD
// instead of failing.
std::string DumpJson(const Json& json, bool pretty = true);

// `value` as a JSON number that keeps `significant_digits` digits (9 read
// back a float, 17 a double). NaN and the infinities become the strings
// "NaN", "Infinity" and "-Infinity": JSON has no literal for them, and
// proto3's JSON does the same.
Json JsonDouble(double value, int significant_digits = 17);

}  // namespace precompile

#endif  // PRECOMPILE_BASE_JSON_TEXT_H_
