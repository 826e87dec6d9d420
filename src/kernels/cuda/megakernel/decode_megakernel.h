// The decode megakernel: every layer of a batch-1 decode step in one persistent kernel launch.
//
// Why (docs/performance/megakernel.md): a batch-1 step of Llama-3-8B with int4 weights reads
// ~3.9 GB, 0.92 ms at the copy bandwidth, but ran as 228 kernels in 2.06 ms: each of a layer's 7
// dependent kernels pays a ramp, a tail and a dependency wait (4-8 us a call over its bytes for the
// int8 / int4 GEMVs, sessions 15-18), and a copy of qkv's or o's bytes alone reaches only 37-63%
// of the bandwidth. No kernel of that shape can hide what lies between kernels.
//
// How: one block per SM (cooperative launch: all resident), 8 consumer warps and 4 producer warps.
// The producers stream the block's share of every weight matrix of every layer, in the order the
// consumers will use it, through a ring of ~5 shared-memory slots (cp.async, or TMA bulk copies with
// KILN_MEGAKERNEL_TMA=1; one 16-row tile x 2048 bytes of each row per slot); weights depend on no
// activation, so the stream runs on through the phase boundaries where the consumers wait. The
// consumers run, per layer, the phases of the fused decode step, each separated by a grid-wide
// phase counter:
//   qkv  (+ the folded RMSNorm's scale, RoPE, K/V into the cache)  -> q, the cache
//   attention (one block per (KV head, split of the cache); the last block of a head merges)
//   o    (+ residual add, the next RMSNorm's z and tile partials)  -> x, z
//   gate/up (+ the norm's scale, SwiGLU)                           -> h
//   down (+ residual add, the next layer's norm product)           -> x, z
// The tiles' products are qgemv v3's / the bf16 GEMV's math (mma.sync on the same operand forms),
// read from the ring instead of registers; the norm is the fold of gemv_fused.h (NormProduce /
// NormApply). The embedding, the final norm and the head stay kernels of their own.
//
// Status (session 19, H200): correct, and 4-12% slower than the fused kernels it replaces (tg128
// int4 448.8 vs 492.9 tok/s), so the backend runs it only when asked; megakernel.md has the trace
// of where a layer's time goes and what a faster version needs.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/cuda/common.h"
#include "model/quantized_matrix.h"

namespace kiln::cuda {

// One layer's weights on the device (a table of these is built once per model).
struct MegakernelLayer {
  // qkv [wq | wk | wv], o, gate/up [w_gate | w_up], down: bf16 (rows, cols) row-major, or packed
  // int8 / int4 (quant/qmatmul.h's layouts).
  const void* w[4] = {};
  const float2* scales[4] = {};  // int8 / int4: {scale, min'} per (row, group); bf16: null
  const bf16* attn_norm = nullptr;
  const bf16* ffn_norm = nullptr;
  const bf16* b_qkv = nullptr;  // (q_dim + 2 kv_dim) or null
};

// The model as the megakernel sees it. Every projection of every layer has `format`: bf16
// (QuantFormat::none), int8 per output channel, or int4 in groups of 128.
struct MegakernelModel {
  QuantFormat format = QuantFormat::none;
  int n_layers = 0;
  int64_t hidden = 0, inter = 0;
  int n_heads = 0, n_kv_heads = 0, head_dim = 0, rot_dim = 0;
  bool interleaved = false;  // RoPE on (2i, 2i + 1) pairs instead of the rotate-half layout
  float eps = 0.0f;
  const MegakernelLayer* layers = nullptr;  // device, n_layers
};

// One step's buffers. The step reads x (the embedded token, fp32 residual) and leaves the residual
// after the last layer in x; K/V of `position` go into the contiguous single-sequence cache.
struct MegakernelStep {
  const int32_t* position = nullptr;  // device: the token's position (the step is graph-safe)
  bf16* k = nullptr;                  // layer 0's keys (capacity, n_kv_heads, head_dim); layer l at + l * kv_layer_stride
  bf16* v = nullptr;
  int64_t kv_layer_stride = 0;
  const float* inv_freq = nullptr;    // RoPE as rope_qkv takes it
  const float2* cos_sin = nullptr;
  int64_t cos_sin_positions = 0;
  float* x = nullptr;                        // (hidden) fp32 residual
  bf16* z_attn = nullptr;                    // (hidden) scratch: the attention norm's product
  bf16* z_ffn = nullptr;                     // (hidden) scratch: the FFN norm's product
  float* part_attn = nullptr;                // (hidden / 16) scratch: their tile sums of squares
  float* part_ffn = nullptr;
  bf16* q = nullptr;                         // (q_dim) scratch: rotated queries
  bf16* attn = nullptr;                      // (q_dim) scratch: attention output
  bf16* h = nullptr;                         // (inter) scratch: SwiGLU output
  float* attn_ws = nullptr;                  // megakernel_workspace_floats
  uint32_t* sync = nullptr;                  // megakernel_sync_words; zeroed by decode_megakernel
  uint64_t* trace = nullptr;                 // optional, megakernel_trace_words: where the time went
};

// Why the megakernel cannot run `m` on this device ("" when it can): the device (sm_90 with
// cooperative launch), the format and the shapes (head_dim 128, at most 8 query heads per KV head,
// whole 16-row tiles, K a multiple of the format's chunk), the shared memory.
std::string megakernel_unsupported(const MegakernelModel& m);
int64_t megakernel_workspace_floats(const MegakernelModel& m);
int64_t megakernel_sync_words(const MegakernelModel& m);

// Zeroes step.sync, then launches the step (cooperative; capturable in a CUDA graph). The caller
// checked megakernel_unsupported(m) is empty.
void decode_megakernel(const MegakernelModel& m, const MegakernelStep& step, cudaStream_t stream);

// The step's trace (MegakernelStep::trace, %globaltimer in ns): per block, per layer and phase (qkv,
// attention, o, gate/up, down) when the phase's input was ready, when the block's share was done,
// and how long its consumers waited on the ring within it; per block and layer how long the
// producer waited for a free slot. megakernel_trace_summary reads a downloaded trace into a table
// (means over blocks and layers, us): the wait for the phase before (grid barrier and the slowest
// block), the work, the part of the work spent waiting for weights, the producer's stall.
int64_t megakernel_trace_words(const MegakernelModel& m);
std::string megakernel_trace_summary(const MegakernelModel& m, const uint64_t* trace);

}  // namespace kiln::cuda
