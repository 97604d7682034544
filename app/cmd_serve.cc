// `nibble serve`: load the model, run the engine loop on its own thread and serve the OpenAI API
// until SIGINT or SIGTERM, then finish every open request (reason "abort") and exit 0.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <functional>
#include <iostream>
#include <mutex>
#include <thread>

#include "commands.h"
#include "engine/engine.h"
#include "server/async_engine.h"
#include "server/http_server.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace nibble {
namespace {

constexpr int64_t kBlockSize = 16;

void check_serve_flags(const ServeOptions& s) {
  check(s.chunked_prefill_size == -1 || s.chunked_prefill_size >= 1,
        "--chunked-prefill-size must be positive or -1, got ", s.chunked_prefill_size);
}

// The KV cache takes what memory allows next to the weights (or --max-total-tokens), leaving room for
// the largest step: a prefill chunk (the whole context without chunking) and a logit row per request.
EngineConfig engine_config(const ServeOptions& s, const LoadedModel& loaded, const ModelOptions& model) {
  const int64_t largest_step = s.chunked_prefill_size == -1
                                   ? loaded.model->config().max_position_embeddings
                                   : s.chunked_prefill_size;
  const int64_t tokens = kv_cache_tokens(loaded, model,
                                         {.block_size = kBlockSize,
                                          .largest_step_tokens = largest_step,
                                          .max_logit_rows = s.max_running_requests,
                                          .min_tokens = kBlockSize});
  const int64_t chunk = s.chunked_prefill_size == -1 ? tokens : s.chunked_prefill_size;
  return {.num_blocks = tokens / kBlockSize,
          .block_size = kBlockSize,
          .scheduler = {.max_running = s.max_running_requests, .max_batched_tokens = chunk},
          .cuda_graphs = model.cuda_graphs()};
}

// SIGINT and SIGTERM are blocked in every thread (the mask is set before any thread starts, and
// threads inherit it) and taken here, off any signal handler. Until the server is up a signal just
// ends the process; after that it runs the shutdown given to serving().
class SignalWatcher {
 public:
  SignalWatcher() {
    sigset_t set = signals();
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    thread_ = std::thread([this, set] {
      const timespec poll{.tv_sec = 0, .tv_nsec = 200'000'000};
      while (!closing_) {
        if (sigtimedwait(&set, nullptr, &poll) <= 0) continue;
        std::lock_guard lock(mutex_);
        if (!on_signal_) {
          std::cerr << "nibble: interrupted\n";
          std::_Exit(130);
        }
        std::cerr << "nibble: shutting down\n";
        on_signal_();
        return;
      }
    });
  }
  ~SignalWatcher() {
    closing_ = true;
    thread_.join();
  }
  void serving(std::function<void()> shutdown) {
    std::lock_guard lock(mutex_);
    on_signal_ = std::move(shutdown);
  }

 private:
  static sigset_t signals() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    return set;
  }

  std::mutex mutex_;
  std::function<void()> on_signal_;
  std::atomic<bool> closing_{false};
  std::thread thread_;
};

}  // namespace

int run_serve(const Commands& c) {
  SignalWatcher watcher;     // first: before any other thread starts
  signal(SIGPIPE, SIG_IGN);  // a client that hangs up must not kill the server

  ServerOptions options{.host = c.serve_options.host,
                        .port = c.serve_options.port,
                        .api_key = c.serve_options.api_key,
                        .served_model_name = c.serve_options.served_model_name.empty()
                                                 ? c.model.model_path
                                                 : c.serve_options.served_model_name};
  check(std::filesystem::is_directory(c.model.model_path), "model directory ", c.model.model_path,
        " does not exist");
  check_serve_flags(c.serve_options);  // flag errors before the long load
  const Tokenizer tokenizer = Tokenizer::load(tokenizer_dir(c.model));
  const ChatTemplate chat_template = ChatTemplate::from_tokenizer_config(tokenizer_dir(c.model));
  if (chat_template.is_fallback())
    std::cerr << "nibble: the model has no chat template; /v1/chat/completions uses ChatML\n";
  LoadedModel loaded = load_model(c.model);
  EngineConfig config = engine_config(c.serve_options, loaded, c.model);
  config.kv_dtype = loaded.kv_dtype;
  Engine engine(*loaded.model, config);
  Metrics metrics;
  AsyncEngine async_engine(engine, metrics);
  const ModelConfig& mc = loaded.model->config();
  HttpServer server({.options = options,
                     .engine = async_engine,
                     .metrics = metrics,
                     .tokenizer = tokenizer,
                     .chat_template = chat_template,
                     .limits = {.context_length = mc.max_position_embeddings,
                                .kv_capacity = config.num_blocks * config.block_size,
                                .vocab_size = mc.vocab_size},
                     .created = static_cast<int64_t>(std::time(nullptr))});
  const int port = server.bind();
  watcher.serving([&] {
    async_engine.shutdown();  // open requests finish now, so their handlers return
    server.stop();
  });
  std::cout << "nibble: serving " << options.served_model_name << " at http://" << options.host
            << ":" << port << std::endl;
  server.serve();
  watcher.serving(nullptr);  // what the shutdown refers to is about to go
  async_engine.shutdown();
  return 0;
}

}  // namespace nibble
