// The first shim exception of a run, per thread.
#include "runtime/library_errors.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>

namespace precompile {
namespace {

TEST(LibraryErrors, ARunTakesTheFirstShimExceptionOfItsThread) {
  ForgetLibraryErrors();
  NoteLibraryLine("[W1207 08:00:00.1 alloc.cpp:10] a warning");
  NoteLibraryLine("[E1207 08:13:11.158 shim_common.cpp:1341] Exception in aoti_torch: "
                  "ValueError: refuses values below -1e6");
  // What failed after it, on the tensor it left undefined, is not the cause.
  NoteLibraryLine("[E1207 08:13:11.160 c_shim_cpu.cpp:594] Exception in aoti_torch: mat1 and mat2");
  std::string other;
  std::thread([&other] { other = TakeLibraryError(); }).join();
  EXPECT_EQ(other, "");
  EXPECT_EQ(TakeLibraryError(), "ValueError: refuses values below -1e6");
  EXPECT_EQ(TakeLibraryError(), "");
}

TEST(LibraryErrors, AForgottenExceptionIsNotTheNextRunsAndALongOneIsCut) {
  NoteLibraryLine("Exception in aoti_torch: an earlier run's");
  ForgetLibraryErrors();
  NoteLibraryLine("Exception in aoti_torch: " + std::string(2000, 'x'));
  EXPECT_EQ(TakeLibraryError(), std::string(512, 'x'));
}

}  // namespace
}  // namespace precompile
