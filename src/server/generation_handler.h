// The handler of POST /v1/completions and /v1/chat/completions: parse, prepare, run the request on
// the engine, and answer whole or as a Server-Sent Event stream. A streaming client that goes away
// is noticed at the next write (or keep-alive comment) and its request aborted.
#pragma once

#include <httplib.h>

#include "server/http_server.h"
#include "server/protocol.h"

namespace nibble {

// Throws ApiError for a bad request (before anything is sent).
void handle_generation(const ServingContext& context, Endpoint endpoint,
                       const httplib::Request& request, httplib::Response& response);

}  // namespace nibble
