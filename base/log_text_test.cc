#include "base/log_text.h"

#include <gtest/gtest.h>

#include <new>
#include <stdexcept>
#include <string>

namespace precompile {
namespace {

TEST(LoggedText, EscapesWhatCouldForgeALineAndSaysHowMuchItCut) {
  EXPECT_EQ(LoggedText("a\nb\"c", 100), "a\\nb\\\"c");
  EXPECT_EQ(LoggedText(std::string(10, 'x'), 4), "xxxx... (6 more bytes)");
  EXPECT_EQ(LoggedText("abcd", 4), "abcd");
}

TEST(ClientMessage, KeepsAMessageWholeUpToItsLimitAndCutsBetweenCharacters) {
  const std::string whole(kMaxClientMessageBytes, 'm');
  EXPECT_EQ(ClientMessage(whole), whole);
  EXPECT_EQ(ClientMessage(whole + "xyz"), whole + "... (3 more bytes)");
  // A two-byte character across the limit goes whole into what is cut.
  const std::string accented = std::string(kMaxClientMessageBytes - 1, 'm') + "\xc3\xa9" + "z";
  EXPECT_EQ(ClientMessage(accented),
            std::string(kMaxClientMessageBytes - 1, 'm') + "... (3 more bytes)");
}

TEST(DescribeCaughtException, TellsOutOfMemoryFromTheRestAndCutsWhatTheySay) {
  auto caught = [](auto thrown) {
    try {
      throw thrown;
    } catch (...) {
      return DescribeCaughtException();
    }
  };
  CaughtException memory = caught(std::bad_alloc());
  EXPECT_TRUE(memory.out_of_memory);
  EXPECT_EQ(memory.what, "out of memory");
  CaughtException long_message = caught(std::runtime_error(std::string(5000, 'y') + "\n"));
  EXPECT_FALSE(long_message.out_of_memory);
  EXPECT_EQ(long_message.what, std::string(1024, 'y') + "... (3977 more bytes)");
  CaughtException other = caught(42);
  EXPECT_FALSE(other.out_of_memory);
  EXPECT_EQ(other.what, "an exception that is not a std::exception");
}

}  // namespace
}  // namespace precompile
