#include "core/check.h"

namespace kiln {

const char* errc_name(Errc code) {
  switch (code) {
    case Errc::invalid_argument: return "invalid argument";
    case Errc::invalid_model: return "invalid model";
    case Errc::unsupported: return "unsupported";
    case Errc::io: return "i/o error";
    case Errc::cuda: return "cuda error";
    case Errc::unavailable: return "unavailable";
    case Errc::internal: return "internal error";
  }
  return "error";
}

void throw_error(Errc code, std::string message) { throw Error(code, message); }

}  // namespace kiln
