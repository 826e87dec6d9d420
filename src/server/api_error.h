// An error the HTTP API reports to the client, in OpenAI's shape:
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
// Thrown by request parsing and the handlers; the session turns it into the response.
#pragma once

#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace kiln::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string type, const std::string& message, std::string param = "", std::string code = "")
      : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)),
        code(std::move(code)) {}
  int status;        // HTTP status
  std::string type;  // invalid_request_error, authentication_error, server_error, ...
  std::string param;  // the request field at fault, "" for none
  std::string code;   // a machine-readable code, "" for none
  int retry_after_s = 0;  // > 0: sent as Retry-After (429, 503)

  nlohmann::json body() const;
};

inline ApiError bad_request(const std::string& message, const std::string& param = "", const std::string& code = "") {
  return ApiError(400, "invalid_request_error", message, param, code);
}
inline ApiError overloaded(int status, const std::string& message, int retry_after_s = 1) {
  ApiError e(status, status == 429 ? "rate_limit_error" : "service_unavailable", message);
  e.retry_after_s = retry_after_s;
  return e;
}

}  // namespace kiln::server
