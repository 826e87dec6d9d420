// CudaBackend's continuous-batching step: the paged KV pool and forward_batch.
//
// Pool: CudaKvPool (cuda_kv_pool.h).
//
// A step (one host->device copy of packed int32 metadata, MetaLayout):
//   tokens (M) | positions (M) | slots (M) | kv_len (n_dec) | logit rows (R) | block tables (E, S)
// with the entries reordered: decode entries (one token) first, then prefill chunks, so the
// decode queries are rows 0 .. n_dec - 1 and their block-table rows 0 .. n_dec - 1 (one
// attention_decode launch), and prefill entry j owns rows row0 .. row0 + n - 1 and table row
// n_dec + j (one attention_prefill launch each, q_start = first_position). Logits: the residual
// rows of the wanted entries' last tokens are gathered (entry order), normed, and projected.
//
// Decode-only steps of at most kMaxGraphBatch entries always run padded, to B = the next power of
// two (batch bucket) and S = a power-of-two block-table width (at least 256 positions), whether
// or not graphs are on, so graph replay and eager runs compute the same shapes and give
// bit-identical logits. Padding rows: token 0 at position 0, slot 0 of the scratch block,
// kv_len 1, every table entry the scratch block; their logits are computed and dropped. With graphs on
// (and not profiling) the first step of a (B, S) shape runs eagerly (it also initializes every
// kernel's launch configuration outside capture), the second captures the graph, later ones
// replay it. All buffers the graphs read are owned by the pool and only grow; growing one drops
// the pool's graphs first.
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_kv_pool.h"
#include "core/argmax.h"
#include "core/check.h"
#include "core/env.h"
#include "kernels/cuda/sampling.h"

