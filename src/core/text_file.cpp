#include "core/text_file.h"

#include <fstream>
#include <iterator>

#include "core/check.h"

namespace kiln {

std::string read_text_file(const std::string& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK(in.good(), io, "cannot read {} '{}'", what, path);
  std::string text(std::istreambuf_iterator<char>(in), {});
  KILN_CHECK(!in.bad(), io, "error reading {} '{}'", what, path);
  return text;
}

}  // namespace kiln
