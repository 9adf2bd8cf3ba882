// SPDX-License-Identifier: Apache-2.0
#include "kf-chaos/lib/verdict.hpp"
#include "kf/common/json.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

namespace kf::chaos {

namespace {

// The text after the "[WORKER] " tag kfrun puts before each line, and the tag's worker.
std::string_view untagged(std::string_view line, std::string_view& worker) {
  worker = {};
  if (line.starts_with('[')) {
    const auto close = line.find("] ");
    if (close != std::string_view::npos) {
      worker = line.substr(1, close - 1);
      return line.substr(close + 2);
    }
  }
  return line;
}

}  // namespace

double percentile(std::vector<double> ms, double p) {
  if (ms.empty()) return 0.0;
  std::sort(ms.begin(), ms.end());
  const auto rank = static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(ms.size())));
  return ms[std::clamp<std::size_t>(rank, 1, ms.size()) - 1];
}

Verdict judge(std::string_view output) {
  Verdict v;
  // Digits bounded so that the numbers convert without overflow; longer ones do not match.
  const std::regex final_re(R"(^final step=(\d{1,18}) workers=(\d{1,9}) hash=([0-9A-Za-z]+)\b)");
  std::set<std::int64_t> steps;
  std::set<std::string> hashes;
  std::set<int> stated;
  // By cluster version: each worker's commit when it went there, and whether it received or
  // sent the state then.
  struct Resumed {
    std::string worker;
    std::int64_t commit = 0;
    bool synced = false;
  };
  std::map<std::uint64_t, std::vector<Resumed>> commits;
  std::istringstream in{std::string(output)};
  for (std::string raw; std::getline(in, raw);) {
    std::string_view worker;
    const std::string line(untagged(raw, worker));
    const std::string who = worker.empty() ? "a worker" : std::string(worker);
    if (line.starts_with("BROKEN")) {
      v.problems.push_back(who + " reported a broken guarantee: " + line);
    } else if (line.starts_with("final ")) {
      std::smatch m;
      if (!std::regex_search(line, m, final_re)) {
        v.problems.push_back(who + " printed a final line kf-chaos cannot read: " + line);
        continue;
      }
      ++v.finals;
      steps.insert(std::stoll(m[1]));
      stated.insert(std::stoi(m[2]));
      hashes.insert(m[3]);
    } else if (line.starts_with("change {")) {
      const auto j = parse_json_or_discard(line.substr(7));
      if (j.is_discarded() || !j.contains("to_version") || !j["to_version"].is_number_unsigned() ||
          !j.contains("commit") || !j["commit"].is_number_integer()) {
        v.problems.push_back(who + " printed a change line kf-chaos cannot read: " + line);
        continue;
      }
      // A joiner's record counts its own commits (none yet), not the job's; a leaver's names
      // no version it went to.
      const std::string kind =
          j.contains("kind") && j["kind"].is_string() ? j["kind"].get<std::string>() : "";
      if (kind == "join" || kind == "left") continue;
      if (kind == "recovery") {
        const auto us = [&](const char* key) -> std::int64_t {
          return j.contains(key) && j[key].is_number_integer() ? j[key].get<std::int64_t>() : 0;
        };
        const std::int64_t detected = us("detected_us"), resumed = us("resumed_us");
        if (detected > 0 && resumed >= detected) {
          const double ms = static_cast<double>(resumed - detected) / 1000.0;
          v.recovery_pauses_ms.push_back(ms);
          if (us("from_size") - us("to_size") > 1) v.overlapping_pauses_ms.push_back(ms);
        }
      }
      const bool synced = j.contains("sync_bytes") && j["sync_bytes"].is_number_unsigned() &&
                          j["sync_bytes"].get<std::uint64_t>() > 0;
      commits[j["to_version"].get<std::uint64_t>()].push_back(
          {who, j["commit"].get<std::int64_t>(), synced});
    }
  }
  if (v.finals == 0) {
    v.problems.push_back(
        "no worker printed a final line (\"final step=S workers=N hash=H\"): the job did not "
        "finish, or the program does not report its parameters");
  } else {
    v.final_step = *steps.rbegin();
    v.hash = *hashes.begin();
    v.final_workers = *stated.rbegin();
    if (hashes.size() > 1) {
      v.problems.push_back("the workers finished with different parameters (" +
                           std::to_string(hashes.size()) + " different hashes)");
    }
    if (steps.size() > 1) {
      v.problems.push_back("the workers finished at different steps (" +
                           std::to_string(*steps.begin()) + " to " +
                           std::to_string(*steps.rbegin()) + ")");
    }
    if (stated.size() > 1 || *stated.begin() != v.finals) {
      v.problems.push_back(std::to_string(v.finals) + " workers printed a final line, but they " +
                           "say the job had " + std::to_string(*stated.rbegin()) + " workers");
    }
  }
  std::int64_t before = -1;
  std::uint64_t before_version = 0;
  for (const auto& [version, seen] : commits) {
    ++v.changes;
    // A worker may miss the last commit of the others (the control collective of a boundary
    // finished on them and failed on it); the agreement then gives it the newest state. Behind
    // without a sync, it would go on from another step than the others.
    std::int64_t commit = -1;
    for (const auto& r : seen) commit = std::max(commit, r.commit);
    for (const auto& r : seen) {
      if (r.commit < commit && !r.synced) {
        v.problems.push_back(r.worker + " went to version " + std::to_string(version) +
                             " at step " + std::to_string(r.commit) + ", behind the commit " +
                             std::to_string(commit) + " of others, and no state was synced");
      }
    }
    if (commit < before) {
      v.problems.push_back("committed progress went back: version " + std::to_string(version) +
                           " resumed from step " + std::to_string(commit) + ", but version " +
                           std::to_string(before_version) + " had committed step " +
                           std::to_string(before));
    }
    before = std::max(before, commit);
    before_version = version;
  }
  v.last_commit = before;
  if (v.finals > 0 && before > v.final_step) {
    v.problems.push_back("the job finished at step " + std::to_string(v.final_step) +
                         ", before step " + std::to_string(before) + " that it had committed");
  }
  v.pass = v.problems.empty();
  return v;
}

}  // namespace kf::chaos
