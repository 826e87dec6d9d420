// The pieces of GPTQ that apply_gptq (gptq.cpp), the sequential forms (gptq_sequential.cpp) and the
// gain fit (gain_fit.cpp) share: the matrices each site feeds, one site's quantization, products of
// kept rows, and the Cholesky factor and solve.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/thread_pool.h"
#include "model/weights.h"
#include "quant/gptq.h"

namespace kiln::quant {

// A matrix that reads a site's input: its short name ("q", .., "down") and where LayerWeights keeps it.
struct SiteMatrix {
  const char* name;
  HostMatrix LayerWeights::*member;
};
// The matrices that read each LinearSite's input (0 q/k/v, 1 o, 2 gate/up, 3 down), in that order.
std::span<const SiteMatrix> site_matrices(int site);

// GPTQ (and the refit and descent rounds) on every matrix that reads one layer's site (LinearSite
// order: 0 q/k/v, 1 o, 2 gate/up, 3 down), from that site's H. With `input_map_t` (M^T, cols x cols
// row-major: cpu::matmul's operand layout, so every matrix of the site uses it as it is) each
// matrix W is first replaced by W M, the target asymmetric calibration fits (gptq_sequential.cpp).
void gptq_site(LayerWeights& layer_w, int64_t layer, int site, int64_t cols, const std::vector<double>& H,
               ThreadPool& pool, int64_t int4_group, const std::function<void(const GptqReport&)>& on_matrix,
               const GptqOptions& options, const std::vector<float>* input_map_t = nullptr);

// H = X^T X over the rows of x, one fp32 product per `chunk` rows summed in fp64 (as calibrate
// sums a window at a time).
std::vector<double> hessian_of(const float* x, int64_t rows, int64_t cols, int64_t chunk, ThreadPool& pool);
// A^T B (cols x cols) for a and b of rows x cols each, by hessian_of's rule (with a = b it is H).
std::vector<double> cross_product_of(const float* a, const float* b, int64_t rows, int64_t cols, int64_t chunk,
                                     ThreadPool& pool);
// The mean of the diagonal of the n x n row-major a: what every damping and ridge here is a share of.
double mean_diagonal(const std::vector<double>& a, int64_t n);

// In-place lower Cholesky factor of the n x n row-major a (upper triangle left as is); false if a
// is not positive definite.
bool cholesky_lower(std::vector<double>& a, int64_t n);
// b (n) <- (l l^T)^-1 b, l the lower factor cholesky_lower left.
void cholesky_solve(const std::vector<double>& l, double* b, int64_t n);

}  // namespace kiln::quant
