// The CPU reference operators: plain loops, fp32 storage, fp32/fp64 accumulation.
// Every GPU kernel is tested against these, so they favour clarity over speed; only the
// matrix product is split across threads. Shapes are written (rows, cols), row-major.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "model/config.h"

namespace kiln::cpu {

// out(rows, dim) = x / rms(x) * weight, per row. rms accumulates in double.
void rmsnorm(const float* x, const float* weight, float* out, int64_t rows, int64_t dim, float eps);

// y(m, n) = x(m, k) * w(n, k)^T (+ bias(n) when bias is not null). Threads split n. Every output is
// summed in one fixed order whatever m is (matmul.cpp), so batching never changes a row's result.
void matmul(ThreadPool& pool, const float* x, const float* w, const float* bias, float* y, int64_t m, int64_t n,
            int64_t k);

// The inverse frequency of rotation pair i (0 <= i < rot_dim/2), llama3 scaling and GGUF
// rope_freqs factors included.
float rope_inv_freq(const RopeConfig& rope, int i);

// Rotates x(tokens, heads, head_dim) in place; token t sits at positions[t].
void rope(float* x, const int32_t* positions, int64_t tokens, int64_t heads, int64_t head_dim, const RopeConfig& rope);

// out(n) = silu(gate) * up.
void silu_mul(const float* gate, const float* up, float* out, int64_t n);

// Causal grouped-query attention of one sequence.
//   q(n_q, n_heads, head_dim): the new tokens, at positions q_start .. q_start + n_q - 1;
//   k, v(n_kv_pos, n_kv_heads, head_dim): keys and values for positions 0 .. n_kv_pos-1
//   (n_kv_pos >= q_start + n_q); out(n_q, n_heads, head_dim). Query head h reads kv head
//   h / (n_heads / n_kv_heads). Scores and softmax in fp32 with the max subtracted.
void attention(const float* q, const float* k, const float* v, float* out, int64_t n_q, int64_t q_start,
               int64_t n_heads, int64_t n_kv_heads, int64_t head_dim);

}  // namespace kiln::cpu
