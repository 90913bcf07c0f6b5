#include "server/http/http_head.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

namespace precompile::server {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<HttpHead> Parse(const std::string& head, size_t max_fields = 100) {
  return ParseHttpHead(head, max_fields);
}

TEST(FindHeadEnd, EndsAtTheFirstEmptyLineWithCrlfOrBareLf) {
  EXPECT_EQ(FindHeadEnd("GET / HTTP/1.1\r\nHost: x\r\n\r\nbody"), 27u);
  EXPECT_EQ(FindHeadEnd("GET / HTTP/1.1\nHost: x\n\nbody"), 24u);
  EXPECT_EQ(FindHeadEnd("GET / HTTP/1.1\r\nHost: x\r\n"), std::nullopt);
  EXPECT_EQ(FindHeadEnd("GET / HTTP/1.1\r\nHost: x\r\n\r"), std::nullopt);
  EXPECT_EQ(FindHeadEnd(""), std::nullopt);
}

TEST(SkipEmptyLines, SkipsOnlyTheEmptyLinesBeforeARequestLine) {
  EXPECT_EQ(SkipEmptyLines("\r\n\nGET"), 3u);
  EXPECT_EQ(SkipEmptyLines("GET"), 0u);
  // A lone CR may be the start of a CRLF still on its way.
  EXPECT_EQ(SkipEmptyLines("\r"), 0u);
}

TEST(ParseHttpHead, ReadsMethodDecodedPathFieldsAndFraming) {
  auto head = Parse(
      "POST /v2/models/my%20model/infer?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\n"
      "Expect: 100-continue\r\nInference-Header-Content-Length:  7 \r\n\r\n");
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->method, "POST");
  EXPECT_EQ(head->path, "/v2/models/my model/infer");
  EXPECT_EQ(head->content_length, 12u);
  EXPECT_TRUE(head->expect_continue);
  EXPECT_TRUE(head->keep_alive);
  EXPECT_FALSE(head->transfer_encoding);
  ASSERT_NE(head->Find("inference-header-content-length"), nullptr);
  EXPECT_EQ(*head->Find("inference-header-content-length"), "7");
  EXPECT_EQ(head->Find("authorization"), nullptr);
}

TEST(ParseHttpHead, KeepAliveFollowsTheVersionAndConnection) {
  EXPECT_FALSE(Parse("GET / HTTP/1.1\r\nConnection: Close\r\n\r\n")->keep_alive);
  EXPECT_FALSE(Parse("GET / HTTP/1.0\r\n\r\n")->keep_alive);
  EXPECT_TRUE(Parse("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")->keep_alive);
  EXPECT_TRUE(Parse("GET / HTTP/1.1\r\n\r\n")->keep_alive);
}

TEST(ParseHttpHead, AContentLengthPastUint64Saturates) {
  auto head = Parse("POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n");
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->content_length, std::numeric_limits<uint64_t>::max());
}

TEST(ParseHttpHead, RefusesWhatProxiesCouldReadDifferently) {
  struct Case {
    const char* head;
    absl::StatusCode code;
    const char* says;
  };
  const Case cases[] = {
      {"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
       absl::StatusCode::kInvalidArgument, "two different Content-Lengths"},
      {"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", absl::StatusCode::kInvalidArgument,
       "not a number of bytes"},
      {"POST / HTTP/1.1\r\nContent-Length: 1 2\r\n\r\n", absl::StatusCode::kInvalidArgument,
       "not a number of bytes"},
      {"GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n", absl::StatusCode::kInvalidArgument,
       "folded"},
      {"GET / HTTP/1.1\r\nBad Name: a\r\n\r\n", absl::StatusCode::kInvalidArgument,
       "token for a name"},
      {"GET / HTTP/1.1\r\nNoColon\r\n\r\n", absl::StatusCode::kInvalidArgument, "token for a name"},
      {"GET / HTTP/1.1\r\nX: a\x01z\r\n\r\n", absl::StatusCode::kInvalidArgument,
       "control characters"},
      {"GET / HTTP/2.0\r\n\r\n", absl::StatusCode::kUnimplemented, "HTTP/1.1 and HTTP/1.0"},
      {"GET /  HTTP/1.1\r\n\r\n", absl::StatusCode::kInvalidArgument, "METHOD /path"},
      {"GET http://a/ HTTP/1.1\r\n\r\n", absl::StatusCode::kInvalidArgument, "starting with '/'"},
      {"GET /%zz HTTP/1.1\r\n\r\n", absl::StatusCode::kInvalidArgument, "two hex digits"},
      {"GET /%4 HTTP/1.1\r\n\r\n", absl::StatusCode::kInvalidArgument, "two hex digits"},
      {"GET / FTP/1.1\r\n\r\n", absl::StatusCode::kInvalidArgument, "METHOD /path"},
  };
  for (const Case& c : cases) {
    auto head = Parse(c.head);
    ASSERT_FALSE(head.ok()) << c.head;
    EXPECT_EQ(head.status().code(), c.code) << c.head;
    EXPECT_THAT(head.status().message(), HasSubstr(c.says)) << c.head;
  }
}

TEST(ParseHttpHead, RefusesMoreFieldsThanTheLimit) {
  std::string head = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 3; ++i) head += "X: 1\r\n";
  head += "\r\n";
  EXPECT_TRUE(Parse(head, 3).ok());
  head.insert(head.size() - 2, "Y: 2\r\n");
  auto refused = Parse(head, 3);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("more than 3 header fields"));
}

TEST(ParseHttpHead, QuotesAClientsBytesClippedAndPrintable) {
  const std::string line = "GET /" + std::string(1000, 'a') + "\x7f HTTP/1.1 extra";
  auto head = Parse(line + "\r\n\r\n");
  ASSERT_FALSE(head.ok());
  EXPECT_LT(head.status().message().size(), 200u);
  EXPECT_THAT(head.status().message(), HasSubstr("..."));
}

}  // namespace
}  // namespace precompile::server
