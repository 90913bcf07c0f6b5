#include "client/npy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/half_float.h"

namespace precompile::client {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Bytes of a .npy file as numpy writes them: magic, version, header length,
// then the header padded with spaces to a 64-byte boundary and a newline.
std::string NumpyFile(const std::string& dict, const std::string& data, int major = 1) {
  const size_t preamble = major == 1 ? 10 : 12;
  std::string header = dict;
  const size_t total = (preamble + header.size() + 1 + 63) / 64 * 64;
  header.append(total - preamble - header.size() - 1, ' ');
  header.push_back('\n');
  std::string out("\x93NUMPY", 6);
  out.push_back(static_cast<char>(major));
  out.push_back(0);
  for (size_t i = 0; i < preamble - 8; ++i)
    out.push_back(static_cast<char>(header.size() >> (8 * i)));
  return out + header + data;
}

template <typename T>
std::string Bytes(std::initializer_list<T> values) {
  std::string bytes(values.size() * sizeof(T), '\0');
  std::memcpy(bytes.data(), values.begin(), bytes.size());
  return bytes;
}

TEST(NpyTest, WritesWhatNumpyWrites) {
  Tensor t{"x", "FP32", {2, 3}, Bytes<float>({1, 2, 3, 4, 5, 6})};
  absl::StatusOr<std::string> bytes = SerializeNpy(t);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  // numpy.save(np.arange(1, 7, dtype='<f4').reshape(2, 3)) gives exactly this.
  EXPECT_EQ(*bytes,
            NumpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", t.data));
  EXPECT_EQ((bytes->size() - t.data.size()) % 64, 0u);

  Tensor vector{"v", "INT64", {3}, Bytes<int64_t>({-1, 0, 1})};
  EXPECT_THAT(*SerializeNpy(vector), HasSubstr("'shape': (3,), }"));
  Tensor scalar{"s", "BOOL", {}, std::string(1, '\1')};
  EXPECT_THAT(*SerializeNpy(scalar),
              HasSubstr("{'descr': '|b1', 'fortran_order': False, 'shape': (), }"));
}

TEST(NpyTest, RoundTripsEveryDatatype) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"BOOL", "|b1"},   {"UINT8", "|u1"}, {"UINT16", "<u2"}, {"UINT32", "<u4"},
      {"UINT64", "<u8"}, {"INT8", "|i1"},  {"INT16", "<i2"},  {"INT32", "<i4"},
      {"INT64", "<i8"},  {"FP16", "<f2"},  {"FP32", "<f4"},   {"FP64", "<f8"},
  };
  for (const auto& [datatype, descr] : cases) {
    EXPECT_EQ(*NpyDescrOf(datatype), descr);
    EXPECT_EQ(*DatatypeOfNpyDescr(descr), datatype);
    const int size = *ElementSize(datatype);
    Tensor t{"t", datatype, {2, 0, 3}, ""};
    Tensor u{"u", datatype, {4, 1}, std::string(4 * size, '\1')};
    for (const Tensor& tensor : {t, u}) {
      absl::StatusOr<std::string> bytes = SerializeNpy(tensor);
      ASSERT_TRUE(bytes.ok()) << datatype << ": " << bytes.status();
      absl::StatusOr<Tensor> back = ParseNpy(*bytes);
      ASSERT_TRUE(back.ok()) << datatype << ": " << back.status();
      EXPECT_EQ(back->datatype, datatype);
      EXPECT_EQ(back->shape, tensor.shape);
      EXPECT_EQ(back->data, tensor.data);
    }
  }
}

TEST(NpyTest, ReadsVersionTwoAndOtherSpellings) {
  absl::StatusOr<Tensor> t =
      ParseNpy(NumpyFile("{\"shape\": (2L,), \"fortran_order\": False, \"descr\": \"<i4\"}",
                         Bytes<int32_t>({7, 8}), 2));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->datatype, "INT32");
  EXPECT_THAT(t->shape, ElementsAre(2));
  EXPECT_EQ(ElementAsInt64(*t, 1), 8);
  // Fortran order is harmless when at most one dimension exceeds 1.
  t = ParseNpy(NumpyFile("{'descr': '<f8', 'fortran_order': True, 'shape': (1, 2), }",
                         Bytes<double>({1.5, 2.5})));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(ElementAsDouble(*t, 1), 2.5);
}

TEST(NpyTest, WritesAndReadsFiles) {
  const std::string path = absl::StrCat(getenv("TEST_TMPDIR"), "/x.npy");
  Tensor t{"x", "FP16", {2}, Bytes<uint16_t>({FloatToHalf(0.5f), FloatToHalf(-2.0f)})};
  ASSERT_TRUE(WriteNpy(path, t).ok());
  absl::StatusOr<Tensor> back = ReadNpy(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->data, t.data);
  EXPECT_EQ(ReadNpy(path + ".missing").status().code(), absl::StatusCode::kNotFound);
}

TEST(NpyTest, RefusesWhatATensorCannotBe) {
  const std::string f4 = Bytes<float>({1, 2});
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not numpy", "does not start with \\x93NUMPY"},
      {NumpyFile("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", f4), "big-endian"},
      {NumpyFile("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", f4 + f4),
       "Fortran-order"},
      {NumpyFile("{'descr': '|O', 'fortran_order': False, 'shape': (2,), }", f4),
       "structured, object or string arrays"},
      {NumpyFile("{'descr': '<V2', 'fortran_order': False, 'shape': (2,), }", f4),
       "bfloat16 has no .npy dtype"},
      {NumpyFile("{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", f4),
       "supported: bool"},
      {NumpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", f4),
       "needs 12 bytes of data, the file has 8"},
      {NumpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", f4),
       "needs 4 bytes of data, the file has 8"},
      {NumpyFile("{'descr': '<f4', 'shape': (2,), }", f4), "needs 'descr', 'fortran_order'"},
      {NumpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", f4),
       "unexpected key 'x'"},
      {NumpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", f4).substr(0, 20),
       "truncated header"},
      {std::string("\x93NUMPY\x07\x00\x10\x00", 10), "format version 7.0"},
  };
  for (const auto& [bytes, message] : cases) {
    absl::StatusOr<Tensor> t = ParseNpy(bytes);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_THAT(t.status().message(), HasSubstr(message));
  }
}

TEST(NpyTest, RefusesToWriteBFloat16) {
  Tensor t{"y", "BF16", {1}, Bytes<uint16_t>({FloatToBFloat16(1.0f)})};
  absl::StatusOr<std::string> bytes = SerializeNpy(t);
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bytes.status().message(), HasSubstr("BF16 has no .npy dtype"));
  absl::Status written = WriteNpy("/nonexistent/y.npy", t);
  EXPECT_THAT(written.message(), HasSubstr("cannot save /nonexistent/y.npy: BF16"));

  Tensor wrong{"z", "FP32", {3}, Bytes<float>({1})};
  EXPECT_THAT(SerializeNpy(wrong).status().message(), HasSubstr("has 4 bytes but shape [3]"));
}

}  // namespace
}  // namespace precompile::client
