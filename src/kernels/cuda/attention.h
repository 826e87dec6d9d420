// Causal grouped-query attention over the bf16 KV cache (addressed through KvLayout only).
// Query head h reads KV head h / (n_heads / n_kv_heads); K/V are never repeated per query head.
// Head dims: multiples of 8, at most 128 (64, 80, 96, 128 are tested).
// Both entry points take either KV form (kv_layout.h): contiguous per sequence, or a paged pool
// with a device block table (kv.block_table set; block_size a power of two). Paged decode:
// sequence b reads block-table row b. Paged prefill: row 0 of the table (pass kv_row_view(kv, r)
// for another row). The kernels are the same with per-row addressing of K/V tiles.
#pragma once

#include "kernels/cuda/common.h"
#include "kernels/cuda/kv_layout.h"

namespace kiln::cuda {

constexpr int kAttnMaxHeadDim = 128;

// Prefill chunk of one sequence (sequence 0 of kv): q(n_q, n_heads, head_dim) at positions
// q_start .. q_start + n_q - 1, against cache positions 0 .. q_start + n_q - 1 (already written).
// out(n_q, n_heads, head_dim) bf16. FlashAttention-2 on the tensor cores (bf16 mma.sync) when q,
// out, K, V and the strides are 16-byte aligned; otherwise the fp32 CUDA-core kernel.
//
// Versions (attention_prefill picks the first that can run the arguments):
//   4, 3, "wgmma-d64" / "wgmma-d128": FlashAttention-3 manner on sm_90a (wgmma + TMA, warp-specialized,
//      attention_prefill_wgmma.cu; 4 adds the intra-warpgroup overlap of softmax and wgmma): contiguous
//      K/V only, head_dim 64 or 128, 16-byte aligned. kPrefillWgmmaVersion is the default where it can
//      run; KILN_ATTN_PREFILL=mma turns it off.
//   2, "mma-d64" / "mma-d128": FlashAttention-2 on mma.sync (attention_prefill.cu): sm_80+, paged or
//      contiguous K/V, head dims up to 128 (72..128 run in the 128-wide tile), 16-byte aligned.
//   1, "fp32-fallback": CUDA cores, anything else.
void attention_prefill(const bf16* q, KvLayout kv, bf16* out, int64_t n_q, int64_t q_start, int n_heads,
                       int n_kv_heads, int head_dim, cudaStream_t stream);
// Which prefill kernel those arguments select: "wgmma-d64", "wgmma-d128", "mma-d64", "mma-d128" or
// "fp32-fallback".
const char* attention_prefill_impl(const bf16* q, KvLayout kv, const bf16* out, int head_dim);
// One version on purpose (kernel lab, tests): false, with nothing launched, where it cannot run these
// arguments (version 1 always can).
bool attention_prefill_version(int version, const bf16* q, KvLayout kv, bf16* out, int64_t n_q, int64_t q_start,
                               int n_heads, int n_kv_heads, int head_dim, cudaStream_t stream);
// Versions 3 and 4's own entry points (attention_prefill_wgmma.cu): whether they can run the
// arguments on the current device, and the launch (false, nothing launched, if not).
constexpr int kPrefillWgmmaVersion = 3;  // measured faster than 4 on the H200 (PERFORMANCE.md)
bool attention_prefill_wgmma_ok(const bf16* q, KvLayout kv, const bf16* out, int head_dim);
bool attention_prefill_wgmma(int version, const bf16* q, KvLayout kv, bf16* out, int64_t n_q, int64_t q_start,
                             int n_heads, int n_kv_heads, int head_dim, cudaStream_t stream);

// Many paged prefill chunks in one launch (a continuous-batching step holds one chunk per newly
// admitted prompt: 60 chunks of 128 tokens in an 8192-token step were 60 launches a layer, each
// of 2 x n_heads blocks, a fraction of a wave). The caller cuts every chunk into query tiles of
// kPrefillTileRows rows and passes one PrefillTile each (device memory); tile i runs exactly as
// the per-chunk version 2 launch runs that tile (bit-identical results): query rows row0 ..
// row0 + min(rows, kPrefillTileRows) - 1 of q / out (rows of n_heads * head_dim), at positions
// q_start ..., against cache positions 0 .. q_start + that count - 1, read through block-table row
// table_row. Needs what version 2 needs (attention_prefill_varlen_ok): paged K/V, 16-byte aligned.
constexpr int kPrefillTileRows = 64;
struct PrefillTile {
  int32_t row0;     // first query row of the tile
  int32_t rows;     // query rows of the chunk from row0 on (the tile takes at most 64)
  int32_t q_start;  // position of row0
  union {
    int32_t table_row;  // paged K/V (attention_prefill_varlen): block-table row of the chunk's sequence
    int32_t kv_row0;    // contiguous K/V (attention_prefill_varlen_wgmma): row of its sequence's position 0
  };
};
bool attention_prefill_varlen_ok(const bf16* q, KvLayout kv, const bf16* out, int head_dim);
void attention_prefill_varlen(const bf16* q, KvLayout kv, bf16* out, const PrefillTile* tiles, int64_t n_tiles,
                              int n_heads, int n_kv_heads, int head_dim, cudaStream_t stream);
// The same tiles on Hopper's wgmma kernel (version 3's math; a block runs one 64-row tile for the
// query heads of one KV head, two blocks a SM; attention_prefill_wgmma.cu) over contiguous K/V rows (kv not paged: a quantized
// pool's compact bf16 copy, each sequence's positions 0 .. end - 1 from row kv_row0 on), q and out
// of q_rows rows, K/V of kv_rows rows. Each tile computes what a version 3 launch of its chunk
// computes for those rows. It runs where attention_prefill_wgmma_ok accepts q, kv and out (sm_90a,
// head_dim 64 or 128, contiguous 16-byte aligned K/V); false, nothing launched, elsewhere.
bool attention_prefill_varlen_wgmma(const bf16* q, int64_t q_rows, KvLayout kv, int64_t kv_rows, bf16* out,
                                    const PrefillTile* tiles, int64_t n_tiles, int n_heads, int n_kv_heads,
                                    int head_dim, cudaStream_t stream);

// Flash-decoding: one query token for each of `batch` sequences, q(batch, n_heads, head_dim);
// sequence b attends to cache positions 0 .. kv_len[b] - 1 (kv_len in device memory, so a captured
// graph replays with new lengths). max_kv_len bounds kv_len and fixes the grid: P split blocks per
// (KV head group, sequence), P chosen on the host to fill the GPU (about one wave of resident
// blocks) but at most decode_max_splits(max_kv_len). At run time each block reads kv_len and takes
// the 64-position tiles s, s + P, s + 2P, ... of its sequence (split s); blocks past the end exit at
// once, a sequence whose tiles all fall to one block is written directly, and the combine kernel
// merges only the blocks that hold data. One block scores all query heads of a KV group (up to 16,
// the rows of a tensor-core tile) against each K/V tile, so each K/V byte is read once per group.
// A quantized layout (kv.quantized()) goes to attention_decode_q8 (below) with the same contract.
constexpr int kDecodeSplit = 256;  // workspace granularity: at most ceil(max_kv_len / 256) splits
struct DecodeWorkspace {
  float* partial_o = nullptr;   // (batch, n_heads, max_splits, head_dim)
  float* partial_ml = nullptr;  // (batch, n_heads, max_splits, 2): running max, sum of exp
};
inline int64_t decode_max_splits(int64_t max_kv_len) { return (max_kv_len + kDecodeSplit - 1) / kDecodeSplit; }
// Floats of workspace the call needs (partial_o then partial_ml, one allocation).
inline int64_t decode_workspace_floats(int64_t batch, int n_heads, int head_dim, int64_t max_kv_len) {
  return batch * n_heads * decode_max_splits(max_kv_len) * (head_dim + 2);
}
DecodeWorkspace decode_workspace(float* base, int64_t batch, int n_heads, int head_dim, int64_t max_kv_len);

void attention_decode(const bf16* q, KvLayout kv, const int32_t* kv_len, int64_t max_kv_len, bf16* out,
                      DecodeWorkspace ws, int64_t batch, int n_heads, int n_kv_heads, int head_dim,
                      cudaStream_t stream);
// The same with the tensor-core kernel's knobs set (the kernel lab compares them); zero / -1 fields
// keep the defaults. stages: cp.async stages of 64-position K/V tiles (2 and 4 exist only for
// head_dim > 64 on the contiguous layout; else 3). split_waves: split blocks per (KV group,
// sequence) sized for this many waves of resident blocks. pdl: launch the combine kernel with
// programmatic dependent launch (sm_90+), so its launch overlaps the split kernel. interleave:
// split block s of P takes 64-position tiles s, s + P, ... instead of one contiguous chunk.
struct DecodeTuning {
  int stages = 0;
  int split_waves = 0;
  int pdl = -1;
  int interleave = -1;
  int split_pdl = -1;  // launch the split kernel itself with PDL (sm_90+; -1: on unless KILN_ATTN_SPLIT_PDL=0)
  int stream = -1;     // at P = 1, the streaming kernel (attention_decode_stream.h; -1: unless KILN_ATTN_DECODE_STREAM=0)
  // Where the streaming kernel would run, the slice kernel (attention_decode_slices.h) instead:
  // -1: from kDecodeSlicesPairsPer8Warps pairs per 8 resident warps on, unless KILN_ATTN_DECODE_SLICES=0;
  // 0: never; 1: at any batch (the lab's measure of the threshold).
  int slices = -1;
  // How the kernels start under PDL (attention_decode_stream.h's DecodeStreamPrologue; applies to
  // the split kernel too): -1 on unless KILN_ATTN_EARLY_ROWS=0, 0 off, 1 on.
  int early_rows = -1;
};
void attention_decode_tuned(const DecodeTuning& tune, const bf16* q, KvLayout kv, const int32_t* kv_len,
                            int64_t max_kv_len, bf16* out, DecodeWorkspace ws, int64_t batch, int n_heads,
                            int n_kv_heads, int head_dim, cudaStream_t stream);
// The fp32 CUDA-core path attention_decode takes for unaligned pointers or strides (the same
// contract; attention_decode_fp32.cu).
void attention_decode_fp32(const bf16* q, KvLayout kv, const int32_t* kv_len, int64_t max_kv_len, bf16* out,
                           DecodeWorkspace ws, int64_t batch, int n_heads, int n_kv_heads, int head_dim,
                           cudaStream_t stream);
// Which decode kernel those arguments select: "mma-d64", "mma-d128" or "fp32-fallback".
const char* attention_decode_impl(const bf16* q, KvLayout kv, const bf16* out, int head_dim);

// attention_decode over a quantized KV cache (kv.quantized(): int8 or fp8 bytes and per-(token, KV
// head) scales, kv_layout.h, kv_quant.h), contiguous or paged, the same contract and workspace;
// attention_decode_q8.cu. attention_decode calls it for such a layout; the tests and the kernel lab
// call it directly. Needs head_dim % 16 == 0 and 16-byte aligned q, out and K/V bytes.
void attention_decode_q8(const bf16* q, KvLayout kv, const int32_t* kv_len, int64_t max_kv_len, bf16* out,
                         DecodeWorkspace ws, int64_t batch, int n_heads, int n_kv_heads, int head_dim,
                         cudaStream_t stream);
// One version on purpose (kernel lab): 0 = the default (2, or KILN_ATTN_Q8; the slice kernel at
// many sequences), 1 = bf16 K tile, 3 = 3 stages at 3 blocks per SM (1 and 3: head_dim 128,
// contiguous, int8 only), 4 = the slice kernel (attention_decode_slices.h) at any batch (at most 8
// query heads per KV head, two blocks a SM), 5 / 6 its variants 1 / 2 (attention_decode_slices.h);
// false, nothing launched, where the version does not apply. attention_decode_q8.cu has the differences.
bool attention_decode_q8_version(int version, const bf16* q, KvLayout kv, const int32_t* kv_len, int64_t max_kv_len,
                                 bf16* out, DecodeWorkspace ws, int64_t batch, int n_heads, int n_kv_heads,
                                 int head_dim, cudaStream_t stream);

}  // namespace kiln::cuda
