#include "backend/backend.h"

#include <algorithm>

#include "core/argmax.h"
#include "core/check.h"

namespace kiln {

void KvSequence::truncate(int64_t n) {
  KILN_CHECK(n >= 0 && n <= n_past_, invalid_argument, "cannot truncate a sequence of {} tokens to {}", n_past_, n);
  n_past_ = n;
}

void Backend::check_forward(const KvSequence& seq, std::span<const int32_t> tokens) const {
  const int64_t n = int64_t(tokens.size()), vocab = config().vocab_size;
  KILN_CHECK(n > 0, invalid_argument, "forward needs at least one token");
  KILN_CHECK(seq.n_past() + n <= seq.capacity(), invalid_argument,
             "{} cached + {} new tokens exceed the sequence's KV capacity of {}", seq.n_past(), n, seq.capacity());
  for (int32_t t : tokens)
    KILN_CHECK(t >= 0 && t < vocab, invalid_argument, "token id {} is outside the vocabulary [0, {})", t, vocab);
}

void Backend::forward(KvSequence& seq, std::span<const int32_t> tokens, bool all_logits, std::vector<float>& logits) {
  check_forward(seq, tokens);
  forward_impl(seq, tokens, all_logits, logits);
}

std::span<float> Backend::forward_last(KvSequence& seq, std::span<const int32_t> tokens) {
  check_forward(seq, tokens);
  return forward_last_impl(seq, tokens);
}

std::span<float> Backend::forward_last_impl(KvSequence& seq, std::span<const int32_t> tokens) {
  forward_impl(seq, tokens, false, last_logits_);
  return last_logits_;
}

std::string_view kv_cache_format_name(KvCacheFormat f) {
  switch (f) {
    case KvCacheFormat::native: return "native";
    case KvCacheFormat::bf16: return "bf16";
    case KvCacheFormat::int8: return "int8";
    case KvCacheFormat::fp8: return "fp8";
  }
  return "?";
}

KvCacheFormat parse_kv_cache_format(std::string_view name) {
  for (KvCacheFormat f : {KvCacheFormat::native, KvCacheFormat::bf16, KvCacheFormat::int8, KvCacheFormat::fp8})
    if (name == kv_cache_format_name(f)) return f;
  KILN_FAIL(invalid_argument, "--kv-cache must be bf16, int8 or fp8, got '{}'", name);
}

void Backend::set_kv_cache_format(KvCacheFormat f) {
  KILN_CHECK(supports_kv_cache_format(f), unsupported, "a {} KV cache is not supported on {} yet", kv_cache_format_name(f),
             name());
  kv_cache_format_ = f;
}

int64_t Backend::default_kv_cache_bytes(double) const { return int64_t(1) << 30; }

std::unique_ptr<KvPool> Backend::new_kv_pool(int32_t, int32_t) {
  KILN_FAIL(unsupported, "the {} backend does not run batched steps over a paged KV cache yet", name());
}

void Backend::host_argmax(const std::vector<float>& logits, std::vector<int32_t>& argmax) const {
  const size_t vocab = size_t(config().vocab_size), rows = logits.size() / vocab;
  argmax.resize(rows);
  for (size_t r = 0; r < rows; ++r)
    argmax[r] = std::max(kiln::argmax(std::span<const float>(logits).subspan(r * vocab, vocab)), 0);
}

void Backend::forward_batch_impl(KvPool&, std::span<const BatchEntry>, std::vector<float>&, std::vector<int32_t>*) {
  KILN_FAIL(unsupported, "the {} backend does not run batched steps over a paged KV cache yet", name());
}

int64_t Backend::kv_bytes_per_token() const {
  const ModelConfig& c = config();
  return 2 * int64_t(c.n_layers) * c.kv_dim() * kv_bytes_per_element();
}

int32_t Backend::kv_blocks_for_budget(int64_t budget_bytes, int32_t block_size) const {
  KILN_CHECK(block_size > 0, invalid_argument, "block size must be positive, got {}", block_size);
  const int64_t per_block = kv_bytes_per_token() * block_size;
  return int32_t(std::min<int64_t>(std::max<int64_t>(budget_bytes, 0) / per_block, INT32_MAX));
}

void Backend::forward_batch(KvPool& pool, std::span<const BatchEntry> entries, std::vector<float>& logits,
                            std::vector<int32_t>* argmax) {
  const int64_t vocab = config().vocab_size, bs = pool.block_size();
  KILN_CHECK(!entries.empty(), invalid_argument, "forward_batch needs at least one entry");
  std::vector<int64_t> slots;  // every KV slot this step writes
  for (size_t e = 0; e < entries.size(); ++e) {
    const BatchEntry& b = entries[e];
    const int64_t n = int64_t(b.tokens.size()), end = b.first_position + n;
    KILN_CHECK(n > 0 && b.first_position >= 0, invalid_argument, "batch entry {} has no tokens or a negative position",
               e);
    KILN_CHECK(int64_t(b.block_table.size()) * bs >= end, invalid_argument,
               "batch entry {}: {} blocks of {} tokens cannot hold positions up to {}", e, b.block_table.size(), bs,
               end - 1);
    for (int32_t t : b.tokens)
      KILN_CHECK(t >= 0 && t < vocab, invalid_argument, "token id {} is outside the vocabulary [0, {})", t, vocab);
    for (int64_t i = 0; i < (end + bs - 1) / bs; ++i) {
      const int32_t block = b.block_table[size_t(i)];
      KILN_CHECK(block >= 0 && block < pool.num_blocks(), invalid_argument,
                 "batch entry {}: block id {} is outside the pool of {} blocks", e, block, pool.num_blocks());
    }
    for (int64_t p = b.first_position; p < end; ++p) slots.push_back(int64_t(b.block_table[size_t(p / bs)]) * bs + p % bs);
  }
  std::sort(slots.begin(), slots.end());
  const auto twice = std::adjacent_find(slots.begin(), slots.end());
  KILN_CHECK(twice == slots.end(), invalid_argument, "two batch entries write KV slot {} in one step",
             twice == slots.end() ? 0 : *twice);
  forward_batch_impl(pool, entries, logits, argmax);
}

}  // namespace kiln
