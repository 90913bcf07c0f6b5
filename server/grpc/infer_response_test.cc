#include "server/grpc/infer_response.h"

#include <gmock/gmock.h>
#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "server/api/tensor_codec.h"

namespace precompile::server {
namespace {

// An output whose bytes are owned by a shared vector, filled with `seed`.
OutputTensor Output(size_t floats, float seed, bool owned = true) {
  auto values = std::make_shared<std::vector<float>>(floats);
  for (size_t i = 0; i < floats; ++i) (*values)[i] = seed + static_cast<float>(i);
  OutputTensor t;
  t.dtype = DType::kFloat32;
  t.shape = {static_cast<int64_t>(floats)};
  t.data = values->data();
  t.nbytes = floats * sizeof(float);
  if (owned) {
    t.owner = values;
  } else {
    // The test keeps these bytes alive past the response.
    static std::vector<std::shared_ptr<std::vector<float>>>* kept =
        new std::vector<std::shared_ptr<std::vector<float>>>();
    kept->push_back(values);
  }
  return t;
}

inference::ModelInferResponse Header(const std::vector<OutputTensor>& outputs) {
  inference::ModelInferResponse response;
  response.set_model_name("mlp");
  response.set_model_version("3");
  response.set_id("request-7");
  (*response.mutable_parameters())["precompile_outcome"].set_string_param("variant");
  for (size_t i = 0; i < outputs.size(); ++i) {
    DescribeOutput(outputs[i], "output" + std::to_string(i), &response);
  }
  return response;
}

inference::ModelInferResponse Parse(grpc::ByteBuffer* buffer) {
  inference::ModelInferResponse parsed;
  grpc::ProtoBufferReader reader(buffer);
  EXPECT_TRUE(parsed.ParseFromZeroCopyStream(&reader));
  return parsed;
}

std::vector<grpc::Slice> Slices(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  return slices;
}

bool AnySliceIs(const std::vector<grpc::Slice>& slices, const void* data) {
  for (const grpc::Slice& s : slices) {
    if (static_cast<const void*>(s.begin()) == data) return true;
  }
  return false;
}

TEST(InferResponse, ParsesAsTheMessageWithItsOutputsInOrder) {
  // Small, large, small, large: copied and referenced outputs interleave.
  const std::vector<OutputTensor> outputs = {Output(3, 1), Output(4096, 2), Output(0, 3),
                                             Output(3000, 4)};
  const inference::ModelInferResponse header = Header(outputs);
  grpc::ByteBuffer buffer = SerializeInferResponse(header, outputs);

  inference::ModelInferResponse expected = header;
  for (const OutputTensor& t : outputs) {
    expected.add_raw_output_contents(static_cast<const char*>(t.data), t.nbytes);
  }
  const inference::ModelInferResponse parsed = Parse(&buffer);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(parsed, expected));
  // Byte for byte what the generated code would send.
  EXPECT_EQ(buffer.Length(), expected.ByteSizeLong());
}

TEST(InferResponse, LargeOutputsAreSentFromTheTensorAndHeldUntilSent) {
  const std::vector<OutputTensor> outputs = {Output(3, 1), Output(4096, 2)};
  std::weak_ptr<const void> large = outputs[1].owner;
  {
    grpc::ByteBuffer buffer = SerializeInferResponse(Header(outputs), outputs);
    const std::vector<grpc::Slice> slices = Slices(buffer);
    EXPECT_TRUE(AnySliceIs(slices, outputs[1].data)) << "the large output was copied";
    EXPECT_FALSE(AnySliceIs(slices, outputs[0].data)) << "the small output was referenced";
    EXPECT_EQ(large.use_count(), 2) << "the buffer does not hold the large output";
  }
  EXPECT_EQ(large.use_count(), 1);
}

TEST(InferResponse, OutputsWithoutAnOwnerAreCopied) {
  const std::vector<OutputTensor> outputs = {Output(4096, 5, /*owned=*/false)};
  grpc::ByteBuffer buffer = SerializeInferResponse(Header(outputs), outputs);
  EXPECT_FALSE(AnySliceIs(Slices(buffer), outputs[0].data));
  const inference::ModelInferResponse parsed = Parse(&buffer);
  ASSERT_EQ(parsed.raw_output_contents_size(), 1);
  EXPECT_EQ(parsed.raw_output_contents(0),
            std::string(static_cast<const char*>(outputs[0].data), outputs[0].nbytes));
}

TEST(InferResponse, AResponseWithoutOutputsIsTheMessageAlone) {
  const inference::ModelInferResponse header = Header({});
  grpc::ByteBuffer buffer = SerializeInferResponse(header, {});
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(Parse(&buffer), header));
}

}  // namespace
}  // namespace precompile::server
