#include "base/json_text.h"

#include <cmath>
#include <set>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace precompile {

// nlohmann's message without its "[json.exception.parse_error.101] parse
// error at " prefix: what is left starts with the line and column.
std::string JsonParseErrorText(const nlohmann::json::exception& e) {
  absl::string_view text = e.what();
  if (const size_t bracket = text.find("] "); bracket != absl::string_view::npos) {
    text.remove_prefix(bracket + 2);
  }
  if (absl::ConsumePrefix(&text, "parse error at ")) return absl::StrCat("invalid JSON at ", text);
  absl::ConsumePrefix(&text, "parse error: ");
  return absl::StrCat("invalid JSON: ", text);
}

absl::StatusOr<Json> ParseJson(absl::string_view text) {
  // The keys of each object being read, innermost last. Every value is kept
  // until something is refused; after that the callback discards the rest,
  // and nlohmann then skips events the bookkeeping would need, so it stops.
  std::vector<std::set<std::string>> keys;
  std::string refused;
  auto check = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (!refused.empty()) return false;
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        if (depth >= kMaxJsonDepth) {
          refused = absl::StrCat("invalid JSON: nested more than ", kMaxJsonDepth, " deep");
        }
        if (event == Json::parse_event_t::object_start) keys.emplace_back();
        break;
      case Json::parse_event_t::object_end: keys.pop_back(); break;
      case Json::parse_event_t::key:
        if (!keys.back().insert(parsed.get<std::string>()).second) {
          refused = absl::StrCat("invalid JSON: the key \"", parsed.get<std::string>(),
                                 "\" is given twice in one object");
        }
        break;
      default: break;
    }
    return refused.empty();
  };
  try {
    Json json = Json::parse(text.begin(), text.end(), check);
    if (!refused.empty()) return absl::InvalidArgumentError(refused);
    return json;
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(JsonParseErrorText(e));
  }
}

const Json* JsonMember(const Json& object, const std::string& key) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

std::string DumpJson(const Json& json, bool pretty) {
  return json.dump(pretty ? 2 : -1, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
}

Json JsonDouble(double value, int significant_digits) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  // nlohmann prints the shortest text that reads back the same double; a
  // double rounded to fewer digits first prints with no more than those.
  if (significant_digits < 17) {
    double rounded;
    if (absl::SimpleAtod(absl::StrFormat("%.*g", significant_digits, value), &rounded)) {
      value = rounded;
    }
  }
  return value;
}

}  // namespace precompile
