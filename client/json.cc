#include "client/json.h"

#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace precompile::client {

Json Json::Bool(bool value) {
  Json j;
  j.type_ = Type::kBool;
  j.bool_ = value;
  return j;
}

Json Json::Int(int64_t value) {
  Json j;
  j.type_ = Type::kNumber;
  j.text_ = absl::StrCat(value);
  return j;
}

Json Json::Uint(uint64_t value) {
  Json j;
  j.type_ = Type::kNumber;
  j.text_ = absl::StrCat(value);
  return j;
}

Json Json::Double(double value, int significant_digits) {
  if (std::isnan(value)) return String("NaN");
  if (std::isinf(value)) return String(value > 0 ? "Infinity" : "-Infinity");
  Json j;
  j.type_ = Type::kNumber;
  j.text_ = absl::StrFormat("%.*g", significant_digits, value);
  return j;
}

Json Json::String(std::string value) {
  Json j;
  j.type_ = Type::kString;
  j.text_ = std::move(value);
  return j;
}

Json Json::Array() {
  Json j;
  j.type_ = Type::kArray;
  return j;
}

Json Json::Object() {
  Json j;
  j.type_ = Type::kObject;
  return j;
}

bool Json::IsIntegerLiteral() const {
  return type_ == Type::kNumber && text_.find_first_of(".eE") == std::string::npos;
}

absl::StatusOr<int64_t> Json::AsInt64() const {
  int64_t value;
  if (!IsIntegerLiteral() || !absl::SimpleAtoi(text_, &value)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected an integer, got ", type_ == Type::kNumber ? text_ : TypeName(type_)));
  }
  return value;
}

absl::StatusOr<uint64_t> Json::AsUint64() const {
  uint64_t value;
  if (!IsIntegerLiteral() || !absl::SimpleAtoi(text_, &value)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected a non-negative integer, got ", type_ == Type::kNumber ? text_ : TypeName(type_)));
  }
  return value;
}

double Json::AsDouble() const {
  double value = 0;
  // The parser checked the grammar; out-of-range literals saturate to inf.
  if (!absl::SimpleAtod(text_, &value)) value = text_[0] == '-' ? -HUGE_VAL : HUGE_VAL;
  return value;
}

Json& Json::Append(Json value) {
  elements_.push_back(std::move(value));
  return elements_.back();
}

const Json* Json::Find(absl::string_view key) const {
  for (size_t i = 0; i < keys_.size(); ++i) {
    if (keys_[i] == key) return &elements_[i];
  }
  return nullptr;
}

Json& Json::Set(absl::string_view key, Json value) {
  for (size_t i = 0; i < keys_.size(); ++i) {
    if (keys_[i] == key) return elements_[i] = std::move(value);
  }
  keys_.emplace_back(key);
  elements_.push_back(std::move(value));
  return elements_.back();
}

const char* Json::TypeName(Type type) {
  switch (type) {
    case Type::kNull: return "null";
    case Type::kBool: return "a bool";
    case Type::kNumber: return "a number";
    case Type::kString: return "a string";
    case Type::kArray: return "an array";
    case Type::kObject: return "an object";
  }
  return "?";
}

namespace {

void AppendQuoted(std::string& out, absl::string_view s) {
  out.push_back('"');
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", static_cast<unsigned char>(c));
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
}

void Newline(std::string& out, int indent) {
  out.push_back('\n');
  out.append(2 * indent, ' ');
}

}  // namespace

void Json::DumpTo(std::string& out, bool pretty, int indent) const {
  switch (type_) {
    case Type::kNull: out += "null"; return;
    case Type::kBool: out += bool_ ? "true" : "false"; return;
    case Type::kNumber: out += text_; return;
    case Type::kString: AppendQuoted(out, text_); return;
    case Type::kArray: {
      bool nested = false;
      for (const Json& e : elements_) nested |= e.is_array() || e.is_object();
      out.push_back('[');
      for (size_t i = 0; i < elements_.size(); ++i) {
        if (i > 0) out += pretty && !nested ? ", " : ",";
        if (pretty && nested) Newline(out, indent + 1);
        elements_[i].DumpTo(out, pretty, indent + 1);
      }
      if (pretty && nested) Newline(out, indent);
      out.push_back(']');
      return;
    }
    case Type::kObject: {
      out.push_back('{');
      for (size_t i = 0; i < keys_.size(); ++i) {
        if (i > 0) out.push_back(',');
        if (pretty) Newline(out, indent + 1);
        AppendQuoted(out, keys_[i]);
        out += pretty ? ": " : ":";
        elements_[i].DumpTo(out, pretty, indent + 1);
      }
      if (pretty && !keys_.empty()) Newline(out, indent);
      out.push_back('}');
      return;
    }
  }
}

std::string Json::Dump(bool pretty) const {
  std::string out;
  DumpTo(out, pretty, 0);
  return out;
}

class JsonParser {
 public:
  explicit JsonParser(absl::string_view text) : text_(text) {}

  absl::StatusOr<Json> Document() {
    Json value;
    if (absl::Status s = Value(value, 0); !s.ok()) return s;
    SkipSpace();
    if (pos_ != text_.size()) return Error("unexpected text after the JSON value");
    return value;
  }

 private:
  static constexpr int kMaxDepth = 200;

