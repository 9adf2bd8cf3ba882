// SPDX-License-Identifier: Apache-2.0
// A line plot as a standalone SVG document, written by hand (kf-bench compare's busbw against
// message size): a log2 x axis of byte counts labelled 4, 16, 64, …, 1K, …, 64M; a linear y axis
// from 0; one polyline with a marker at each point per series; a legend. No dependencies, so
// the plot can be viewed in any browser. Thread-safety: a pure function.
#pragma once

#include <string>
#include <vector>

namespace kf::tools::bench {

struct PlotPoint {
  double bytes = 0;  ///< x: a byte count (> 0; others are left out)
  double value = 0;  ///< y
};

struct PlotSeries {
  std::string name;
  std::vector<PlotPoint> points;  ///< drawn in this order
  bool dashed = false;
};

struct Plot {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<PlotSeries> series;  ///< coloured in order from a fixed palette
};

/// The SVG document of `plot`, text escaped for XML.
std::string svg_plot(const Plot& plot);

}  // namespace kf::tools::bench
