#include "profile/roofline_svg.h"

#include <algorithm>
#include <cmath>

#include <fmt/core.h>

namespace kiln::profile {
namespace {

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace

std::string roofline_svg(const std::string& title, double copy_gbs, double peak_tflops,
                         const std::vector<RooflinePoint>& points) {
  const double W = 900, H = 560, left = 80, right = 30, top = 50, bottom = 60;
  // Axes: intensity 0.1 .. 10^4 FLOP/byte, throughput 10^-3 .. 10^(ceil log10 peak) TFLOP/s.
  const double x0 = -1, x1 = 4, y0 = -3, y1 = std::ceil(std::log10(std::max(peak_tflops, 1.0)) + 0.3);
  auto px = [&](double ai) { return left + (std::log10(ai) - x0) / (x1 - x0) * (W - left - right); };
  auto py = [&](double tf) { return H - bottom - (std::log10(tf) - y0) / (y1 - y0) * (H - top - bottom); };
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{}\" y=\"25\" font-size=\"15\">{}</text>\n",
      W, H, left, escape(title));
  // Grid and tick labels at powers of ten.
  for (int e = int(x0); e <= int(x1); ++e) {
    const double x = px(std::pow(10.0, e));
    svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#ddd\"/>"
                       "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4:g}</text>\n",
                       x, top, H - bottom, H - bottom + 18, std::pow(10.0, e));
  }
  for (int e = int(y0); e <= int(y1); ++e) {
    const double y = py(std::pow(10.0, e));
    svg += fmt::format("<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#ddd\"/>"
                       "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5:g}</text>\n",
                       left, y, W - right, left - 6, y + 4, std::pow(10.0, e));
  }
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">arithmetic intensity (FLOP / byte)</text>\n",
                     (left + W - right) / 2, H - 15);
  svg += fmt::format("<text x=\"18\" y=\"{}\" transform=\"rotate(-90 18 {})\" text-anchor=\"middle\">TFLOP/s</text>\n",
                     (top + H - bottom) / 2, (top + H - bottom) / 2);
  // Roofs: TFLOP/s = intensity * GB/s / 1000 up to the ridge, then flat at the peak.
  const double ridge = peak_tflops * 1000 / copy_gbs;
  const double ai_lo = std::pow(10.0, x0), ai_hi = std::pow(10.0, x1);
  svg += fmt::format("<polyline fill=\"none\" stroke=\"#c0392b\" stroke-width=\"2\" points=\"{:.1f},{:.1f} {:.1f},{:.1f} {:.1f},{:.1f}\"/>\n",
                     px(ai_lo), py(ai_lo * copy_gbs / 1000), px(ridge), py(peak_tflops), px(ai_hi), py(peak_tflops));
  svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"#c0392b\">{:.0f} GB/s</text>\n", px(0.3),
                     py(0.3 * copy_gbs / 1000) - 8, copy_gbs);
  svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"#c0392b\">{:.0f} TFLOP/s</text>\n", px(ridge) + 8,
                     py(peak_tflops) - 6, peak_tflops);
  for (size_t i = 0; i < points.size(); ++i) {
    const RooflinePoint& p = points[i];
    if (!(p.flop_per_byte > 0) || !(p.tflops > 0)) continue;
    const double x = px(std::clamp(p.flop_per_byte, ai_lo, ai_hi));
    const double y = py(std::clamp(p.tflops, std::pow(10.0, y0), std::pow(10.0, y1)));
    svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4\" fill=\"#2c6fbb\"/>"
                       "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\">{}</text>\n",
                       x, y, x + 6, y - 4 + double(i % 3) * 8, escape(p.label));
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace kiln::profile
