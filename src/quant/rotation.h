// Rotating a model's residual stream before it is quantized (`kiln quantize --rotate`; session 22,
// in the manner of QuaRot: Ashkboos et al., 2024, its offline rotations, SpinQuant's R1 and R2).
//
// A Llama-family model computes the same function in any orthonormal basis of its residual stream.
// RMSNorm reads only |x|, which a rotation keeps, once its weight g is folded into the matrices that
// read its output (W diag(g)). With the stream x' = R x for an orthogonal R (hidden x hidden):
//
//   matrices reading the stream (q, k, v, gate, up):  W' = W diag(g) R^T
//   the output head:                                 W' = E diag(g_final) R^T (E the embedding if tied)
//   matrices writing it (o, down):                   W' = R W
//   the embedding rows:                              E' = E R^T
//
// and in each layer every kv head's values may turn by an orthogonal P (head_dim x head_dim) of their
// own, since attention only mixes positions: v's rows of that head P W_v, its bias P b_v, and o's
// columns of every query head reading it W_o P^T. The function stays the same up to fp32 rounding;
// what changes is the basis the weights are written in. A random rotation spreads a few large input
// channels over all of them (the incoherence of QuIP), so a row's 4-bit groups hold values of one
// scale rather than a few outliers among many small ones.
//
// Nothing happens at run time: the result is an ordinary Llama-family model whose norm weights are 1
// and whose head is untied (the head E diag(g_final) R^T is no longer the rotated embedding E R^T),
// so every backend runs it unchanged. The cost is that untied head: one more vocab x hidden matrix
// in the file and in memory when the input's head was tied (the default model's: 54 MiB in bf16).
#pragma once

#include <cstdint>
#include <vector>

#include "core/thread_pool.h"
#include "model/config.h"
#include "model/weights.h"

namespace kiln::quant {

// A Haar-random orthogonal n x n matrix, row-major, from `seed` (the Q of a Gaussian matrix's QR
// with the signs that make the distribution uniform; computed in double).
std::vector<double> random_orthogonal(int64_t n, uint64_t seed);

// Rotates `w` in place as above: norms folded and set to 1, the head untied (config.tied_embeddings
// becomes false), the residual stream turned by random_orthogonal(hidden, seed) and each layer's kv
// heads by a random_orthogonal(head_dim, ...) of their own. Every rotated matrix becomes dense
// (quantized forms dropped, its fp32 values kept): quantize after rotating, not before.
void rotate_model(ModelConfig& config, ModelWeights& w, ThreadPool& pool, uint64_t seed);

}  // namespace kiln::quant
