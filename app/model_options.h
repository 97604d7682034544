// The flags every model command shares (--model-path, --quantization, --kv-cache-dtype, --device,
// --tp-size), and loading a model from them with progress on stderr.
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "format/model_config.h"
#include "model/kv_cache.h"
#include "model/loader.h"
#include "model/model.h"

namespace nibble {

struct ModelOptions {
  std::string model_path;
  std::string quantization = "auto";
  std::string kv_cache_dtype = "auto";
  std::string device = "cpu";
  int tp_size = 1;
};

void add_model_options(CLI::App& command, ModelOptions& options);

struct LoadedModel {
  std::unique_ptr<Ops> ops;
  std::unique_ptr<Model> model;
  Quantization quantization = Quantization::kNone;
  KvCacheDType kv_dtype = KvCacheDType::kBf16;
};

LoadedModel load_model(const ModelOptions& options);

}  // namespace nibble
