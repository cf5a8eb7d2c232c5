// Status plumbing every layer uses.
//
//   absl::Status ReadHeader(...) {
//     MEMSCOPE_RETURN_IF_ERROR(ReadField("version", v));   // returns the error, if any
//     ...
//   }
#ifndef MEMSCOPE_BASE_STATUS_H_
#define MEMSCOPE_BASE_STATUS_H_

#include "absl/status/status.h"

// Evaluates `expr` (an absl::Status) once and returns it from the enclosing
// function when it is not OK.
#define MEMSCOPE_RETURN_IF_ERROR(expr)        \
  do {                                        \
    if (absl::Status s_ = (expr); !s_.ok()) { \
      return s_;                              \
    }                                         \
  } while (0)

#endif  // MEMSCOPE_BASE_STATUS_H_
