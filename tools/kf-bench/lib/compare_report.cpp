// SPDX-License-Identifier: Apache-2.0
// compare's tables and plots (declared in compare.hpp).
#include <algorithm>
#include <cstdio>
#include <set>

#include "kf-bench/lib/compare.hpp"
#include "kf-bench/lib/parse.hpp"

namespace kf::tools::bench {

namespace {

// References for kf's large-message algbw on this machine: the copy rate measured in the run
// (copy_rate.hpp), and one TCP stream over loopback. Shown for messages of kLargeBytes and
// more, where latency stops mattering.
constexpr double kTcpStreamGbps = 3.0;
constexpr std::size_t kLargeBytes = std::size_t{1} << 20;

struct Layout {
  std::vector<std::string> impls;  // as in the points: known_impls() order
  std::vector<std::size_t> sizes;
};

Layout layout_of(const std::vector<Point>& points, int np) {
  Layout l;
  std::set<std::size_t> sizes;
  for (const Point& p : points) {
    if (p.np != np) continue;
    if (l.impls.empty() || l.impls.back() != p.impl) l.impls.push_back(p.impl);
    sizes.insert(p.bytes);
  }
  l.sizes.assign(sizes.begin(), sizes.end());
  return l;
}

std::string label_of(const std::string& impl) {
  const ImplSpec* spec = find_impl(base_impl(impl));
  if (spec == nullptr) return impl.substr(0, 15);
  return std::string(spec->label) +
         (is_other_build(impl) ? std::string(kOtherBuildSuffix) : std::string());
}

void print_times(std::ostream& out, const std::vector<Point>& points, int np, const Layout& l,
                 int rounds) {
  char cell[64];
  out << "# np=" << np << ", f32 sum allreduce: per implementation the median over " << rounds
      << " round(s) of each run's median time (us) and the busbw from it (GB/s)\n#      ";
  for (const std::string& impl : l.impls) {
    std::snprintf(cell, sizeof cell, " %16s ", label_of(impl).c_str());
    out << cell;
  }
  out << "\n#  size";
  for (std::size_t i = 0; i < l.impls.size(); ++i) out << "        us   GB/s ";
  out << "\n";
  bool any_incorrect = false;
  for (const std::size_t bytes : l.sizes) {
    std::snprintf(cell, sizeof cell, "%7s", format_bytes(bytes).c_str());
    out << cell;
    for (const std::string& impl : l.impls) {
      const Point* p = find_point(points, np, impl, bytes);
      if (p == nullptr) {
        std::snprintf(cell, sizeof cell, " %9s %6s ", "-", "-");
      } else {
        std::snprintf(cell, sizeof cell, " %9.1f %6.3f%c", p->median_us, p->busbw_gbps,
                      p->correct ? ' ' : '!');
        any_incorrect = any_incorrect || !p->correct;
      }
      out << cell;
    }
    out << "\n";
  }
  if (any_incorrect) out << "# !: a run's result check failed there\n";
}

std::string ratio_cell(const std::vector<Point>& points, int np, std::size_t bytes,
                       TransportClass transport, std::string_view kf_impl = {}) {
  char cell[64];
  const auto best = best_baseline(points, np, bytes, transport, kf_impl);
  if (!best) {
    std::snprintf(cell, sizeof cell, "  %7s %-23s", "-", "");
  } else {
    std::snprintf(cell, sizeof cell, "  %7.2f %-23s", best->ratio,
                  ("(" + best->impl + ")").c_str());
  }
  return cell;
}

std::string algbw_cells(const std::vector<Point>& points, int np, std::size_t bytes,
                        std::string_view impl, const CopyRate& copy) {
  char cell[64];
  const Point* p = find_point(points, np, impl, bytes);
  if (p == nullptr || bytes < kLargeBytes) {
    std::snprintf(cell, sizeof cell, "  %8s %6s %6s", "-", "-", "-");
  } else if (copy.gbps <= 0) {
    std::snprintf(cell, sizeof cell, "  %8.3f %6s %6.2f", p->algbw_gbps, "-",
                  p->algbw_gbps / kTcpStreamGbps);
  } else {
    std::snprintf(cell, sizeof cell, "  %8.3f %6.2f %6.2f", p->algbw_gbps,
                  p->algbw_gbps / copy.gbps, p->algbw_gbps / kTcpStreamGbps);
  }
  return cell;
}

void print_ratios(std::ostream& out, const std::vector<Point>& points, int np, const Layout& l,
                  const CopyRate& copy) {
  char rate[160] = "no copy rate measured";
  if (copy.gbps > 0) {
    std::snprintf(rate, sizeof rate, "%.2f GB/s (memcpy of %s per thread, %d at once, this run)",
                  copy.gbps, format_bytes(copy.bytes).c_str(), copy.threads);
  }
  out << "# np=" << np
      << ": kf's time / the fastest correct baseline's of its class (< 1: kf is "
         "faster); kf's algbw (GB/s), and as a\n# fraction of "
      << rate << " and of " << kTcpStreamGbps
      << " GB/s (one loopback TCP stream), for messages of 1 MiB and more\n";
  char head[200];
  std::snprintf(head, sizeof head, "#  size  %-31s  %-31s  %8s %6s %6s  %8s %6s %6s\n",
                "kf-tcp / best tcp", "kf / best local", "kf-tcp", "/copy", "/3GB/s", "kf", "/copy",
                "/3GB/s");
  out << head;
  for (const std::size_t bytes : l.sizes) {
    char size[16];
    std::snprintf(size, sizeof size, "%7s", format_bytes(bytes).c_str());
    out << size << ratio_cell(points, np, bytes, TransportClass::tcp)
        << ratio_cell(points, np, bytes, TransportClass::local)
        << algbw_cells(points, np, bytes, "kf-tcp", copy)
        << algbw_cells(points, np, bytes, "kf", copy) << "\n";
  }
}

// With kf-tcp-nomac among the points: kf over TCP with the frame MACs on and off, each against
// the fastest TCP baseline, and the MACs' share of kf-tcp's time.
void print_mac_cost(std::ostream& out, const std::vector<Point>& points, int np, const Layout& l) {
  const auto has = [&](const char* impl) {
    return std::find(l.impls.begin(), l.impls.end(), impl) != l.impls.end();
  };
  if (!has("kf-tcp") || !has("kf-tcp-nomac")) return;
  out << "\n# np=" << np
      << ": the frame MACs over TCP: kf-tcp (MACs on) and kf-tcp-nomac (KF_FRAME_AUTH=off) "
         "against the fastest TCP baseline, and the MACs' share of kf-tcp's time "
         "(1 - off/on)\n";
  char line[200];
  std::snprintf(line, sizeof line, "#  size  %-31s  %-31s  %9s\n", "kf-tcp / best tcp",
                "kf-tcp-nomac / best tcp", "MAC share");
  out << line;
  for (const std::size_t bytes : l.sizes) {
    const Point* on = find_point(points, np, "kf-tcp", bytes);
    const Point* off = find_point(points, np, "kf-tcp-nomac", bytes);
    char share[32] = "        -";
    if (on != nullptr && off != nullptr && on->median_us > 0) {
      std::snprintf(share, sizeof share, "%8.0f%%", 100.0 * (1.0 - off->median_us / on->median_us));
    }
    std::snprintf(line, sizeof line, "%7s", format_bytes(bytes).c_str());
    out << line << ratio_cell(points, np, bytes, TransportClass::tcp, "kf-tcp")
        << ratio_cell(points, np, bytes, TransportClass::tcp, "kf-tcp-nomac") << "  " << share
        << "\n";
  }
}

// With kf-shared among the points: kf with its buffers in kf::SharedMemory against the fastest
// local baseline and against kf with heap buffers, and its algbw as a fraction of the copy rate.
void print_shared_memory(std::ostream& out, const std::vector<Point>& points, int np,
                         const Layout& l, const CopyRate& copy) {
  if (std::find(l.impls.begin(), l.impls.end(), "kf-shared") == l.impls.end()) return;
  out << "\n# np=" << np
      << ": kf-shared (buffers in kf::SharedMemory, read in place by same-host peers) against "
         "the fastest local baseline\n# and against kf (heap buffers); its algbw, and as a "
         "fraction of the copy rate and of 3 GB/s as above\n";
  char line[200];
  std::snprintf(line, sizeof line, "#  size  %-31s  %14s  %8s %6s %6s\n", "kf-shared / best local",
                "kf-shared / kf", "algbw", "/copy", "/3GB/s");
  out << line;
  for (const std::size_t bytes : l.sizes) {
    const Point* shared = find_point(points, np, "kf-shared", bytes);
    const Point* heap = find_point(points, np, "kf", bytes);
    char vs_kf[32] = "             -";
    if (shared != nullptr && heap != nullptr && heap->median_us > 0) {
      std::snprintf(vs_kf, sizeof vs_kf, "%14.2f", shared->median_us / heap->median_us);
    }
    std::snprintf(line, sizeof line, "%7s", format_bytes(bytes).c_str());
    out << line << ratio_cell(points, np, bytes, TransportClass::local, "kf-shared") << "  "
        << vs_kf << algbw_cells(points, np, bytes, "kf-shared", copy) << "\n";
  }
}

}  // namespace

void print_tables(std::ostream& out, const std::vector<Point>& points, int np, int rounds,
                  const CopyRate& copy) {
  const Layout l = layout_of(points, np);
  if (l.impls.empty()) {
    out << "# np=" << np << ": no results\n";
    return;
  }
  print_times(out, points, np, l, rounds);
  out << "\n";
  print_ratios(out, points, np, l, copy);
  print_mac_cost(out, points, np, l);
  print_shared_memory(out, points, np, l, copy);
  out << std::flush;
}

Plot busbw_plot(const std::vector<Point>& points, int np) {
  Plot plot;
  plot.title =
      "f32 sum allreduce, np=" + std::to_string(np) + ": busbw (median time over the rounds)";
  plot.x_label = "message bytes per worker (log2 scale)";
  plot.y_label = "busbw (GB/s)";
  for (const std::string& impl : layout_of(points, np).impls) {
    PlotSeries s;
    s.name = impl;
    const ImplSpec* spec = find_impl(base_impl(impl));
    s.dashed = spec != nullptr && spec->transport == TransportClass::tcp;
    for (const Point& p : points) {
      if (p.np == np && p.impl == impl)
        s.points.push_back({static_cast<double>(p.bytes), p.busbw_gbps});
    }
    plot.series.push_back(std::move(s));
  }
  return plot;
}

}  // namespace kf::tools::bench
