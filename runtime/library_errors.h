// What AOTInductor says of a failure it returns only as an error code.
//
// Compiled code calls libtorch through C shims that catch an exception,
// log "Exception in aoti_torch: <what>" to std::cerr on the failing thread,
// and return an error code; the run then fails without the exception. The
// server passes every line written to std::cerr to NoteLibraryLine, so a
// variant's run can say why it failed (an operator defined in Python that
// raised, say), not only that it did.
//
// Thread safety: each thread notes and takes its own.
#ifndef PRECOMPILE_RUNTIME_LIBRARY_ERRORS_H_
#define PRECOMPILE_RUNTIME_LIBRARY_ERRORS_H_

#include <string>

#include "absl/strings/string_view.h"

namespace precompile {

// Keeps `line`'s exception, if it is the shims' and the first since this
// thread's ForgetLibraryErrors().
void NoteLibraryLine(absl::string_view line);

// Forgets what this thread noted (a run begins).
void ForgetLibraryErrors();

// The first exception noted on this thread since ForgetLibraryErrors(), at
// most 512 bytes of its first line; "" for none. Forgets it.
std::string TakeLibraryError();

}  // namespace precompile

#endif  // PRECOMPILE_RUNTIME_LIBRARY_ERRORS_H_
