// Flattening a step into a ForwardBatch and sampling.
#include "engine/model_runner.h"

#include <algorithm>
#include <cstdint>

namespace nibble {
namespace {

int64_t max_blocks_per_seq(const Model& model, int64_t num_blocks, int64_t block_size, const RunnerOptions& o) {
  const int64_t context = o.max_context > 0 ? o.max_context : model.config().max_position_embeddings;
  return std::min(num_blocks, (std::max<int64_t>(context, 1) + block_size - 1) / block_size);
}

bool is_decode(const std::vector<ScheduledSeq>& step) {
  return std::all_of(step.begin(), step.end(), [](const ScheduledSeq& s) {
    return s.new_tokens == 1 && s.samples && s.seq->num_computed_tokens > 0;
  });
}

// The penalties of the step's sampling sequences that have any, applied to their rows of logits (R
// rows in the order of the sampling sequences, then padding).
void penalize(Ops& ops, const std::vector<ScheduledSeq>& step, Tensor logits) {
  if (std::none_of(step.begin(), step.end(), [](const ScheduledSeq& s) { return s.samples && s.seq->adjusts_logits(); }))
    return;  // the usual step: no host work
  const int64_t rows = logits.dim(0);
  std::vector<int32_t> offsets{0}, tokens, generated;
  std::vector<float> bias;
  Tensor penalties = Tensor::zeros(DType::kF32, {rows, 3});
  for (int64_t r = 0; r < rows; ++r) penalties.data<float>()[r * 3] = 1.0f;
  int64_t r = 0;
  for (const ScheduledSeq& s : step) {
    if (!s.samples) continue;
    const Penalties& p = s.seq->params().sampling.penalties;
    if (s.seq->adjusts_logits()) {
      float* row = penalties.data<float>() + r * 3;
      row[0] = p.repetition, row[1] = p.frequency, row[2] = p.presence;
      for (const SeenToken& t : s.seq->seen_tokens())
        tokens.push_back(t.token), generated.push_back(t.generated), bias.push_back(t.bias);
    }
    offsets.push_back(static_cast<int32_t>(tokens.size()));
    ++r;
  }
  if (tokens.empty()) return;
  offsets.resize(static_cast<std::size_t>(rows) + 1, offsets.back());  // padding rows: none
  auto host_i32 = [](const std::vector<int32_t>& v) {
    Tensor t = Tensor::zeros(DType::kI32, {static_cast<int64_t>(v.size())});
    std::copy(v.begin(), v.end(), t.data<int32_t>());
    return t;
  };
  Tensor host_bias = Tensor::zeros(DType::kF32, {static_cast<int64_t>(bias.size())});
  std::copy(bias.begin(), bias.end(), host_bias.data<float>());
  ops.penalize(logits, {.row_offsets = ops.upload(host_i32(offsets)),
                        .tokens = ops.upload(host_i32(tokens)),
                        .generated = ops.upload(host_i32(generated)),
                        .bias = ops.upload(host_bias),
                        .penalties = ops.upload(penalties)});
}

}  // namespace

ModelRunner::ModelRunner(Model& model, int64_t num_blocks, int64_t block_size, KvCacheDType kv_dtype,
                         RunnerOptions options)
    : model_(model),
      cache_(model.allocate_kv_cache(num_blocks + 1, block_size, kv_dtype)),
      graphs_(model, cache_, options.cuda_graphs == CudaGraphs::kOn ? options.max_graph_batch : 0,
              max_blocks_per_seq(model, num_blocks, block_size, options), static_cast<int32_t>(num_blocks)) {}

std::vector<int32_t> ModelRunner::sample(const std::vector<ScheduledSeq>& step, const Tensor& logits) {
  Ops& ops = model_.ops();
  const int64_t rows = logits.dim(0);
  // The raw rows of the sequences that want log-probabilities, before the penalties change them.
  std::vector<std::vector<float>> raw;
  if (std::any_of(step.begin(), step.end(), [](const ScheduledSeq& s) { return s.samples && s.seq->params().logprobs >= 0; })) {
    const Tensor host = logits.device() == Device::kCpu ? logits : ops.download(logits);
    const int64_t V = host.dim(1);
    int64_t r = 0;
    for (const ScheduledSeq& s : step) {
      if (!s.samples) continue;
      const float* row = host.data<float>() + r++ * V;
      raw.emplace_back(s.seq->params().logprobs >= 0 ? std::vector<float>(row, row + V) : std::vector<float>());
    }
  }
  penalize(ops, step, logits);  // the logits' storage, in place
  Tensor ids = ops.empty(DType::kI32, {rows});
  const bool greedy = std::all_of(step.begin(), step.end(),
                                  [](const ScheduledSeq& s) { return !s.samples || s.seq->sampler.greedy(); });
  if (greedy) {
    ops.argmax(logits, ids);
  } else {  // each row's temperature, key, top-k and top-p; padding rows take the argmax
    Tensor temperatures = Tensor::zeros(DType::kF32, {rows}), keys = Tensor::zeros(DType::kI64, {rows});
    Tensor top_k = Tensor::zeros(DType::kI32, {rows}), top_p = Tensor::zeros(DType::kF32, {rows});
    std::fill_n(top_p.data<float>(), rows, 1.0f);
    bool filtered = false;
    int64_t r = 0;
    for (const ScheduledSeq& s : step) {
      if (!s.samples) continue;
      Sampler& sampler = s.seq->sampler;
      if (!sampler.greedy()) {
        temperatures.data<float>()[r] = sampler.temperature();
        keys.data<int64_t>()[r] = static_cast<int64_t>(sampler.next_key());
        top_k.data<int32_t>()[r] = static_cast<int32_t>(std::min<int64_t>(sampler.top_k(), INT32_MAX));
        top_p.data<float>()[r] = sampler.top_p();
        filtered = filtered || sampler.top_k() > 0 || sampler.top_p() < 1.0f;
      }
      ++r;
    }
    ops.sample(logits,
               {.temperatures = ops.upload(temperatures),
                .keys = ops.upload(keys),
                .top_k = filtered ? ops.upload(top_k) : Tensor(),
                .top_p = filtered ? ops.upload(top_p) : Tensor()},
               ids);
  }
  const Tensor host = ops.download(ids);  // R ids, not R × vocab logits
  std::vector<int32_t> sampled;
  for (const ScheduledSeq& s : step) {
    if (!s.samples) continue;
    const int32_t token = host.data<int32_t>()[sampled.size()];
    if (s.seq->params().logprobs >= 0)
      s.seq->last_logprobs = token_logprobs(raw[sampled.size()], token, s.seq->params().logprobs);
    sampled.push_back(token);
  }
  return sampled;
}

std::vector<int32_t> ModelRunner::run_decode_graph(const std::vector<ScheduledSeq>& step) {
  const int64_t block_size = cache_.block_size;
  DecodeInputs in;
  for (const ScheduledSeq& s : step) {
    const Sequence& seq = *s.seq;
    const int64_t p = seq.num_computed_tokens;
    in.token_ids.push_back(seq.tokens()[p]);
    in.positions.push_back(static_cast<int32_t>(p));
    in.seq_lens.push_back(static_cast<int32_t>(p + 1));
    in.slot_mapping.push_back(static_cast<int32_t>(seq.block_table[p / block_size] * block_size + p % block_size));
    in.block_tables.emplace_back(seq.block_table.begin(), seq.block_table.end());
  }
  return sample(step, graphs_.run(in));
}

std::vector<int32_t> ModelRunner::run(const std::vector<ScheduledSeq>& step) {
  if (step.empty()) return {};
  if (is_decode(step) && graphs_.covers(static_cast<int64_t>(step.size()))) return run_decode_graph(step);
  const int64_t block_size = cache_.block_size;
  std::vector<int32_t> ids, positions, slots, query_start{0}, seq_lens, rows;
  std::size_t max_blocks = 1;
  for (const ScheduledSeq& s : step) max_blocks = std::max(max_blocks, s.seq->block_table.size());
  std::vector<int32_t> tables(step.size() * max_blocks, 0);
  int64_t max_query = 0, max_len = 0;
  // Prompt positions whose logits give prompt log-probabilities: (sequence, position, its row).
  struct PromptRow {
    Sequence* seq;
    int64_t position;
    int32_t row;
  };
  std::vector<PromptRow> prompt_rows;
  for (std::size_t i = 0; i < step.size(); ++i) {
    Sequence& seq = *step[i].seq;
    const int64_t begin = seq.num_computed_tokens, end = begin + step[i].new_tokens;
    if (seq.params().prompt_logprobs >= 0 && !seq.prompt_logprobs_sent)
      for (int64_t p = begin; p < std::min(end, seq.num_prompt_tokens() - 1); ++p)
        prompt_rows.push_back({&seq, p, static_cast<int32_t>(static_cast<int64_t>(ids.size()) + p - begin)});
    for (int64_t p = begin; p < end; ++p) {
      ids.push_back(seq.tokens()[p]);
      positions.push_back(static_cast<int32_t>(p));
      slots.push_back(static_cast<int32_t>(seq.block_table[p / block_size] * block_size + p % block_size));
    }
    query_start.push_back(static_cast<int32_t>(ids.size()));
    seq_lens.push_back(static_cast<int32_t>(end));
    std::copy(seq.block_table.begin(), seq.block_table.end(), tables.begin() + static_cast<std::ptrdiff_t>(i * max_blocks));
    if (step[i].samples) rows.push_back(static_cast<int32_t>(ids.size() - 1));
    max_query = std::max(max_query, step[i].new_tokens);
    max_len = std::max(max_len, end);
  }
  const auto sampling_rows = static_cast<int64_t>(rows.size());
  for (const PromptRow& r : prompt_rows) rows.push_back(r.row);  // after the sampling rows
  if (rows.empty()) rows.push_back(0);  // a step of prefill chunks only: logits of one row, unused
  Ops& ops = model_.ops();
  const auto T = static_cast<int64_t>(ids.size()), S = static_cast<int64_t>(step.size());
  const ForwardBatch batch{.num_tokens = T,
                           .num_seqs = S,
                           .token_ids = ops.upload(host_i32(ids, {T})),
                           .positions = ops.upload(host_i32(positions, {T})),
                           .query_start = ops.upload(host_i32(query_start, {S + 1})),
                           .seq_lens = ops.upload(host_i32(seq_lens, {S})),
                           .block_tables = ops.upload(host_i32(tables, {S, static_cast<int64_t>(max_blocks)})),
                           .slot_mapping = ops.upload(host_i32(slots, {T})),
                           .logit_rows = ops.upload(host_i32(rows, {static_cast<int64_t>(rows.size())})),
                           .max_query_len = max_query,
                           .max_seq_len = max_len};
  const Tensor logits = model_.forward(batch, cache_);
  if (!prompt_rows.empty()) {
    const int64_t X = static_cast<int64_t>(prompt_rows.size());
    const Tensor host = ops.download(logits.slice(sampling_rows, sampling_rows + X));
    const auto V = static_cast<std::size_t>(host.dim(1));
    for (int64_t x = 0; x < X; ++x) {
      Sequence& seq = *prompt_rows[static_cast<std::size_t>(x)].seq;
      const int64_t p = prompt_rows[static_cast<std::size_t>(x)].position;
      seq.prompt_logprobs.resize(static_cast<std::size_t>(seq.num_prompt_tokens()));
      seq.prompt_logprobs[static_cast<std::size_t>(p + 1)] =
          token_logprobs({host.data<float>() + x * static_cast<int64_t>(V), V}, seq.tokens()[static_cast<std::size_t>(p + 1)],
                         seq.params().prompt_logprobs);
    }
  }
  return sample(step, logits.slice(0, std::max<int64_t>(sampling_rows, 1)));
}

}  // namespace nibble