namespace kiln {

using cuda::bf16;
using cuda::DeviceBuffer;
using Impl = CudaBackend::Impl;

namespace {

constexpr int64_t kMaxGraphBatch = 256;  // decode steps above this run eagerly, unpadded
constexpr int64_t kMinGraphPositions = 256;  // the narrowest block-table width bucket, in positions

using cuda_backend::CudaKvPool;
using cuda_backend::pow2_at_least;

// Offsets (in int32s) of the packed step metadata; segments start 16-byte aligned. T: prefill
// query tiles (cuda::PrefillTile, 4 int32 each) of the one varlen prefill attention launch.
// compact (a quantized pool's varlen prefill): each entry's end position and its row of the
// compact bf16 copy's block table (kv_dequantize_rows).
struct MetaLayout {
  int64_t tokens = 0, positions = 0, slots = 0, kv_len = 0, rows = 0, tiles = 0, table = 0, ends = 0, ctable = 0,
          total = 0;
  MetaLayout(int64_t M, int64_t n_dec, int64_t R, int64_t E, int64_t S, int64_t T = 0, bool compact = false) {
    auto up = [](int64_t v) { return (v + 3) / 4 * 4; };
    positions = tokens + up(M);
    slots = positions + up(M);
    kv_len = slots + up(M);
    rows = kv_len + up(n_dec);
    tiles = rows + up(R);
    table = tiles + 4 * T;
    ends = table + up(E * S);
    ctable = ends + (compact ? up(E) : 0);
    total = ctable + (compact ? E * S : 0);
  }
};

// The prefill chunks of a mixed step go to attention in one varlen launch (cuda::
// attention_prefill_varlen) rather than one launch per chunk; KILN_PREFILL_VARLEN=0 keeps the
// per-chunk launches (for comparison).
bool prefill_varlen_enabled() {
  static const bool on = env_switch_on("KILN_PREFILL_VARLEN");
  return on;
}

// A quantized pool's varlen prefill reads its compact copy as contiguous rows with the wgmma
// kernel's varlen form where it runs (sm_90a, session 36); KILN_PREFILL_VARLEN_WGMMA=0 keeps the
// mma.sync kernel reading the copy through its block table (for comparison).
bool prefill_varlen_wgmma_enabled() {
  static const bool on = env_switch_on("KILN_PREFILL_VARLEN_WGMMA");
  return on;
}

// Copies a step's results to the host. `device_logits` holds one row per entry of `rows_entries`
// (entry index per row, in entry order). With `argmax`, the ids of every row come from the device
// (the argmax kernel, or sample_rows where an entry asked for device sampling) and only the rows of
// the other entries are copied; otherwise every row is. ids_ready: the greedy head already wrote every
// row's id (Impl::enqueue_head with a GreedyHead; every row greedy, no logits on the device).
void copy_out(Impl& m, CudaKvPool& pool, std::span<const BatchEntry> entries, const std::vector<size_t>& row_entries,
              float* device_logits, int64_t vocab, std::vector<float>& logits, std::vector<int32_t>* argmax,
              bool ids_ready = false) {
  const int64_t R = int64_t(row_entries.size());
  auto on_device = [&](int64_t r) {
    const BatchEntry& b = entries[row_entries[size_t(r)]];
    return argmax && (b.greedy || b.sampling);
  };
  // Only rows that come back need room; steps whose rows are all chosen on the device (the common
  // case) leave logits alone (resizing zero-fills up to a GB on the host while the GPU idles).
  bool all_on_device = true, sampled = false;
  for (int64_t r = 0; r < R; ++r) {
    all_on_device &= on_device(r);
    sampled |= argmax && entries[row_entries[size_t(r)]].sampling != nullptr;
  }
  if (!all_on_device) logits.resize(size_t(R * vocab));
  if (argmax && R > 0) {
    pool.argmax.ensure(R);
    if (ids_ready) {
      // nothing left to pick
    } else if (sampled) {
      pool.sampler.draw(m, device_logits, vocab, entries, row_entries, pool.argmax.ids.data());
    } else {
      m.op("argmax", profile::Cost{double(R * vocab) * 4, 0},
           [&] { cuda::argmax(device_logits, R, vocab, pool.argmax.ids.data(), m.s(), pool.argmax.workspace()); });
    }
    KILN_CUDA_CHECK(cudaMemcpyAsync(pool.argmax.host.data(), pool.argmax.ids.data(), size_t(R) * 4,
                                    cudaMemcpyDeviceToHost, m.s()));
  }
  // Contiguous runs of rows that must come back, one copy each.
  for (int64_t r = 0; r < R;) {
    if (on_device(r)) {
      ++r;
      continue;
    }
    int64_t end = r + 1;
    while (end < R && !on_device(end)) ++end;
    KILN_CUDA_CHECK(cudaMemcpyAsync(logits.data() + r * vocab, device_logits + r * vocab,
                                    size_t((end - r) * vocab) * 4, cudaMemcpyDeviceToHost, m.s()));
    r = end;
  }
  KILN_CUDA_CHECK(cudaStreamSynchronize(m.s()));
  if (argmax) argmax->assign(pool.argmax.host.data(), pool.argmax.host.data() + R);
}

// ---- host-side plan of a step -----------------------------------------------------------------

struct StepPlan {
  std::vector<size_t> order;   // entry indices: decode entries first, then prefill chunks
  std::vector<int64_t> row0;   // first activation row of order[k]
  std::vector<int32_t> logit_rows;  // rows of the wanted entries' last tokens, in entry order
  int64_t n_dec = 0, M = 0, S = 1, max_dec_len = 0;
  int64_t n_tiles = 0;  // query tiles of the prefill chunks (cuda::kPrefillTileRows rows each)
};

StepPlan plan_step(std::span<const BatchEntry> entries, int64_t bs) {
  StepPlan p;
  for (size_t e = 0; e < entries.size(); ++e)
    if (entries[e].tokens.size() == 1) p.order.push_back(e);
  p.n_dec = int64_t(p.order.size());
  for (size_t e = 0; e < entries.size(); ++e)
    if (entries[e].tokens.size() != 1) p.order.push_back(e);
  std::vector<int64_t> row_of_entry(entries.size());
  for (size_t k = 0; k < p.order.size(); ++k) {
    const BatchEntry& b = entries[p.order[k]];
    const int64_t n = int64_t(b.tokens.size()), end = b.first_position + n;
    p.row0.push_back(p.M);
    row_of_entry[p.order[k]] = p.M;
    p.M += n;
    p.S = std::max(p.S, (end + bs - 1) / bs);
    if (n == 1) p.max_dec_len = std::max(p.max_dec_len, end);
    if (int64_t(k) >= p.n_dec) p.n_tiles += (n + cuda::kPrefillTileRows - 1) / cuda::kPrefillTileRows;
  }
  for (size_t e = 0; e < entries.size(); ++e)
    if (entries[e].want_logits)
      p.logit_rows.push_back(int32_t(row_of_entry[e] + int64_t(entries[e].tokens.size()) - 1));
  return p;
}

// Writes one table row: the blocks covering positions 0 .. end - 1, then the scratch block.
void write_table_row(const CudaKvPool& pool, const BatchEntry& b, int64_t end, int32_t* row, int64_t S) {
  const int64_t used = (end + pool.block_size() - 1) / pool.block_size();
  for (int64_t i = 0; i < S; ++i) row[i] = i < used ? b.block_table[size_t(i)] : pool.scratch_block();
}

// RoPE and the K/V write of M tokens by slot (a quantized pool: rope_qkv_slots quantizes as it writes).
void enqueue_rope_slots(Impl& m, const CudaKvPool& pool, const cuda::KvLayout& kv, const int32_t* positions,
                        const int32_t* slots, int64_t M) {
  const ModelConfig& c = m.c;
  const cuda_backend::Activations& a = pool.act;
  m.op("rope_qkv", profile::rope_qkv(M, c, m.kv_widths(kv.quantized())), [&] {
    cuda::rope_qkv_slots(a.qkv, positions, slots, M, m.inv_freq.data(), c.rope.rot_dim,
                         c.rope.style == RopeStyle::interleaved, int(c.n_heads), int(c.n_kv_heads), int(c.head_dim),
                         a.q, kv, m.s(), m.rope_table.data(), m.rope_positions);
  });
}

// ---- decode-only steps: padded to (B, S), graph-captured ----------------------------------------

void enqueue_decode(Impl& m, CudaKvPool& pool, int64_t B, int64_t S, const profile::Cost& attn_cost) {
  const ModelConfig& c = m.c;
  const cuda_backend::Activations& a = pool.act;
  const MetaLayout ml(B, B, 0, B, S);
  const int32_t* meta = pool.meta.data();
  const int64_t max_kv_len = S * pool.block_size();
  const cuda::DecodeWorkspace ws =
      cuda::decode_workspace(pool.workspace.data(), B, int(c.n_heads), int(c.head_dim), max_kv_len);
  // One sequence (the padded batch is 1): the fused decode GEMVs, K/V written by slot (into a
  // quantized pool too, unless switched off: Impl::fused_decode_for).
  const bool fused = B == 1 && m.fused_decode_ok();
  // Large batches: the qkv GEMM rotates and writes K/V itself where it can (Impl::enqueue_qkv_rope).
  const Impl::RopedRows roped_rows{meta + ml.positions, meta + ml.slots,
                                   [&](int64_t l) { return pool.layer(l, meta + ml.table, S); }};
  const Impl::FusedDecode fused_decode = m.fused_decode_for(roped_rows, pool.quantized(), max_kv_len);
  m.enqueue_layers(
      a, meta + ml.tokens, B,
      [&](int64_t l, bool roped) {
        const cuda::KvLayout kv = pool.layer(l, meta + ml.table, S);
        if (!roped && (!fused || !fused_decode.qkv))
          enqueue_rope_slots(m, pool, kv, meta + ml.positions, meta + ml.slots, B);
        m.op("attention.decode", attn_cost, [&] {
          cuda::attention_decode(a.q, kv, meta + ml.kv_len, max_kv_len, a.attn, ws, B, int(c.n_heads),
                                 int(c.n_kv_heads), int(c.head_dim), m.s());
        });
        return false;  // the o projection is enqueue_layers'
      },
      fused ? &fused_decode : nullptr, &roped_rows);
  m.enqueue_head(a, a.x, B);
}

void decode_step(Impl& m, CudaKvPool& pool, std::span<const BatchEntry> entries, int64_t S_needed,
                 std::vector<float>& logits, std::vector<int32_t>* argmax) {
  const ModelConfig& c = m.c;
  const int64_t E = int64_t(entries.size()), B = pow2_at_least(E), bs = pool.block_size(), vocab = c.vocab_size;
  const int64_t S = pow2_at_least(std::max(S_needed, (kMinGraphPositions + bs - 1) / bs));
  const MetaLayout ml(B, B, 0, B, S);
  pool.ensure_rows(c, B, B, m.act_quant_cols());
  pool.ensure_workspace(cuda::decode_workspace_floats(B, int(c.n_heads), int(c.head_dim), S * bs));
  pool.ensure_meta(ml.total);

  int32_t* h = pool.host_meta.data();
  profile::Cost attn_cost;
  const int32_t scratch_slot = pool.scratch_block() * int32_t(bs);
  for (int64_t i = 0; i < B; ++i) {
    int32_t* row = h + ml.table + i * S;
    if (i < E) {
      const BatchEntry& b = entries[size_t(i)];
      const int64_t pos = b.first_position;
      h[ml.tokens + i] = b.tokens[0];
      h[ml.positions + i] = int32_t(pos);
      h[ml.slots + i] = pool.slot(b.block_table, pos);
      h[ml.kv_len + i] = int32_t(pos + 1);
      write_table_row(pool, b, pos + 1, row, S);
      attn_cost += profile::attention(1, pos, c, m.kv_widths(pool.quantized()));
    } else {
      h[ml.tokens + i] = 0;
      h[ml.positions + i] = 0;
      h[ml.slots + i] = scratch_slot;
      h[ml.kv_len + i] = 1;
      std::fill(row, row + S, pool.scratch_block());
    }
  }
  KILN_CUDA_CHECK(cudaMemcpyAsync(pool.meta.data(), h, size_t(ml.total) * 4, cudaMemcpyHostToDevice, m.s()));

  const bool use_graph = m.opt.use_graphs && !m.profiling;
  CudaKvPool::Graph* g = use_graph ? &pool.graphs[{B, S}] : nullptr;
  if (!g || !g->warmed) {
    enqueue_decode(m, pool, B, S, attn_cost);
    if (g) g->warmed = true;
  } else {
    if (!g->exec) {
      cudaGraph_t graph = nullptr;
      KILN_CUDA_CHECK(cudaStreamBeginCapture(m.s(), cudaStreamCaptureModeThreadLocal));
      try {
        enqueue_decode(m, pool, B, S, attn_cost);
      } catch (...) {
        cudaStreamEndCapture(m.s(), &graph);
        if (graph) cudaGraphDestroy(graph);
        throw;
      }
      KILN_CUDA_CHECK(cudaStreamEndCapture(m.s(), &graph));
      cudaError_t err = cudaGraphInstantiate(&g->exec, graph, 0);
      cudaGraphDestroy(graph);
      if (err != cudaSuccess) g->exec = nullptr;
      KILN_CUDA_CHECK(err);
    }
    KILN_CUDA_CHECK(cudaGraphLaunch(g->exec, m.s()));
  }
  // The graph computed logits for every (padded) entry; entries without want_logits are skipped
  // by copying only the wanted rows (the wanted rows of a decode step are usually all of them).
  std::vector<size_t> row_entries;
  for (int64_t i = 0; i < E; ++i)
    if (entries[size_t(i)].want_logits) row_entries.push_back(size_t(i));
  if (int64_t(row_entries.size()) == E) {
    copy_out(m, pool, entries, row_entries, pool.act.logits, vocab, logits, argmax);
  } else {
    // Rare (a decode entry that wants no logits): fetch rows one by one.
    logits.resize(row_entries.size() * size_t(vocab));
    for (size_t r = 0; r < row_entries.size(); ++r)
      KILN_CUDA_CHECK(cudaMemcpyAsync(logits.data() + r * size_t(vocab), pool.act.logits + row_entries[r] * size_t(vocab),
                                      size_t(vocab) * 4, cudaMemcpyDeviceToHost, m.s()));
    KILN_CUDA_CHECK(cudaStreamSynchronize(m.s()));
    if (argmax) {
      argmax->resize(row_entries.size());
      for (size_t r = 0; r < row_entries.size(); ++r)
        (*argmax)[r] = std::max(kiln::argmax(std::span<const float>(logits).subspan(r * size_t(vocab), size_t(vocab))), 0);
    }
  }
  if (m.profiling) m.collect_timings();
}

// ---- any other step: eager, unpadded -----------------------------------------------------------

void mixed_step(Impl& m, CudaKvPool& pool, std::span<const BatchEntry> entries, const StepPlan& p,
                std::vector<float>& logits, std::vector<int32_t>* argmax) {
  const ModelConfig& c = m.c;
  const int64_t E = int64_t(entries.size()), R = int64_t(p.logit_rows.size()), vocab = c.vocab_size;
  const int64_t q_dim = c.q_dim(), H = c.hidden_size;
  pool.ensure_rows(c, p.M, R, m.act_quant_cols());
  // The check reads only the pool's addresses and that a table is set (meta may not exist yet).
  static const int32_t probe_table = 0;
  // A quantized pool's chunks read a compact bf16 copy of their positions (kv_dequantize_rows, one
  // launch a layer) through their own block table; the check sees that copy's form (any aligned
  // pointer stands for it).
  cuda::KvLayout probe = pool.layer(0, &probe_table, 1);
  if (pool.quantized()) {
    probe = cuda::KvLayout{pool.act.q, pool.act.q, 0, c.kv_dim(), int(c.head_dim)};
    probe.block_table = &probe_table, probe.bt_stride = 1;
  }
  const bool varlen = p.n_tiles > 0 && prefill_varlen_enabled() &&
                      cuda::attention_prefill_varlen_ok(pool.act.q, probe, pool.act.attn, int(c.head_dim));
  const bool compact = varlen && pool.quantized();
  // The copy read as contiguous rows by the wgmma form (any aligned pointer stands for it).
  const cuda::KvLayout rows_probe{pool.act.q, pool.act.q, 0, c.kv_dim(), int(c.head_dim)};
  const bool compact_wgmma = compact && prefill_varlen_wgmma_enabled() &&
                             cuda::attention_prefill_wgmma_ok(pool.act.q, rows_probe, pool.act.attn, int(c.head_dim));
  const MetaLayout ml(p.M, p.n_dec, R, E, p.S, varlen ? p.n_tiles : 0, compact);
  if (p.n_dec > 0)
    pool.ensure_workspace(cuda::decode_workspace_floats(p.n_dec, int(c.n_heads), int(c.head_dim), p.max_dec_len));
  pool.ensure_meta(ml.total);

  int32_t* h = pool.host_meta.data();
  profile::Cost dec_cost;
  const int64_t bs = pool.block_size();
  int64_t compact_blocks = 0, compact_max_end = 0, compact_positions = 0;
  for (size_t k = 0; k < p.order.size(); ++k) {
    const BatchEntry& b = entries[p.order[k]];
    const int64_t n = int64_t(b.tokens.size()), r0 = p.row0[k];
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = b.first_position + i;
      h[ml.tokens + r0 + i] = b.tokens[size_t(i)];
      h[ml.positions + r0 + i] = int32_t(pos);
      h[ml.slots + r0 + i] = pool.slot(b.block_table, pos);
    }
    if (int64_t(k) < p.n_dec) {
      h[ml.kv_len + int64_t(k)] = int32_t(b.first_position + 1);
      dec_cost += profile::attention(1, b.first_position, c, m.kv_widths(pool.quantized()));
    }
    write_table_row(pool, b, b.first_position + n, h + ml.table + int64_t(k) * p.S, p.S);
    if (compact) {  // prefill entries' positions 0 .. end - 1 in consecutive blocks of the compact copy
      const int64_t end = int64_t(k) < p.n_dec ? 0 : b.first_position + n, blocks = (end + bs - 1) / bs;
      h[ml.ends + int64_t(k)] = int32_t(end);
      int32_t* row = h + ml.ctable + int64_t(k) * p.S;
      std::fill_n(row, p.S, 0);
      for (int64_t j = 0; j < blocks; ++j) row[j] = int32_t(compact_blocks + j);
      compact_blocks += blocks;
      compact_max_end = std::max(compact_max_end, end);
      compact_positions += end;
    }
  }
  std::copy(p.logit_rows.begin(), p.logit_rows.end(), h + ml.rows);
  profile::Cost prefill_cost;
  if (varlen) {
    // Every prefill chunk cut into query tiles, those that read the most K/V first (fewer
    // stragglers in the last wave).
    auto* tiles = reinterpret_cast<cuda::PrefillTile*>(h + ml.tiles);
    int64_t t = 0;
    for (size_t k = size_t(p.n_dec); k < p.order.size(); ++k) {
      const BatchEntry& b = entries[p.order[k]];
      const int64_t n = int64_t(b.tokens.size());
      // The wgmma form reads the compact copy as rows: the entry's first compact block's row.
      const int32_t kv_ref = compact_wgmma ? int32_t(h[ml.ctable + int64_t(k) * p.S] * bs) : int32_t(k);
      for (int64_t q0 = 0; q0 < n; q0 += cuda::kPrefillTileRows)
        tiles[t++] = {int32_t(p.row0[k] + q0), int32_t(n - q0), int32_t(b.first_position + q0), {kv_ref}};
      prefill_cost += profile::attention(n, b.first_position, c);
    }
    auto kv_end = [](const cuda::PrefillTile& x) { return x.q_start + std::min(x.rows, cuda::kPrefillTileRows); };
    std::stable_sort(tiles, tiles + t, [&](const auto& x, const auto& y) { return kv_end(x) > kv_end(y); });
  }
  KILN_CUDA_CHECK(cudaMemcpyAsync(pool.meta.data(), h, size_t(ml.total) * 4, cudaMemcpyHostToDevice, m.s()));

