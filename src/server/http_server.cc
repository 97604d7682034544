// Routes, authentication, error bodies and the thread pool of the HTTP server.
#include "server/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <functional>
#include <iostream>

#include "server/api_error.h"
#include "server/generation_handler.h"
#include "server/responses.h"

namespace nibble {
namespace {

using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;

void send_error(httplib::Response& res, int status, const std::string& message,
                const std::string& param = {}) {
  res.status = status;
  res.set_content(error_body(status, message, param), "application/json");
}

// Every handler's failures become OpenAI error bodies: ApiError with its status, anything else 500.
Handler guarded(Handler handler) {
  return [handler = std::move(handler)](const httplib::Request& req, httplib::Response& res) {
    try {
      handler(req, res);
    } catch (const ApiError& e) {
      send_error(res, e.status(), e.what(), e.param());
    } catch (const std::exception& e) {
      std::cerr << "nibble: " << req.method << " " << req.path << " failed: " << e.what() << "\n";
      send_error(res, 500, e.what());
    }
  };
}

Handler method_not_allowed(const char* allowed) {
  return [allowed](const httplib::Request& req, httplib::Response& res) {
    res.set_header("Allow", allowed);
    send_error(res, 405,
               cat("method ", req.method, " is not allowed on ", req.path, " (use ", allowed, ")"));
  };
}

// Constant-time comparison, so the key cannot be guessed byte by byte from response times.
bool same_key(const std::string& a, const std::string& b) {
  std::size_t diff = a.size() ^ b.size();
  for (std::size_t i = 0; i < std::max(a.size(), b.size()); ++i)
    diff |= static_cast<unsigned char>((i < a.size() ? a[i] : 0) ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

std::string status_message(int status) {
  switch (status) {
    case 400:
      return "bad request";
    case 404:
      return "not found";
    case 408:
      return "request timeout";
    case 413:
      return "payload too large";
    case 414:
      return "URI too long";
    case 415:
      return "unsupported media type";
    case 416:
      return "range not satisfiable";
    default:
      return cat("HTTP error ", status);
  }
}

bool authorized(const ServerOptions& o, const httplib::Request& req) {
  if (o.api_key.empty() || !req.path.starts_with("/v1/")) return true;
  const std::string header = req.get_header_value("Authorization");
  const std::string prefix = "Bearer ";
  return header.starts_with(prefix) && same_key(header.substr(prefix.size()), o.api_key);
}

}  // namespace

HttpServer::HttpServer(ServingContext context)
    : context_(context), server_(std::make_unique<httplib::Server>()) {
  httplib::Server& s = *server_;
  const ServingContext& c = context_;
  const std::size_t threads = c.options.num_threads;
  // httplib's default pool has one thread per core; every open stream holds one.
  s.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  s.set_payload_max_length(c.options.max_body_bytes);
  s.set_tcp_nodelay(true);
  // httplib's default sets SO_REUSEPORT, which lets a second server bind the same port and take
  // half its connections. SO_REUSEADDR alone: restarts reuse the port, a second server fails.
  s.set_socket_options([this](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    listen_socket_ = sock;  // the last one bound is the server's (bind() raises its backlog)
  });
  // How long a connection may stay idle, before its first request too: httplib closes it after
  // that, and a request sent later is answered with a reset. An idle connection holds its thread,
  // and stop() waits for every thread. 2 s dropped a test client whose request came 2 s after its
  // connect on a loaded CI machine; 5 s is httplib's and uvicorn's default.
  s.set_keep_alive_timeout(5);

  s.set_pre_routing_handler([&c](const httplib::Request& req, httplib::Response& res) {
    if (authorized(c.options, req)) return httplib::Server::HandlerResponse::Unhandled;
    res.set_header("WWW-Authenticate", "Bearer");
    send_error(res, 401, "a valid API key is required: send it as \"Authorization: Bearer KEY\"");
    return httplib::Server::HandlerResponse::Handled;
  });
  // Statuses httplib sets itself (404 no route, 413 body too large, 400 unreadable request) get
  // OpenAI's error body too; bodies set by our handlers are left alone.
  s.set_error_handler(httplib::Server::HandlerWithResponse(
      [&c](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        std::string message = status_message(res.status);
        if (res.status == 404) message = cat("no route for ", req.method, " ", req.path);
        if (res.status == 413)
          message = cat("the request body exceeds ", c.options.max_body_bytes, " bytes");
        send_error(res, res.status, message);
        return httplib::Server::HandlerResponse::Handled;
      }));
  s.set_logger([&c](const httplib::Request&, const httplib::Response& res) {
    c.metrics.count_response(res.status);
  });

  s.Post("/v1/completions", guarded([&c](const httplib::Request& req, httplib::Response& res) {
           handle_generation(c, Endpoint::kCompletion, req, res);
         }));
  s.Post("/v1/chat/completions", guarded([&c](const httplib::Request& req, httplib::Response& res) {
           handle_generation(c, Endpoint::kChat, req, res);
         }));
  s.Get("/v1/models", guarded([&c](const httplib::Request&, httplib::Response& res) {
          res.set_content(
              models_response(c.options.served_model_name, c.created, c.limits.context_length),
              "application/json");
        }));
  // vLLM's token endpoints (outside /v1, so no API key, as vLLM).
  auto check_model = [&c](const std::string& model) {
    const std::string& served = c.options.served_model_name;
    if (!model.empty() && model != served)
      reject(404, "model", "the model ", model, " does not exist; this server serves ", served);
  };
  s.Post("/tokenize", guarded([&c, check_model](const httplib::Request& req, httplib::Response& res) {
           const TokenizeRequest r = parse_tokenize_request(req.body);
           check_model(r.model);
           res.set_content(tokenize_response(tokenize(r, c.tokenizer, c.chat_template), c.limits.context_length),
                           "application/json");
         }));
  s.Post("/detokenize", guarded([&c, check_model](const httplib::Request& req, httplib::Response& res) {
           const DetokenizeRequest r = parse_detokenize_request(req.body);
           check_model(r.model);
           res.set_content(detokenize_response(detokenize(r, c.tokenizer, c.limits)), "application/json");
         }));
  s.Get("/health", [&c](const httplib::Request&, httplib::Response& res) {
    if (c.engine.healthy()) return res.set_content("{\"status\":\"ok\"}", "application/json");
    send_error(res, 503, "the engine has failed");
  });
  s.Get("/metrics", [&c](const httplib::Request&, httplib::Response& res) {
    res.set_content(c.metrics.render(), "text/plain; version=0.0.4");
  });
  for (const char* path : {"/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"})
    s.Get(path, method_not_allowed("POST"));
  for (const char* path : {"/v1/models", "/health", "/metrics"})
    s.Post(path, method_not_allowed("GET"));
}

HttpServer::~HttpServer() = default;

namespace {

// httplib listens with a backlog of 5, compiled into Debian's libcpp-httplib (its
// CPPHTTPLIB_LISTEN_BACKLOG only reaches code built with the header): 65 clients connecting at once
// to a loaded 2-core machine overflowed the queue and saw connection resets. Listening again on the
// same socket sets the backlog anew: 2048, as uvicorn's (the kernel caps it at net.core.somaxconn).
constexpr int kListenBacklog = 2048;

void raise_backlog(int sock) {
  int listening = 0;
  socklen_t size = sizeof listening;
  if (sock < 0 || getsockopt(sock, SOL_SOCKET, SO_ACCEPTCONN, &listening, &size) != 0 || !listening) return;
  if (::listen(sock, kListenBacklog) != 0)
    std::cerr << "nibble serve: could not raise the listen backlog: " << std::strerror(errno) << "\n";
}

}  // namespace

int HttpServer::bind() {
  const ServerOptions& o = context_.options;
  int port = o.port;
  if (port == 0) {
    port = server_->bind_to_any_port(o.host);
    check(port > 0, "cannot listen on ", o.host, ": no free port");
  } else {
    check(server_->bind_to_port(o.host, o.port), "cannot listen on ", o.host, ":", o.port,
          " (in use, or not an address of this machine)");
  }
  raise_backlog(listen_socket_);
  return port;
}

void HttpServer::serve() {
  server_->listen_after_bind();
}

void HttpServer::stop() {
  server_->stop();
}

}  // namespace nibble
