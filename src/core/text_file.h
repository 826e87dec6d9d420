// A whole file read into a string, with kiln's io errors: what the CLI's --file options, the model
// loaders' JSON and template files and the tests read.
#pragma once

#include <string>
#include <string_view>

namespace kiln {

// The bytes of `path`. Throws kiln::Error(io) naming `what` and the path when the file cannot be
// opened or read.
std::string read_text_file(const std::string& path, std::string_view what = "file");

}  // namespace kiln
