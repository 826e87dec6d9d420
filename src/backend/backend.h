// The interface every compute backend implements. Two ways to run the model:
//
//  * forward(KvSequence&): a chunk of tokens of one sequence with its own private cache (kiln run,
//    kiln bench, golden tests);
//  * forward_batch(KvPool&, entries): one step of continuous batching. Many sequences, each a
//    prompt chunk or one decode token, share one paged KV pool; each entry names the blocks that
//    hold its positions (block_table[p / block_size], slot p % block_size), as vLLM's block
//    tables do. The scheduler (runtime/scheduler.h) decides the entries; the backend only computes.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/sampling.h"
#include "model/config.h"

namespace kiln {

// A sequence's KV cache on some backend. n_past tokens are cached; capacity is the most it holds.
class KvSequence {
 public:
  virtual ~KvSequence() = default;
  int64_t n_past() const { return n_past_; }
  int64_t capacity() const { return capacity_; }
  // Forgets cached tokens past n (n <= n_past): a rollback, or a reset with n = 0.
  void truncate(int64_t n);

 protected:
  explicit KvSequence(int64_t capacity) : capacity_(capacity) {}
  int64_t n_past_ = 0;
  int64_t capacity_ = 0;
};

// A backend's paged KV cache: num_blocks blocks, each holding the keys and values of block_size
// consecutive positions of one sequence, for every layer.
class KvPool {
 public:
  virtual ~KvPool() = default;
  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size() const { return block_size_; }

 protected:
  KvPool(int32_t num_blocks, int32_t block_size) : num_blocks_(num_blocks), block_size_(block_size) {}
  int32_t num_blocks_;
  int32_t block_size_;
};

// How a backend's KV caches store keys and values. native: the backend's own precision (fp32 on the
// CPU reference, bf16 on CUDA); bf16: rounded to bf16; int8 / fp8 (E4M3): one scale per (token, KV
// head), amax / 127 or amax / 448 (docs/QUANTIZATION.md).
enum class KvCacheFormat : uint8_t { native, bf16, int8, fp8 };
std::string_view kv_cache_format_name(KvCacheFormat f);
// "bf16", "int8", "fp8" (and "native"); kiln::Error(invalid_argument) for anything else.
KvCacheFormat parse_kv_cache_format(std::string_view name);

// One sequence's share of a forward_batch step.
struct BatchEntry {
  std::span<const int32_t> tokens;       // run at positions first_position, first_position + 1, ...
  int64_t first_position = 0;            // tokens of this sequence already in the pool
  std::span<const int32_t> block_table;  // covers positions 0 .. first_position + tokens.size() - 1
  bool want_logits = false;              // logits of this entry's last token
  // With want_logits, when the caller asks forward_batch for argmax ids: only the argmax of this
  // row is needed (greedy sampling without logprobs), so a GPU backend computes it on the device
  // and skips copying the row's logits to the host (128k floats a row for Llama 3).
  bool greedy = false;
  // With want_logits, on a backend that samples_on_device(), when the caller asks for ids: draw
  // this row's token there with these parameters (penalties over `history`, the draw numbered
  // `draw` of the request; kernels/cuda/sampling.h says which cases are exact), and do not send
  // the row's logits back. nullptr: the caller samples from the logits.
  const SamplingParams* sampling = nullptr;
  std::span<const int32_t> history = {};
  uint64_t draw = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual const ModelConfig& config() const = 0;
  virtual std::unique_ptr<KvSequence> new_sequence(int64_t capacity) = 0;
  // Runs tokens at positions seq.n_past() ... and advances n_past. logits gets vocab_size floats
  // per token when all_logits, else for the last token only. Checks the request (at least one
  // token, within the sequence's capacity, ids inside the vocabulary) for every backend alike,
  // then runs forward_impl.
  void forward(KvSequence& seq, std::span<const int32_t> tokens, bool all_logits, std::vector<float>& logits);
  // forward() for the last token's logits only, returned as a view of memory the backend owns: valid,
  // and writable (the samplers mask and scale logits in place), until the backend's next forward or
  // forward_last. What a decode loop reads each step (kiln run's generator, kiln bench's tg), as
  // llama.cpp's llama_get_logits points into its own output buffer: the CUDA backend's decode step
  // hands over the pinned buffer its graph copies the logits into, where copying them on into a
  // vector cost 40-60 µs a token on the H200's host, 1.4-2.2% of tg128 (docs/performance/decode-step.md,
  // session 40).
  std::span<float> forward_last(KvSequence& seq, std::span<const int32_t> tokens);

