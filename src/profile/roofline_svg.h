// A roofline chart as a standalone SVG: log-log axes of arithmetic intensity (FLOP/byte) and
// TFLOP/s, the bandwidth roof and the compute roof of the measured ceilings, one labelled point per
// kernel. Hand-written SVG: no plotting dependency for one chart.
#pragma once

#include <string>
#include <vector>

namespace kiln::profile {

struct RooflinePoint {
  std::string label;
  double flop_per_byte = 0;
  double tflops = 0;
};

std::string roofline_svg(const std::string& title, double copy_gbs, double peak_tflops,
                         const std::vector<RooflinePoint>& points);

}  // namespace kiln::profile
