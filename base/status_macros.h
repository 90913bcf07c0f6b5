// RETURN_IF_ERROR and ASSIGN_OR_RETURN, which Debian's abseil (20220623)
// does not ship yet.
#ifndef PRECOMPILE_BASE_STATUS_MACROS_H_
#define PRECOMPILE_BASE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Returns `expr`'s status from the enclosing function if it is not OK.
#define RETURN_IF_ERROR(expr)                                   \
  do {                                                          \
    ::absl::Status precompile_status_ = (expr);                 \
    if (!precompile_status_.ok()) return precompile_status_;    \
  } while (false)

#define PRECOMPILE_CONCAT_INNER_(a, b) a##b
#define PRECOMPILE_CONCAT_(a, b) PRECOMPILE_CONCAT_INNER_(a, b)

// Evaluates `rexpr` (an absl::StatusOr<T>); returns its status if not OK,
// else moves the value into `lhs` (a declaration or an lvalue).
#define ASSIGN_OR_RETURN(lhs, rexpr)                                       \
  PRECOMPILE_ASSIGN_OR_RETURN_IMPL_(                                       \
      PRECOMPILE_CONCAT_(precompile_statusor_, __LINE__), lhs, rexpr)

#define PRECOMPILE_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                      \
  if (!statusor.ok()) return std::move(statusor).status();      \
  lhs = std::move(statusor).value()

#endif  // PRECOMPILE_BASE_STATUS_MACROS_H_
