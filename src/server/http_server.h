// HttpServer: nibble's OpenAI-compatible HTTP API on cpp-httplib. POST /v1/completions and
// /v1/chat/completions (streamed as Server-Sent Events or whole), GET /v1/models, /health and
// /metrics, and vLLM's POST /tokenize and /detokenize. Bad requests get OpenAI's error body with the right 4xx; the server keeps serving.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "server/async_engine.h"
#include "server/metrics.h"
#include "server/prepare.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace httplib {
class Server;
}

namespace nibble {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 30000;                      // 0: any free port (bind() says which)
  std::string api_key;                   // empty: no authentication
  std::string served_model_name;         // the "model" of requests and responses
  std::size_t max_body_bytes = 8 << 20;  // larger bodies get 413
  std::size_t num_threads = 512;         // one per open connection, streams included
};

// What the handlers share; all of it outlives the server.
struct ServingContext {
  const ServerOptions& options;
  AsyncEngine& engine;
  Metrics& metrics;
  const Tokenizer& tokenizer;
  const ChatTemplate& chat_template;
  ModelLimits limits;
  int64_t created;  // when the server started, Unix seconds
};

class HttpServer {
 public:
  explicit HttpServer(ServingContext context);
  ~HttpServer();

  int bind();    // binds options.host:port; returns the port; fails with a clear message
  void serve();  // blocks until stop()
  void stop();   // safe from another thread

 private:
  ServingContext context_;
  std::unique_ptr<httplib::Server> server_;
  int listen_socket_ = -1;  // the listening socket, seen by the socket options callback
};

}  // namespace nibble
