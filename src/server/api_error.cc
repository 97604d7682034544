// OpenAI's error body.
#include "server/api_error.h"

#include <nlohmann/json.hpp>

namespace nibble {

using json = nlohmann::ordered_json;

std::string error_body(int status, const std::string& message, const std::string& param) {
  const char* type = "invalid_request_error";
  const char* code = nullptr;
  switch (status) {
    case 401:
      type = "authentication_error";
      code = "invalid_api_key";
      break;
    case 404:
      type = "not_found_error";
      code = "not_found";
      break;
    case 405:
      code = "method_not_allowed";
      break;
    case 413:
      code = "request_too_large";
      break;
    case 503:
      type = "service_unavailable_error";
      break;
    default:
      if (status >= 500) type = "internal_server_error";
  }
  json error = {{"message", message}, {"type", type}};
  error["param"] = param.empty() ? json(nullptr) : json(param);
  error["code"] = code ? json(code) : json(status);
  return json({{"error", error}}).dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace nibble
