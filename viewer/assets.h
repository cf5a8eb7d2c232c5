// The HTML report's page files (viewer/report.html, report.css, report.js),
// embedded into the binary at build time (cmake/embed.cmake). The template
// holds three markers that viewer/html_report.cpp replaces: the CSS, the
// script, and the report data (JSON).
#ifndef MEMSCOPE_VIEWER_ASSETS_H_
#define MEMSCOPE_VIEWER_ASSETS_H_

#include <string_view>

namespace memscope::viewer {

inline constexpr std::string_view kStyleMarker = "/*@MEMSCOPE_CSS@*/";
inline constexpr std::string_view kScriptMarker = "/*@MEMSCOPE_JS@*/";
inline constexpr std::string_view kDataMarker = "@MEMSCOPE_DATA@";

std::string_view PageTemplate();  // report.html
std::string_view PageStyle();     // report.css
std::string_view PageScript();    // report.js

}  // namespace memscope::viewer

#endif  // MEMSCOPE_VIEWER_ASSETS_H_