  // How caches made from now on store K and V; kiln::Error(unsupported) naming the backend for a
  // format it cannot store yet. Set it before new_sequence / new_kv_pool (or an Engine).
  void set_kv_cache_format(KvCacheFormat f);
  KvCacheFormat kv_cache_format() const { return kv_cache_format_; }

  // Bytes of KV cache one token takes (all layers, K and V): what a pool of N blocks costs.
  virtual int64_t kv_bytes_per_token() const;
  virtual int64_t kv_bytes_per_element() const { return 2; }  // 4 for fp32 (CPU), 2 for bf16 (CUDA)
  // How many blocks of block_size tokens fit in `budget_bytes`.
  int32_t kv_blocks_for_budget(int64_t budget_bytes, int32_t block_size) const;
  // Backends that cannot batch yet keep the defaults, which throw unsupported.
  virtual std::unique_ptr<KvPool> new_kv_pool(int32_t num_blocks, int32_t block_size);
  // The KV pool size an engine gets when the user names none: 1 GiB of host memory on the CPU;
  // a GPU backend returns gpu_memory_fraction of its free device memory.
  virtual int64_t default_kv_cache_bytes(double gpu_memory_fraction) const;
  // Total memory of the device the backend runs on (0 on the CPU): `kiln bench throughput` sizes its
  // default token budget by it, as vLLM's offline defaults do.
  virtual int64_t device_memory_bytes() const { return 0; }
  // Device memory a step of up to max_tokens tokens and max_seqs sequences allocates besides the
  // pool (its activations): the engine takes it out of the default pool size first, so the first
  // large step does not run out of memory the pool took (0 on the CPU, whose pool is host memory).
  virtual int64_t step_memory_bytes(int64_t max_tokens, int64_t max_seqs) const {
    (void)max_tokens, (void)max_seqs;
    return 0;
  }
  // Runs every entry's tokens, writing their K/V into the pool, and sets logits to one row of
  // vocab_size floats per entry with want_logits, in entry order. Checks the request for every
  // backend alike (tokens in the vocabulary, block tables covering the positions with ids inside
  // the pool, no two entries writing one slot) before forward_batch_impl. Entries are independent
  // sequences: the result for each is what forward() on that sequence alone would give (up to the
  // floating-point order of a batched matmul; see docs on batch invariance).
  // With `argmax` non-null it gets one id per logits row (the largest logit, the lowest id on
  // ties, NaN never), and rows of greedy entries may be left unfilled in `logits`; when every
  // entry with want_logits is greedy, `logits` may be left at any size (the CUDA backend does not
  // resize it: growing a vector to 2048 rows of 128k floats zero-fills 1 GB on the host).
  void forward_batch(KvPool& pool, std::span<const BatchEntry> entries, std::vector<float>& logits,
                     std::vector<int32_t>* argmax = nullptr);
  // Whether forward_batch draws the tokens of entries with `sampling` set itself (then `argmax`
  // holds the drawn id for those rows).
  virtual bool samples_on_device() const { return false; }

 protected:
  virtual void forward_batch_impl(KvPool& pool, std::span<const BatchEntry> entries, std::vector<float>& logits,
                                  std::vector<int32_t>* argmax);
  // Fills argmax from the logits on the host (core/argmax.h per row): for backends without a
  // device argmax.
  void host_argmax(const std::vector<float>& logits, std::vector<int32_t>& argmax) const;
  virtual void forward_impl(KvSequence& seq, std::span<const int32_t> tokens, bool all_logits,
                            std::vector<float>& logits) = 0;
  // forward_last after the checks; the default runs forward_impl into a vector the backend keeps.
  virtual std::span<float> forward_last_impl(KvSequence& seq, std::span<const int32_t> tokens);
  // The KV formats this backend stores; the default is only its native one.
  virtual bool supports_kv_cache_format(KvCacheFormat f) const { return f == KvCacheFormat::native; }

 private:
  // The checks forward and forward_last make before running anything.
  void check_forward(const KvSequence& seq, std::span<const int32_t> tokens) const;
  KvCacheFormat kv_cache_format_ = KvCacheFormat::native;
  std::vector<float> last_logits_;  // forward_last_impl's default: the view's memory
};

}  // namespace kiln
