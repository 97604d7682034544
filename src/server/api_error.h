// ApiError: a request the server refuses, with its HTTP status and the field at fault. Handlers
// throw it at the edge (parsing, validation) and the HTTP layer turns it into OpenAI's error body
// {"error": {"message", "type", "param", "code"}}; the server keeps serving.
#pragma once

#include <string>
#include <utility>

#include "core/error.h"

namespace nibble {

class ApiError : public Error {
 public:
  ApiError(int status, std::string param, const std::string& message)
      : Error(message), status_(status), param_(std::move(param)) {}
  int status() const { return status_; }
  const std::string& param() const { return param_; }  // empty when no single field is at fault

 private:
  int status_;
  std::string param_;
};

// reject(400, "temperature", "temperature must be in [0, 2], got ", t)
template <typename... Args>
[[noreturn]] void reject(int status, std::string param, Args&&... args) {
  throw ApiError(status, std::move(param), cat(std::forward<Args>(args)...));
}

// OpenAI's error body for `status`; `type` and `code` follow from the status.
std::string error_body(int status, const std::string& message, const std::string& param = {});

}  // namespace nibble
