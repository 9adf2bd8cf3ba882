// SPDX-License-Identifier: Apache-2.0
#include "session/boundary_rules.hpp"

#include <algorithm>
#include <bit>

namespace kf::detail {

void BoundaryAgreement::heard(std::uint64_t index) noexcept { heard_ = std::max(heard_, index); }

BoundaryAgreement::Verdict BoundaryAgreement::at_step_end(bool own_reason) const noexcept {
  const std::uint64_t next = passed_ + 1;
  if (heard_ >= next) return Verdict{true, false, next};
  if (own_reason) return Verdict{true, true, next};
  return Verdict{false, false, 0};
}

void BoundaryAgreement::passed(std::uint64_t index) noexcept {
  passed_ = std::max(passed_, index);
  heard_ = std::max(heard_, passed_);
}

void BoundaryAgreement::restart() noexcept { passed_ = heard_ = 0; }

void pack(const BoundaryRecord& record, std::span<const double> metrics, const RecordLayout& layout,
          std::span<std::int64_t> out) {
  out[0] = static_cast<std::int64_t>(record.version_seen);
  out[1] = record.commits;
  out[2] = static_cast<std::int64_t>(record.doc_bytes);
  out[3] = static_cast<std::int64_t>(record.ready_version);
  out[4] = record.steps;
  for (std::size_t i = 0; i < metrics.size(); ++i) {
    out[layout.metrics_at() + i] = std::bit_cast<std::int64_t>(metrics[i]);
  }
}

std::vector<BoundaryRecord> unpack(std::span<const std::int64_t> all, const RecordLayout& layout) {
  const std::size_t words = layout.words();
  std::vector<BoundaryRecord> records(all.size() / words);
  for (std::size_t r = 0; r < records.size(); ++r) {
    const auto w = all.subspan(r * words, words);
    records[r] =
        BoundaryRecord{static_cast<std::uint64_t>(w[0]), w[1], static_cast<std::uint64_t>(w[2]),
                       static_cast<std::uint64_t>(w[3]), w[4]};
  }
  return records;
}

std::vector<double> average_metrics(std::span<const std::int64_t> all, const RecordLayout& layout) {
  const std::size_t words = layout.words();
  const std::size_t workers = all.size() / words;
  std::vector<double> mean(layout.metrics, 0.0);
  for (std::size_t i = 0; i < layout.metrics; ++i) {
    double sum = 0;
    for (std::size_t r = 0; r < workers; ++r) {
      sum += std::bit_cast<double>(all[r * words + layout.metrics_at() + i]);
    }
    mean[i] = sum / static_cast<double>(workers);
  }
  return mean;
}

BoundaryDecision decide(const BoundaryView& view, std::span<const BoundaryRecord> records) {
  std::uint64_t newest = 0;
  std::size_t root = 0;
  for (std::size_t r = 0; r < records.size(); ++r) {
    if (records[r].version_seen > newest) {
      newest = records[r].version_seen;
      root = r;
    }
  }
  if (view.pending != nullptr && newest <= view.pending->version) {
    for (const auto& w : view.pending->workers) {
      const auto r = view.current.rank_of(w.endpoint);  // joiners have no record yet
      if (r && records[static_cast<std::size_t>(*r)].ready_version != view.pending->version) {
        return {BoundaryDecision::Action::wait_for_joiners};
      }
    }
    return {BoundaryDecision::Action::switch_to_pending};
  }
  if (newest <= view.current.version || newest == view.refused_version) return {};
  return {BoundaryDecision::Action::fetch_newer, static_cast<int>(root),
          static_cast<std::size_t>(records[root].doc_bytes)};
}

NewerVerdict judge_newer(const Cluster& target, const ClusterSettings& settings,
                         const Cluster& current) {
  NewerVerdict v;
  v.kind = target.workers == current.workers ? "settings" : "resize";
  // Bounds from the job settings (kf-member checks them too; any writer may not).
  if (settings.max_workers && *settings.max_workers > 0 && target.size() > *settings.max_workers) {
    v.action = NewerVerdict::Action::refuse;
    v.reason = std::to_string(target.size()) + " workers exceed max_workers " +
               std::to_string(*settings.max_workers);
    return v;
  }
  for (const auto& w : target.workers) {
    if (!current.rank_of(w.endpoint)) {
      v.action = NewerVerdict::Action::wait_for_joiners;
      return v;
    }
  }
  return v;
}

}  // namespace kf::detail