  const cuda_backend::Activations& a = pool.act;
  const int32_t* meta = pool.meta.data();
  bf16* const compact_k = compact ? m.kv_scratch_for(compact_blocks * bs) : nullptr;  // K, then V
  const Impl::RopedRows roped_rows{meta + ml.positions, meta + ml.slots,
                                   [&](int64_t l) { return pool.layer(l, meta + ml.table, p.S); }};
  m.enqueue_layers(a, meta + ml.tokens, p.M, [&](int64_t l, bool roped) {
    const cuda::KvLayout kv = pool.layer(l, meta + ml.table, p.S);
    if (!roped) enqueue_rope_slots(m, pool, kv, meta + ml.positions, meta + ml.slots, p.M);
    if (p.n_dec > 0) {
      m.op("attention.decode", dec_cost, [&] {
        cuda::attention_decode(a.q, kv, meta + ml.kv_len, p.max_dec_len, a.attn,
                               cuda::decode_workspace(pool.workspace.data(), p.n_dec, int(c.n_heads), int(c.head_dim),
                                                      p.max_dec_len),
                               p.n_dec, int(c.n_heads), int(c.n_kv_heads), int(c.head_dim), m.s());
      });
    }
    if (varlen) {
      cuda::KvLayout read = kv;
      if (compact) {
        read = cuda::KvLayout{compact_k, compact_k + compact_blocks * bs * c.kv_dim(), 0, c.kv_dim(), int(c.head_dim)};
        read.block_table = meta + ml.ctable;
        read.bt_stride = p.S;
        read.block_shift = kv.block_shift;
        m.op("kv_dequantize", m.kv_dequantize_cost(compact_positions), [&] {
          cuda::kv_dequantize_rows(kv, read, meta + ml.ends, p.n_dec, int64_t(p.order.size()) - p.n_dec,
                                   compact_max_end, int(c.n_kv_heads), m.s());
        });
      }
      const auto* tiles = reinterpret_cast<const cuda::PrefillTile*>(meta + ml.tiles);
      m.op("attention.prefill", prefill_cost, [&] {
        if (compact_wgmma) {
          const cuda::KvLayout rows{read.k, read.v, 0, c.kv_dim(), int(c.head_dim)};
          KILN_CUDA_REQUIRE(cuda::attention_prefill_varlen_wgmma(a.q, p.M, rows, compact_blocks * bs, a.attn, tiles,
                                                                 p.n_tiles, int(c.n_heads), int(c.n_kv_heads),
                                                                 int(c.head_dim), m.s()),
                            "attention_prefill_varlen_wgmma: the tensor maps could not be made");
        } else {
          cuda::attention_prefill_varlen(a.q, read, a.attn, tiles, p.n_tiles, int(c.n_heads), int(c.n_kv_heads),
                                         int(c.head_dim), m.s());
        }
      });
      return false;
    }
    for (size_t k = size_t(p.n_dec); k < p.order.size(); ++k) {
      const BatchEntry& b = entries[p.order[k]];
      const int64_t n = int64_t(b.tokens.size()), r0 = p.row0[k];
      // A quantized pool: this entry's positions dequantized to a contiguous bf16 scratch first.
      const cuda::KvLayout read = pool.quantized() ? m.dequantized(kv, int64_t(k), b.first_position + n)
                                                   : cuda::kv_row_view(kv, int64_t(k));
      m.op("attention.prefill", profile::attention(n, b.first_position, c), [&] {
        cuda::attention_prefill(a.q + r0 * q_dim, read, a.attn + r0 * q_dim, n, b.first_position, int(c.n_heads),
                                int(c.n_kv_heads), int(c.head_dim), m.s());
      });
    }
    return false;
  }, nullptr, &roped_rows);
  std::vector<size_t> row_entries;
  for (size_t e = 0; e < entries.size(); ++e)
    if (entries[e].want_logits) row_entries.push_back(e);
  // Every wanted row greedy (the common case of a large decode step): the head's GEMM picks the ids
  // itself and writes no logits (session 34; KILN_HEAD_ARGMAX=0 for the logits and the argmax kernel).
  bool greedy_head = argmax != nullptr && R > 0;
  for (size_t e : row_entries) greedy_head &= entries[e].greedy && entries[e].sampling == nullptr;
  greedy_head = greedy_head && m.head_argmax_ok(a, R);
  if (R > 0) {
    // The head reads the wanted rows in place where they are the step's rows in order (a step of
    // decodes only, every row wanted: 33 MB not copied at 2048 rows), else their gathered copy.
    bool in_place = R == p.M;
    for (int64_t r = 0; in_place && r < R; ++r) in_place = p.logit_rows[size_t(r)] == r;
    float* x_rows = in_place ? a.x : a.xg;
    if (!in_place)
      m.op("gather_rows", profile::Cost{}, [&] { cuda::gather_rows(a.x, meta + ml.rows, a.xg, R, H, m.s()); });
    Impl::GreedyHead greedy{};
    if (greedy_head) {
      float2* parts = pool.argmax.head_parts(R, cuda::gemm_argmax_parts(R, vocab));  // first: it may grow ids
      greedy = {parts, pool.argmax.ids.data()};
    }
    m.enqueue_head(a, x_rows, R, greedy_head ? &greedy : nullptr);
  }
  copy_out(m, pool, entries, row_entries, a.logits, vocab, logits, argmax, greedy_head);
  if (m.profiling) m.collect_timings();
}

}  // namespace

