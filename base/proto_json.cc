#include "base/proto_json.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace precompile {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// Element `index` of a repeated field, or the singular field when index < 0.
Json FieldValue(const Message& message, const FieldDescriptor* field, int index) {
  const Reflection* r = message.GetReflection();
  const bool repeated = index >= 0;
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return repeated ? r->GetRepeatedInt32(message, field, index) : r->GetInt32(message, field);
    case FieldDescriptor::CPPTYPE_INT64:
      return repeated ? r->GetRepeatedInt64(message, field, index) : r->GetInt64(message, field);
    case FieldDescriptor::CPPTYPE_UINT32:
      return repeated ? r->GetRepeatedUInt32(message, field, index) : r->GetUInt32(message, field);
    case FieldDescriptor::CPPTYPE_UINT64:
      return repeated ? r->GetRepeatedUInt64(message, field, index) : r->GetUInt64(message, field);
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return JsonDouble(repeated ? r->GetRepeatedDouble(message, field, index)
                                 : r->GetDouble(message, field));
    case FieldDescriptor::CPPTYPE_FLOAT:
      return JsonDouble(
          repeated ? r->GetRepeatedFloat(message, field, index) : r->GetFloat(message, field), 9);
    case FieldDescriptor::CPPTYPE_BOOL:
      return repeated ? r->GetRepeatedBool(message, field, index) : r->GetBool(message, field);
    case FieldDescriptor::CPPTYPE_ENUM: {
      const auto* value =
          repeated ? r->GetRepeatedEnum(message, field, index) : r->GetEnum(message, field);
      return value->name();
    }
    case FieldDescriptor::CPPTYPE_STRING:
      return repeated ? r->GetRepeatedString(message, field, index) : r->GetString(message, field);
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return ProtoToJson(repeated ? r->GetRepeatedMessage(message, field, index)
                                  : r->GetMessage(message, field));
  }
  return Json();
}

// The entries of map field `field`, read from the message's wire form rather
// than through reflection: Debian's libprotobuf is not built with
// ThreadSanitizer, and MapFieldBase's layout changes under it, so reflecting
// on a map field crashes in --config=tsan builds.
std::vector<std::unique_ptr<Message>> MapEntries(const Message& message,
                                                 const FieldDescriptor* field) {
  using google::protobuf::internal::WireFormatLite;
  std::vector<std::unique_ptr<Message>> entries;
  const Message* prototype =
      message.GetReflection()->GetMessageFactory()->GetPrototype(field->message_type());
  const std::string bytes = message.SerializePartialAsString();
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            static_cast<int>(bytes.size()));
  while (const uint32_t tag = in.ReadTag()) {
    if (WireFormatLite::GetTagFieldNumber(tag) != field->number() ||
        WireFormatLite::GetTagWireType(tag) != WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      if (!WireFormatLite::SkipField(&in, tag)) break;
      continue;
    }
    uint32_t length;
    std::string payload;
    if (!in.ReadVarint32(&length) || !in.ReadString(&payload, static_cast<int>(length))) break;
    std::unique_ptr<Message> entry(prototype->New());
    if (entry->ParsePartialFromString(payload)) entries.push_back(std::move(entry));
  }
  return entries;
}

// A map field as an object sorted by key.
Json MapValue(const Message& message, const FieldDescriptor* field) {
  const FieldDescriptor* key_field = field->message_type()->map_key();
  const FieldDescriptor* value_field = field->message_type()->map_value();
  std::vector<std::pair<std::string, Json>> entries;
  for (const std::unique_ptr<Message>& entry : MapEntries(message, field)) {
    Json key = FieldValue(*entry, key_field, -1);
    entries.emplace_back(key.is_string() ? key.get<std::string>() : DumpJson(key, false),
                         FieldValue(*entry, value_field, -1));
  }
  std::sort(entries.begin(), entries.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  Json object = Json::object();
  for (auto& [key, value] : entries) object[key] = std::move(value);
  return object;
}

}  // namespace

Json ProtoToJson(const Message& message) {
  const auto* descriptor = message.GetDescriptor();
  const Reflection* r = message.GetReflection();
  Json object = Json::object();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor* field = descriptor->field(i);
    if (field->is_map()) {
      object[field->name()] = MapValue(message, field);
    } else if (field->is_repeated()) {
      Json array = Json::array();
      for (int j = 0; j < r->FieldSize(message, field); ++j) {
        array.push_back(FieldValue(message, field, j));
      }
      object[field->name()] = std::move(array);
    } else if (field->has_presence() && !r->HasField(message, field)) {
      // Unset messages and the unset members of a oneof: nothing to say.
      continue;
    } else {
      object[field->name()] = FieldValue(message, field, -1);
    }
  }
  return object;
}

}  // namespace precompile
