// memscope capture's Python start-up module (capture/sitecustomize.py),
// embedded into the binary at build time (cmake/embed.cmake). `memscope
// capture` writes it into the run directory as
// RUN/.memscope-capture/sitecustomize.py; what it does is said at its top.
#ifndef MEMSCOPE_CAPTURE_MODULE_H_
#define MEMSCOPE_CAPTURE_MODULE_H_

#include <string_view>

namespace memscope {

std::string_view CaptureModule();  // the text of capture/sitecustomize.py

}  // namespace memscope

#endif  // MEMSCOPE_CAPTURE_MODULE_H_