// ---- CudaBackend's batching entry points ------------------------------------------------------

std::unique_ptr<KvPool> CudaBackend::new_kv_pool(int32_t num_blocks, int32_t block_size) {
  KILN_CHECK(num_blocks > 0, invalid_argument, "a KV pool needs at least one block, got {}", num_blocks);
  KILN_CHECK(block_size > 0 && block_size <= 1024 && (block_size & (block_size - 1)) == 0, invalid_argument,
             "the CUDA KV pool needs a power-of-two block size up to 1024, got {}", block_size);
  KILN_CHECK((int64_t(num_blocks) + 1) * block_size < (int64_t(1) << 31), invalid_argument,
             "a KV pool of {} blocks of {} tokens has too many slots", num_blocks, block_size);
  return std::make_unique<CudaKvPool>(impl_.get(), impl_->c, num_blocks, block_size,
                                      Impl::kv_quant_of(kv_cache_format()));
}

void CudaBackend::forward_batch_impl(KvPool& pool_base, std::span<const BatchEntry> entries,
                                     std::vector<float>& logits, std::vector<int32_t>* argmax) {
  auto* pool = dynamic_cast<CudaKvPool*>(&pool_base);
  KILN_CHECK(pool != nullptr && pool->owner == impl_.get(), invalid_argument,
             "forward_batch: the KV pool was not made by this CUDA backend");
  Impl& m = *impl_;
  const int64_t bs = pool->block_size();
  bool all_decode = true;
  for (const BatchEntry& b : entries) {
    all_decode &= b.tokens.size() == 1;
    KILN_CHECK(b.first_position + int64_t(b.tokens.size()) < (int64_t(1) << 31), invalid_argument,
               "forward_batch: position {} is too large", b.first_position + int64_t(b.tokens.size()) - 1);
  }
  const StepPlan p = plan_step(entries, bs);
  KILN_CHECK(p.M < (int64_t(1) << 31), invalid_argument, "forward_batch: {} tokens in one step are too many", p.M);
  if (all_decode && int64_t(entries.size()) <= kMaxGraphBatch)
    decode_step(m, *pool, entries, p.S, logits, argmax);
  else
    mixed_step(m, *pool, entries, p, logits, argmax);
}

