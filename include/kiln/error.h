// kiln's one error type. Library code throws kiln::Error; only main() decides to exit.
#pragma once

#include <stdexcept>
#include <string>

namespace kiln {

enum class Errc {
  invalid_argument,  // a caller passed an impossible parameter
  invalid_model,     // a model file is corrupt, truncated or inconsistent
  unsupported,       // valid input that kiln does not handle (yet)
  io,                // the operating system refused (open, mmap, read)
  cuda,              // a CUDA or cuBLAS call failed
  unavailable,       // the engine is overloaded (queue full), draining, or unhealthy: retry later
  internal,          // a broken invariant: a bug in kiln
};

const char* errc_name(Errc code);

class Error : public std::runtime_error {
 public:
  Error(Errc code, const std::string& message) : std::runtime_error(message), code_(code) {}
  Errc code() const { return code_; }

 private:
  Errc code_;
};

}  // namespace kiln
