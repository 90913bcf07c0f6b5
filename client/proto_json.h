// Protocol buffer messages as JSON for the tools' --json output. Unlike
// protobuf's own JSON printer, 64-bit integers stay numbers (scripts compare
// counts, not strings), every singular scalar field is printed even when it
// holds its default (so keys do not come and go), and map entries are sorted
// by key. Keys are the .proto field names; enums print their value names.
//
// Thread safety: a free function.
#ifndef PRECOMPILE_CLIENT_PROTO_JSON_H_
#define PRECOMPILE_CLIENT_PROTO_JSON_H_

#include <google/protobuf/message.h>

#include "client/json_text.h"

namespace precompile::client {

Json ProtoToJson(const google::protobuf::Message& message);

}  // namespace precompile::client

#endif  // PRECOMPILE_CLIENT_PROTO_JSON_H_