  absl::Status Error(absl::string_view what) const {
    int line = 1, column = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat("invalid JSON at line ", line, ", column ", column, ": ", what));
  }

  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool Literal(absl::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  absl::Status Value(Json& out, int depth) {
    if (depth > kMaxDepth) return Error("nested too deeply");
    SkipSpace();
    if (pos_ >= text_.size()) return Error("expected a value, got the end of the text");
    const char c = text_[pos_];
    if (c == '{') return Object(out, depth);
    if (c == '[') return ArrayValue(out, depth);
    if (c == '"') {
      out.type_ = Json::Type::kString;
      return String(out.text_);
    }
    if (c == '-' || absl::ascii_isdigit(static_cast<unsigned char>(c))) return Number(out);
    if (Literal("true")) {
      out = Json::Bool(true);
      return absl::OkStatus();
    }
    if (Literal("false")) {
      out = Json::Bool(false);
      return absl::OkStatus();
    }
    if (Literal("null")) {
      out = Json();
      return absl::OkStatus();
    }
    return Error(absl::StrCat("unexpected character '", std::string(1, c), "'"));
  }

  absl::Status Object(Json& out, int depth) {
    out = Json::Object();
    ++pos_;  // '{'
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == '}') {
      ++pos_;
      return absl::OkStatus();
    }
    while (true) {
      SkipSpace();
      if (pos_ >= text_.size() || text_[pos_] != '"') return Error("expected a member name");
      std::string key;
      if (absl::Status s = String(key); !s.ok()) return s;
      if (out.Find(key) != nullptr) return Error(absl::StrCat("duplicate key \"", key, "\""));
      SkipSpace();
      if (pos_ >= text_.size() || text_[pos_] != ':') return Error("expected ':'");
      ++pos_;
      Json value;
      if (absl::Status s = Value(value, depth + 1); !s.ok()) return s;
      out.keys_.push_back(std::move(key));
      out.elements_.push_back(std::move(value));
      SkipSpace();
      if (pos_ < text_.size() && text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < text_.size() && text_[pos_] == '}') {
        ++pos_;
        return absl::OkStatus();
      }
      return Error("expected ',' or '}'");
    }
  }

  absl::Status ArrayValue(Json& out, int depth) {
    out = Json::Array();
    ++pos_;  // '['
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == ']') {
      ++pos_;
      return absl::OkStatus();
    }
    while (true) {
      Json value;
      if (absl::Status s = Value(value, depth + 1); !s.ok()) return s;
      out.elements_.push_back(std::move(value));
      SkipSpace();
      if (pos_ < text_.size() && text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < text_.size() && text_[pos_] == ']') {
        ++pos_;
        return absl::OkStatus();
      }
      return Error("expected ',' or ']'");
    }
  }

  absl::Status Number(Json& out) {
    const size_t start = pos_;
    auto digits = [&] {
      const size_t from = pos_;
      while (pos_ < text_.size() && absl::ascii_isdigit(static_cast<unsigned char>(text_[pos_]))) {
        ++pos_;
      }
      return pos_ > from;
    };
    if (text_[pos_] == '-') ++pos_;
    if (pos_ < text_.size() && text_[pos_] == '0') {
      ++pos_;
    } else if (!digits()) {
      return Error("expected a digit");
    }
    if (pos_ < text_.size() && text_[pos_] == '.') {
      ++pos_;
      if (!digits()) return Error("expected a digit after '.'");
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      if (!digits()) return Error("expected a digit in the exponent");
    }
    out.type_ = Json::Type::kNumber;
    out.text_ = std::string(text_.substr(start, pos_ - start));
    return absl::OkStatus();
  }

  absl::Status Hex4(uint32_t& out) {
    if (pos_ + 4 > text_.size()) return Error("truncated \\u escape");
    out = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[pos_++];
      out <<= 4;
      if (c >= '0' && c <= '9') {
        out |= c - '0';
      } else if (c >= 'a' && c <= 'f') {
        out |= c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        out |= c - 'A' + 10;
      } else {
        return Error("bad \\u escape");
      }
    }
    return absl::OkStatus();
  }

  static void AppendUtf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
      out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else {
      out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
  }

  absl::Status String(std::string& out) {
    ++pos_;  // '"'
    out.clear();
    while (true) {
      if (pos_ >= text_.size()) return Error("unterminated string");
      const char c = text_[pos_++];
      if (c == '"') return absl::OkStatus();
      if (static_cast<unsigned char>(c) < 0x20) return Error("control character in a string");
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (pos_ >= text_.size()) return Error("unterminated string");
      const char e = text_[pos_++];
      switch (e) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          uint32_t cp;
          if (absl::Status s = Hex4(cp); !s.ok()) return s;
          if (cp >= 0xd800 && cp < 0xdc00) {
            uint32_t low;
            if (!Literal("\\u")) return Error("unpaired surrogate");
            if (absl::Status s = Hex4(low); !s.ok()) return s;
            if (low < 0xdc00 || low >= 0xe000) return Error("unpaired surrogate");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
          } else if (cp >= 0xdc00 && cp < 0xe000) {
            return Error("unpaired surrogate");
          }
          AppendUtf8(out, cp);
          break;
        }
        default: return Error(absl::StrCat("bad escape '\\", std::string(1, e), "'"));
      }
    }
  }

  absl::string_view text_;
  size_t pos_ = 0;
};

absl::StatusOr<Json> ParseJson(absl::string_view text) { return JsonParser(text).Document(); }

}  // namespace precompile::client
