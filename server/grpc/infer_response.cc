#include "server/grpc/infer_response.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpc/slice.h>
#include <grpcpp/support/slice.h>

#include <cstdint>
#include <cstring>
#include <memory>

namespace precompile::server {
namespace {

using ::google::protobuf::io::CodedOutputStream;
using ::google::protobuf::internal::WireFormatLite;

const uint32_t kRawOutputTag =
    WireFormatLite::MakeTag(inference::ModelInferResponse::kRawOutputContentsFieldNumber,
                            WireFormatLite::WIRETYPE_LENGTH_DELIMITED);

// The tag and length in front of an output's bytes.
size_t FieldHeaderSize(size_t nbytes) {
  return CodedOutputStream::VarintSize32(kRawOutputTag) + CodedOutputStream::VarintSize64(nbytes);
}

uint8_t* WriteFieldHeader(size_t nbytes, uint8_t* p) {
  p = CodedOutputStream::WriteVarint32ToArray(kRawOutputTag, p);
  return CodedOutputStream::WriteVarint64ToArray(nbytes, p);
}

void ReleaseOwner(void* owner) { delete static_cast<std::shared_ptr<const void>*>(owner); }

// A fresh slice of `size` bytes, to be written. Never one of gRPC's inlined
// slices, whose bytes live in the slice object and would move with it.
grpc::Slice Allocate(size_t size, uint8_t** data) {
  grpc::Slice slice(grpc_slice_malloc_large(size), grpc::Slice::STEAL_REF);
  *data = const_cast<uint8_t*>(slice.begin());
  return slice;
}

}  // namespace

grpc::ByteBuffer SerializeInferResponse(const inference::ModelInferResponse& response,
                                        const std::vector<OutputTensor>& outputs) {
  // The bytes copied between referenced outputs: the message, field headers
  // and small outputs.
  std::vector<size_t> copied(1, response.ByteSizeLong());
  for (const OutputTensor& t : outputs) {
    copied.back() += FieldHeaderSize(t.nbytes);
    if (SentFromTensor(t)) {
      copied.push_back(0);
    } else {
      copied.back() += t.nbytes;
    }
  }

  std::vector<grpc::Slice> slices;
  slices.reserve(copied.size() * 2);
  uint8_t* p = nullptr;
  slices.push_back(Allocate(copied[0], &p));
  p = response.SerializeWithCachedSizesToArray(p);
  size_t run = 0;
  for (const OutputTensor& t : outputs) {
    p = WriteFieldHeader(t.nbytes, p);
    if (!SentFromTensor(t)) {
      if (t.nbytes > 0) std::memcpy(p, t.data, t.nbytes);
      p += t.nbytes;
      continue;
    }
    slices.emplace_back(const_cast<void*>(t.data), t.nbytes, &ReleaseOwner,
                        new std::shared_ptr<const void>(t.owner));
    ++run;
    if (copied[run] > 0) slices.push_back(Allocate(copied[run], &p));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

}  // namespace precompile::server
