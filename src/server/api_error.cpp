#include "server/api_error.h"

namespace kiln::server {

nlohmann::json ApiError::body() const {
  using nlohmann::json;
  return {{"error",
           {{"message", what()},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

}  // namespace kiln::server
