// Coordinate descent on int4 codes (session 20), in the manner of QuantEase (Behdin et al., 2023,
// "QuantEase: Optimization-based Quantization for Language Models"): with every group's grid held,
// each code in turn is moved to the grid point that minimizes the row's output error d^T H d given
// all the others, sweep after sweep, until a sweep moves none (or a limit).
//
// Why after GPTQ: GPTQ visits each column once and never revisits it, so a code chosen early cannot
// answer the error spread onto later columns; the refit (gptq.h: refit_int4_grids) moves the grids
// and leaves the codes. A descent step on one code is exact and cheap: with r = H d, moving column j's
// value by D changes the error by -2 D r_j + D^2 H_jj, and r by -D H[:, j]. Every accepted move lowers
// the error, so alternating descent and refit never raises it.
#pragma once

#include <cstdint>
#include <vector>

#include "core/thread_pool.h"
#include "model/quantized_matrix.h"

namespace kiln::quant {

struct Int4DescentResult {
  int64_t moves = 0;   // codes changed over all sweeps and rows
  int64_t sweeps = 0;  // the most sweeps any row ran
};

// q (int4, rows x cols, of w) in place: at most max_sweeps sweeps over each row's columns against
// H (cols x cols, row-major). A row stops when a sweep moves no code.
Int4DescentResult int4_coordinate_descent(const float* w, QuantizedMatrix& q, const std::vector<double>& H,
                                          int max_sweeps, ThreadPool& pool);

}  // namespace kiln::quant
