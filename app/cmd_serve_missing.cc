// `nibble serve` in a build without cpp-httplib (the HTTP server was not built).
#include "commands.h"
#include "core/error.h"

namespace nibble {

int run_serve(const Commands&) {
  fail("this nibble was built without the HTTP server: install libcpp-httplib-dev and rebuild");
}

}  // namespace nibble