int64_t CudaBackend::batch_graph_count(const KvPool& pool) const {
  auto* p = dynamic_cast<const CudaKvPool*>(&pool);
  return p ? p->graph_count() : 0;
}

int64_t CudaBackend::default_kv_cache_bytes(double gpu_memory_fraction) const {
  KILN_CHECK(gpu_memory_fraction > 0 && gpu_memory_fraction <= 1, invalid_argument,
             "gpu memory fraction must be in (0, 1], got {}", gpu_memory_fraction);
  return int64_t(gpu_memory_fraction * double(free_device_memory()));
}

int64_t CudaBackend::device_memory_bytes() const { return cuda::device_info().total_mem; }

int64_t CudaBackend::step_memory_bytes(int64_t max_tokens, int64_t max_seqs) const {
  // What CudaKvPool::ensure_rows allocates for the largest step (the decode workspace and the
  // metadata, a few MB, ride in the fraction of free memory left unused).
  const cuda_backend::ArenaRows r = cuda_backend::arena_rows(max_tokens, max_seqs);
  using cuda_backend::Activations;
  return int64_t(Activations::layout(impl_->c, r.rows, r.logit_rows, 0, true, impl_->act_quant_cols()).total);
}

int64_t CudaBackend::free_device_memory() {
  size_t free_b = 0, total_b = 0;
  KILN_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return int64_t(free_b);
}

int64_t CudaBackend::total_device_memory() {
  size_t free_b = 0, total_b = 0;
  KILN_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return int64_t(total_b);
}

}  // namespace kiln
