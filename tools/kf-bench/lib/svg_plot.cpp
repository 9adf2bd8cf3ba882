// SPDX-License-Identifier: Apache-2.0
#include "kf-bench/lib/svg_plot.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "kf-bench/lib/parse.hpp"

namespace kf::tools::bench {

namespace {

// The canvas and the plot area inside it, in SVG user units (pixels).
constexpr double kWidth = 900;
constexpr double kHeight = 540;
constexpr double kLeft = 80;
constexpr double kRight = 870;
constexpr double kTop = 50;
constexpr double kBottom = 470;
// At most this many labelled x ticks; the others are unlabelled marks.
constexpr double kMaxXLabels = 13;

// Distinct on white and for the common forms of colour blindness (Tableau 10).
constexpr std::array<const char*, 10> kPalette{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                               "#9467bd", "#8c564b", "#e377c2", "#17becf",
                                               "#7f7f7f", "#bcbd22"};

std::string escape(const std::string& text) {
  std::string out;
  for (const char c : text) {
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

std::string number(double value, int decimals = 1) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

bool drawable(const PlotPoint& p) {
  return p.bytes > 0 && std::isfinite(p.bytes) && std::isfinite(p.value);
}

// 1, 2 or 5 times a power of ten, at least `raw`: a step that gives round tick labels.
double nice_step(double raw) {
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double r = raw / magnitude;
  return (r <= 1 ? 1 : r <= 2 ? 2 : r <= 5 ? 5 : 10) * magnitude;
}

struct Axes {
  double log2_min = 0;  // x axis: exponents of two
  double log2_max = 1;
  double y_step = 1;
  double y_max = 1;

  double x(double bytes) const {
    return kLeft + (std::log2(bytes) - log2_min) / (log2_max - log2_min) * (kRight - kLeft);
  }
  double y(double value) const { return kBottom - value / y_max * (kBottom - kTop); }
};

Axes axes_for(const Plot& plot) {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -lo;
  double top = 0;
  for (const PlotSeries& s : plot.series) {
    for (const PlotPoint& p : s.points) {
      if (!drawable(p)) continue;
      lo = std::min(lo, std::log2(p.bytes));
      hi = std::max(hi, std::log2(p.bytes));
      top = std::max(top, p.value);
    }
  }
  Axes a;
  if (lo <= hi) {
    a.log2_min = std::floor(lo);
    a.log2_max = std::max(std::ceil(hi), a.log2_min + 1);
  }
  a.y_step = nice_step(top > 0 ? top / 5 : 0.2);
  a.y_max = std::ceil(top / a.y_step) * a.y_step;
  if (a.y_max <= 0) a.y_max = a.y_step;
  return a;
}

void write_axes(std::ostringstream& svg, const Plot& plot, const Axes& a) {
  const int decimals = a.y_step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(a.y_step)));
  for (double v = 0; v <= a.y_max + a.y_step / 2; v += a.y_step) {
    const std::string y = number(a.y(v));
    svg << "<line x1=\"" << kLeft << "\" y1=\"" << y << "\" x2=\"" << kRight << "\" y2=\"" << y
        << "\" stroke=\"#e0e0e0\"/>\n"
        << "<text x=\"" << kLeft - 8 << "\" y=\"" << y
        << "\" text-anchor=\"end\" dominant-baseline=\"middle\">" << number(v, decimals)
        << "</text>\n";
  }
  const double span = a.log2_max - a.log2_min;
  const int label_every = std::max(1, static_cast<int>(std::ceil(span / kMaxXLabels)));
  for (int e = static_cast<int>(a.log2_min); e <= static_cast<int>(a.log2_max); ++e) {
    const std::string x = number(a.x(std::exp2(e)));
    const bool labelled = e % label_every == 0;
    svg << "<line x1=\"" << x << "\" y1=\"" << kBottom << "\" x2=\"" << x << "\" y2=\""
        << kBottom + (labelled ? 6 : 3) << "\" stroke=\"black\"/>\n";
    if (labelled) {
      svg << "<text x=\"" << x << "\" y=\"" << kBottom + 20 << "\" text-anchor=\"middle\">"
          << escape(format_bytes(static_cast<std::size_t>(std::exp2(e)))) << "</text>\n";
    }
  }
  svg << "<rect x=\"" << kLeft << "\" y=\"" << kTop << "\" width=\"" << kRight - kLeft
      << "\" height=\"" << kBottom - kTop << "\" fill=\"none\" stroke=\"black\"/>\n"
      << "<text x=\"" << kWidth / 2 << "\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">"
      << escape(plot.title) << "</text>\n"
      << "<text x=\"" << (kLeft + kRight) / 2 << "\" y=\"" << kBottom + 48
      << "\" text-anchor=\"middle\">" << escape(plot.x_label) << "</text>\n"
      << "<text transform=\"translate(24 " << (kTop + kBottom) / 2
      << ") rotate(-90)\" text-anchor=\"middle\">" << escape(plot.y_label) << "</text>\n";
}

void write_series(std::ostringstream& svg, const PlotSeries& s, const char* colour, const Axes& a) {
  const char* dash = s.dashed ? " stroke-dasharray=\"6 4\"" : "";
  svg << "<polyline fill=\"none\" stroke=\"" << colour << "\" stroke-width=\"2\"" << dash
      << " points=\"";
  const char* separator = "";
  for (const PlotPoint& p : s.points) {
    if (!drawable(p)) continue;
    svg << separator << number(a.x(p.bytes)) << ',' << number(a.y(p.value));
    separator = " ";
  }
  svg << "\"/>\n";
  for (const PlotPoint& p : s.points) {
    if (!drawable(p)) continue;
    svg << "<circle cx=\"" << number(a.x(p.bytes)) << "\" cy=\"" << number(a.y(p.value))
        << "\" r=\"3\" fill=\"" << colour << "\"/>\n";
  }
}

void write_legend(std::ostringstream& svg, const Plot& plot) {
  std::size_t longest = 0;
  for (const PlotSeries& s : plot.series) longest = std::max(longest, s.name.size());
  const double x = kLeft + 12;
  const double y = kTop + 12;
  svg << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"" << 52 + 7.5 * longest
      << "\" height=\"" << 10 + 20 * plot.series.size()
      << "\" fill=\"white\" fill-opacity=\"0.85\" stroke=\"#a0a0a0\"/>\n";
  for (std::size_t i = 0; i < plot.series.size(); ++i) {
    const PlotSeries& s = plot.series[i];
    const char* colour = kPalette[i % kPalette.size()];
    const double row = y + 15 + 20 * static_cast<double>(i);
    svg << "<line x1=\"" << x + 8 << "\" y1=\"" << row << "\" x2=\"" << x + 38 << "\" y2=\"" << row
        << "\" stroke=\"" << colour << "\" stroke-width=\"2\""
        << (s.dashed ? " stroke-dasharray=\"6 4\"" : "") << "/>\n"
        << "<circle cx=\"" << x + 23 << "\" cy=\"" << row << "\" r=\"3\" fill=\"" << colour
        << "\"/>\n"
        << "<text x=\"" << x + 46 << "\" y=\"" << row << "\" dominant-baseline=\"middle\">"
        << escape(s.name) << "</text>\n";
  }
}

}  // namespace

std::string svg_plot(const Plot& plot) {
  const Axes a = axes_for(plot);
  std::ostringstream svg;
  svg << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight
      << "\" viewBox=\"0 0 " << kWidth << ' ' << kHeight
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  write_axes(svg, plot, a);
  for (std::size_t i = 0; i < plot.series.size(); ++i) {
    write_series(svg, plot.series[i], kPalette[i % kPalette.size()], a);
  }
  write_legend(svg, plot);
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace kf::tools::bench
