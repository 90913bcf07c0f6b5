// Protocol buffer messages as JSON: the tools' --json output and the server's
// KServe v2 HTTP/REST bodies. Unlike protobuf's own JSON printer, 64-bit
// integers stay numbers (scripts compare counts, not strings; Triton prints
// them so), every singular scalar field is printed even when it holds its
// default (so keys do not come and go), and map entries are sorted by key. Keys are the .proto field names; enums print their value names.
//
// Thread safety: a free function.
#ifndef PRECOMPILE_BASE_PROTO_JSON_H_
#define PRECOMPILE_BASE_PROTO_JSON_H_

#include <google/protobuf/message.h>

#include "base/json_text.h"

namespace precompile {

Json ProtoToJson(const google::protobuf::Message& message);

}  // namespace precompile

#endif  // PRECOMPILE_BASE_PROTO_JSON_H_
