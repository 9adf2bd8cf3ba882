// SPDX-License-Identifier: Apache-2.0
#include "kf-member/lib/commands.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "kf/common/json.hpp"
#include "kf/runtime/cluster_settings.hpp"
#include "kfrun/lib/notice.hpp"

namespace kf::member {
namespace {

std::string join_workers(const std::vector<WorkerSpec>& workers) {
  std::string s;
  for (const auto& w : workers) s += (s.empty() ? "" : ", ") + w.endpoint.str();
  return s;
}

// Removes the worker named by `spec` and returns its endpoint. Throws: UnknownWorker.
std::string remove_worker(Cluster& c, const std::string& spec) {
  const int rank = find_worker(c, spec);
  std::string endpoint = c.workers[static_cast<std::size_t>(rank)].endpoint.str();
  c.workers.erase(c.workers.begin() + rank);
  return endpoint;
}

// Records the events of a change that is stored already. The change took effect whatever happens
// here (a `set stop=true` ends a job, and with it a builtin service), so a failure is reported as
// a note on `out`, never thrown.
void post_events(CommandContext& ctx, const std::vector<PendingEvent>& events,
                 std::uint64_t version) {
  for (const auto& e : events) {
    try {
      ctx.client.post_event(e.type, e.worker, e.detail, version);
    } catch (const std::exception& error) {
      ctx.out << "v" << version << ": the change took effect; its '" << e.type
              << "' event was not recorded: " << error.what() << std::endl;
      return;
    }
  }
}

}  // namespace

nlohmann::json parse_assignments(const std::vector<std::string>& assignments) {
  static const std::set<std::string> kKeys = {
      "algorithm",   "batch_size", "lr",     "min_workers", "max_workers", "mode",
      "compression", "balance",    "epochs", "stop",        "autoscale",   "spares"};
  nlohmann::json values = nlohmann::json::object();
  for (const std::string& a : assignments) {
    const std::size_t eq = a.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw std::invalid_argument("'" + a + "' is not KEY=VALUE");
    }
    const std::string key = a.substr(0, eq), text = a.substr(eq + 1);
    if (kKeys.count(key) == 0) {
      std::string known;
      for (const auto& k : kKeys) known += (known.empty() ? "" : ", ") + k;
      throw std::invalid_argument("'" + key + "' is not a setting kf-member sets (" + known + ")");
    }
    if (values.contains(key)) throw std::invalid_argument("'" + key + "' is given twice");
    nlohmann::json v = parse_json_or_discard(text);
    if (key == "autoscale") {
      // A JSON object, or "off": the key is removed (null marks it until set_settings).
      if (text == "off") {
        values[key] = nullptr;
        continue;
      }
      if (!v.is_object()) {
        throw std::invalid_argument(
            "settings.autoscale: expected a JSON object such as "
            "'{\"min\": 2, \"max\": 8, \"target\": \"all\", \"cooldown_s\": 30}' or off, got " +
            text);
      }
    } else if (v.is_discarded() || v.is_object() || v.is_array() || v.is_null()) {
      v = text;
    }
    values[key] = v;
  }
  nlohmann::json checked = values;
  if (checked.contains("autoscale") && checked["autoscale"].is_null()) checked.erase("autoscale");
  const ParsedSettings parsed = parse_cluster_settings(checked);
  if (!parsed.errors.empty()) throw std::invalid_argument(parsed.errors.front());
  if (values.contains("epochs") &&
      (!values["epochs"].is_number_integer() || values["epochs"].get<std::int64_t>() < 1)) {
    throw std::invalid_argument("settings.epochs: expected an integer >= 1, got " +
                                values["epochs"].dump());
  }
  return values;
}

void set_settings(CommandContext& ctx, const nlohmann::json& values) {
  mutate(ctx, [&](Cluster& c) {
    Edit edit;
    std::string changed;
    for (const auto& [key, value] : values.items()) {
      if (value.is_null()) {  // "off"
        if (c.settings.erase(key) > 0) changed += (changed.empty() ? "" : ", ") + key + "=off";
        continue;
      }
      if (c.settings.contains(key) && c.settings[key] == value) continue;
      c.settings[key] = value;
      changed += (changed.empty() ? "" : ", ") + key + "=" +
                 (value.is_string() ? value.get<std::string>() : value.dump());
    }
    if (changed.empty()) return edit;
    edit.summary = "settings " + changed;
    edit.events.push_back({"note", "", "kf-member set " + changed});
    return edit;
  });
}

void check_bounds(const Cluster& cluster) {
  const auto bound = [&](const char* key) -> std::optional<std::int64_t> {
    if (!cluster.settings.contains(key)) return std::nullopt;
    const auto& v = cluster.settings[key];
    if (!v.is_number_integer() || v.get<std::int64_t>() < 1) {
      throw std::invalid_argument(std::string("settings.") + key + " must be a positive integer");
    }
    return v.get<std::int64_t>();
  };
  const auto n = static_cast<std::int64_t>(cluster.workers.size());
  if (const auto max = bound("max_workers"); max && n > *max) {
    throw std::runtime_error(
        std::to_string(n) + " workers would exceed settings.max_workers = " + std::to_string(*max));
  }
  if (const auto min = bound("min_workers"); min && n < *min) {
    throw std::runtime_error(
        std::to_string(n) +
        " workers would be fewer than settings.min_workers = " + std::to_string(*min));
  }
}

static std::string unchecked_note(bool checked, const std::string& host) {
  if (checked) return "";
  return " (ports not checked: " + host +
         " is not this machine; its agent moves a worker whose port is in use there)";
}

Cluster mutate(CommandContext& ctx, const Mutator& edit_fn) {
  std::mt19937 rng(std::random_device{}());
  Cluster current = ctx.client.get_cluster();
  for (int attempt = 1;; ++attempt) {
    Cluster next = current;
    Edit edit = edit_fn(next);
    if (edit.summary.empty()) {
      ctx.out << "v" << current.version << ": no change" << std::endl;
      return current;
    }
    next.version = current.version;
    try {
      Cluster stored = ctx.client.put_cluster(next);
      ctx.out << "v" << current.version << " -> v" << stored.version << ": " << edit.summary
              << std::endl;
      post_events(ctx, edit.events, stored.version);
      return stored;
    } catch (const ConflictError& e) {
      if (attempt >= ctx.max_attempts) {
        throw Error(make_error_code(errc::conflict),
                    "gave up after " + std::to_string(attempt) +
                        " compare-and-swap conflicts (the cluster keeps changing): " + e.what());
      }
      ctx.out << "v" << current.version << ": conflict, v" << e.current().version
              << " is current; re-applying" << std::endl;
      current = e.current();
      // Back off a little so that racing writers do not collide again in lock step.
      std::uniform_int_distribution<int> jitter_ms(1, 10 * std::min(attempt, 10));
      std::this_thread::sleep_for(std::chrono::milliseconds(jitter_ms(rng)));
    }
  }
}

int find_worker(const Cluster& cluster, std::string_view spec) {
  int rank = -1;
  const auto [ptr, ec] = std::from_chars(spec.data(), spec.data() + spec.size(), rank);
  if (!spec.empty() && ec == std::errc{} && ptr == spec.data() + spec.size()) {
    if (rank < 0 || rank >= cluster.size()) {
      throw UnknownWorker("unknown worker: rank " + std::string(spec) + " (the cluster has " +
                          std::to_string(cluster.size()) + " workers, version " +
                          std::to_string(cluster.version) + ")");
    }
    return rank;
  }
  std::optional<int> found;
  try {
    found = cluster.rank_of(Endpoint::parse(spec));
  } catch (const std::invalid_argument&) {
    throw UnknownWorker("unknown worker '" + std::string(spec) + "': give a rank or host:port");
  }
  if (!found) {
    throw UnknownWorker("unknown worker: " + std::string(spec) +
                        " is not in the cluster (version " + std::to_string(cluster.version) + ")");
  }
  return *found;
}

std::string format_cluster(const Cluster& cluster) {
  std::ostringstream s;
  s << "version " << cluster.version << ": " << cluster.size() << " workers\n";
  for (int rank = 0; rank < cluster.size(); ++rank) {
    const auto& w = cluster.workers[static_cast<std::size_t>(rank)];
    s << rank << " " << w.endpoint.str() << " slot " << w.slot << "\n";
  }
  for (const auto& w : cluster.spares) {
    s << "spare " << w.endpoint.str() << " slot " << w.slot << "\n";
  }
  return s.str();
}

std::vector<WorkerSpec> add_workers(Cluster& cluster, const AddOptions& options,
                                    bool* ports_checked) {
  std::vector<std::uint16_t> used;
  int next_slot = 0;
  for (const auto& w : cluster.workers) {
    if (w.endpoint.host != options.host) continue;
    used.push_back(w.endpoint.port);
    next_slot = std::max(next_slot, w.slot + 1);
  }
  const tools::PortPick pick =
      tools::pick_ports_for(options.host, options.ports, options.count_workers, used);
  if (ports_checked != nullptr) *ports_checked = pick.checked;
  std::vector<WorkerSpec> added;
  for (const auto port : pick.ports) {
    added.push_back(WorkerSpec{Endpoint{options.host, port}, next_slot++});
  }
  cluster.workers.insert(cluster.workers.end(), added.begin(), added.end());
  return added;
}

void list(CommandContext& ctx) {
  const Cluster cluster = ctx.client.get_cluster();
  ctx.out << format_cluster(cluster);
  // The agents' leases and the slots they offer (docs/autoscale.md).
  const auto agents = ctx.client.live_agents();
  ctx.out << "agents alive:";
  for (const auto& a : agents) ctx.out << " " << a.host;
  if (agents.empty()) ctx.out << " none";
  ctx.out << "\n";
  if (!agents.empty()) {
    int offered = 0;
    std::string each;
    for (const auto& a : agents) {
      offered += a.slots;
      const auto on_host = [&](const WorkerSpec& w) { return w.endpoint.host == a.host; };
      const auto used = std::count_if(cluster.workers.begin(), cluster.workers.end(), on_host) +
                        std::count_if(cluster.spares.begin(), cluster.spares.end(), on_host);
      each += (each.empty() ? "" : ", ") + a.host + " " + std::to_string(used) + "/" +
              std::to_string(a.slots);
    }
    ctx.out << "slots in use: " << each << " (" << offered << " offered)\n";
  }
  ctx.out << std::flush;
}

void add(CommandContext& ctx, const AddOptions& options) {
  mutate(ctx, [&](Cluster& c) {
    bool checked = true;
    const auto added = add_workers(c, options, &checked);
    check_bounds(c);
    Edit edit{"added " + join_workers(added) + unchecked_note(checked, options.host), {}};
    for (const auto& w : added) edit.events.push_back({"added", w.endpoint.str(), "kf-member add"});
    return edit;
  });
  // After the change, not before: the look at the agents' leases is one more request to etcd,
  // and the change does not wait for an agent anyway.
  if (const auto agents = ctx.client.live_agents();
      std::none_of(agents.begin(), agents.end(),
                   [&](const AgentOffer& a) { return a.host == options.host; })) {
    ctx.out << "note: no agent is alive on " << options.host
            << "; its workers start once one watches there" << std::endl;
  }
}

void revoke(CommandContext& ctx, const std::string& worker, std::optional<int> notice_seconds) {
  const std::string detail =
      notice_seconds ? "kf-member revoke, notice " + std::to_string(*notice_seconds) + "s"
                     : "kf-member revoke, no notice";
  mutate(ctx, [&](Cluster& c) {
    const std::string endpoint = remove_worker(c, worker);
    check_bounds(c);
    return Edit{"revoked " + endpoint + " (" + detail + ")", {{"revoked", endpoint, detail}}};
  });
}

void notice(CommandContext& ctx, const std::string& target, int in_seconds) {
  const std::string detail = "kf-member notice, notice " + std::to_string(in_seconds) + "s";
  // The host's own spelling in a document: "[::1]" for IPv6 is given as "::1" or "[::1]".
  std::string host = target;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  mutate(ctx, [&](Cluster& c) {
    const auto on_host = [&](const WorkerSpec& w) { return w.endpoint.host == host; };
    // Hot spares elsewhere take the places of the workers that leave (docs/elastic.md).
    const auto promote = [&](std::size_t count, Edit& edit, const std::string& instead,
                             const std::vector<std::string>& avoid) {
      for (const auto& w : promote_spares(c, count, avoid)) {
        edit.summary += "; moved in the spare " + w.endpoint.str();
        edit.events.push_back({"promoted", w.endpoint.str(),
                               "a hot spare, in place of " + instead + " (" + detail + ")"});
      }
    };
    const auto spares_elsewhere = static_cast<std::size_t>(std::count_if(
        c.spares.begin(), c.spares.end(), [&](const WorkerSpec& w) { return !on_host(w); }));
    if (std::none_of(c.workers.begin(), c.workers.end(), on_host)) {
      // Not a host of the job: a worker (rank or host:port), revoked with this notice.
      int rank = -1;
      try {
        rank = find_worker(c, target);
      } catch (const UnknownWorker&) {
        throw UnknownWorker("notice: '" + target + "' is neither a host with workers of the job " +
                            "nor a worker of it (version " + std::to_string(c.version) +
                            "; give a host, a rank or host:port)");
      }
      const std::string endpoint = c.workers[static_cast<std::size_t>(rank)].endpoint.str();
      if (c.workers.size() == 1 && c.spares.empty()) {
        throw std::runtime_error("notice: " + endpoint +
                                 " is the job's last worker: the job cannot go on without it");
      }
      c.workers.erase(c.workers.begin() + rank);
      Edit edit{"revoked " + endpoint + " (" + detail + ")", {{"revoked", endpoint, detail}}};
      promote(1, edit, endpoint, {});  // one worker: its host stays, so any spare will do
      return edit;
    }
    std::vector<WorkerSpec> leaving;
    std::copy_if(c.workers.begin(), c.workers.end(), std::back_inserter(leaving), on_host);
    if (leaving.size() == c.workers.size() && spares_elsewhere == 0) {
      throw std::runtime_error("notice: every worker of the job is on " + host +
                               ": the job cannot go on without it (version " +
                               std::to_string(c.version) + ")");
    }
    std::erase_if(c.workers, on_host);
    std::vector<WorkerSpec> spares_leaving;
    std::copy_if(c.spares.begin(), c.spares.end(), std::back_inserter(spares_leaving), on_host);
    // The host's event first: its agent reads it with the workers' and drains.
    Edit edit{"revoked " + join_workers(leaving) + " on " + host + " (" + detail + ")",
              {{"notice", "", tools::host_detail(host, detail)}}};
    for (const auto& w : leaving) edit.events.push_back({"revoked", w.endpoint.str(), detail});
    promote(leaving.size(), edit, join_workers(leaving), {host});
    std::erase_if(c.spares, on_host);
    for (const auto& w : spares_leaving) {
      edit.events.push_back(
          {"released", w.endpoint.str(), "a hot spare on " + host + " (" + detail + ")"});
    }
    return edit;
  });
}

void kill(CommandContext& ctx, const std::string& worker) {
  mutate(ctx, [&](Cluster& c) {
    const std::string endpoint = remove_worker(c, worker);
    Edit edit{"killed " + endpoint, {{"killed", endpoint, "kf-member kill"}}};
    // A loss like any other: a hot spare takes its place.
    for (const auto& w : promote_spares(c, 1)) {
      edit.summary += "; moved in the spare " + w.endpoint.str();
      edit.events.push_back({"promoted", w.endpoint.str(),
                             "a hot spare, in place of " + endpoint + " (kf-member kill)"});
    }
    return edit;
  });
}

void resize(CommandContext& ctx, int count_workers, const AddOptions& options) {
  mutate(ctx, [&](Cluster& c) {
    const int before = c.size();
    Edit edit;
    if (count_workers > before) {
      AddOptions more = options;
      more.count_workers = count_workers - before;
      bool checked = true;
      const auto added = add_workers(c, more, &checked);
      edit.summary = "added " + join_workers(added) + unchecked_note(checked, options.host);
      for (const auto& w : added) {
        edit.events.push_back({"added", w.endpoint.str(), "kf-member resize"});
      }
    } else if (count_workers < before) {
      const std::vector<WorkerSpec> removed(c.workers.begin() + count_workers, c.workers.end());
      c.workers.resize(static_cast<std::size_t>(count_workers));
      edit.summary = "removed " + join_workers(removed);
      for (const auto& w : removed) {
        edit.events.push_back({"removed", w.endpoint.str(), "kf-member resize"});
      }
    } else {
      return edit;
    }
    check_bounds(c);
    const std::string sizes = std::to_string(before) + " -> " + std::to_string(count_workers);
    edit.summary = "resized " + sizes + " workers, " + edit.summary;
    edit.events.push_back({"resized", "", sizes + " workers"});
    return edit;
  });
}

void watch(CommandContext& ctx, int count_changes) {
  using namespace std::chrono_literals;
  Cluster current = ctx.client.get_cluster();
  ctx.out << "v" << current.version << " (current): " << current.size()
          << " workers: " << join_workers(current.workers) << std::endl;
  for (int seen = 0; count_changes == 0 || seen < count_changes;) {
    Cluster next = ctx.client.watch(current.version, 60s);
    if (next.version == current.version) continue;  // the long-poll timed out
    ctx.out << "v" << next.version << ": " << next.size()
            << " workers: " << join_workers(next.workers) << std::endl;
    current = std::move(next);
    ++seen;
  }
}

namespace {

// "2026-11-29T23:31:59.123Z" (the service's stamps) as microseconds since the epoch, or nullopt.
std::optional<std::int64_t> rfc3339_us(const std::string& text) {
  int y = 0, mo = 0, d = 0, h = 0, mi = 0, sec = 0, ms = 0;
  char z = 0;
  if (std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d.%3d%c", &y, &mo, &d, &h, &mi, &sec, &ms,
                  &z) != 8 ||
      z != 'Z') {
    return std::nullopt;
  }
  const auto day = std::chrono::year_month_day{std::chrono::year{y},
                                               std::chrono::month{static_cast<unsigned>(mo)},
                                               std::chrono::day{static_cast<unsigned>(d)}};
  if (!day.ok()) return std::nullopt;
  const auto t = std::chrono::sys_days{day} + std::chrono::hours{h} + std::chrono::minutes{mi} +
                 std::chrono::seconds{sec} + std::chrono::milliseconds{ms};
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

constexpr int kPid = 1;
constexpr int kMembership = 1, kChanges = 2, kSteps = 3;

nlohmann::json track_name(int tid, const char* name) {
  return {{"name", "thread_name"},
          {"ph", "M"},
          {"pid", kPid},
          {"tid", tid},
          {"args", {{"name", name}}}};
}

}  // namespace

nlohmann::json make_trace(const std::vector<ConfigEvent>& events, const nlohmann::json& summaries) {
  nlohmann::json out = nlohmann::json::array();
  out.push_back(
      {{"name", "process_name"}, {"ph", "M"}, {"pid", kPid}, {"args", {{"name", "kf job"}}}});
  out.push_back(track_name(kMembership, "membership"));
  out.push_back(track_name(kChanges, "changes"));
  out.push_back(track_name(kSteps, "steps"));
  // The time of the event that told of each version's change (rank 0's "resized", or a
  // joiner's "joined"): where that change's phases end.
  std::map<std::uint64_t, std::int64_t> change_at;
  for (const ConfigEvent& e : events) {
    const auto ts = rfc3339_us(e.time);
    if (!ts) continue;
    nlohmann::json args = {{"seq", e.seq}};
    if (!e.worker.empty()) args["worker"] = e.worker;
    if (!e.detail.empty()) args["detail"] = e.detail;
    if (e.version) args["version"] = *e.version;
    out.push_back({{"name", e.type},
                   {"cat", "membership"},
                   {"ph", "i"},
                   {"s", "p"},
                   {"ts", *ts},
                   {"pid", kPid},
                   {"tid", kMembership},
                   {"args", std::move(args)}});
    if (e.version && (e.type == "resized" || e.type == "joined") && !change_at.count(*e.version)) {
      change_at[*e.version] = *ts;
    }
  }
  std::set<std::uint64_t> changes_drawn;
  for (const auto& s : summaries) {
    if (!s.is_object()) continue;
    const auto ts = rfc3339_us(s.value("time", std::string()));
    if (!ts) continue;
    const double step_s = s.contains("step_time_seconds") && s["step_time_seconds"].is_number()
                              ? s["step_time_seconds"].get<double>()
                              : 0.0;
    if (step_s > 0 && s.contains("step") && s["step"].is_number_integer()) {
      const auto dur = static_cast<std::int64_t>(step_s * 1e6);
      nlohmann::json args = {{"workers", s.value("workers", 0)},
                             {"version", s.value("version", 0)}};
      if (s.contains("samples_per_second") && s["samples_per_second"].is_number()) {
        args["samples_per_second"] = s["samples_per_second"];
      }
      out.push_back({{"name", "step " + std::to_string(s["step"].get<std::int64_t>())},
                     {"cat", "step"},
                     {"ph", "X"},
                     {"ts", *ts - dur},
                     {"dur", dur},
                     {"pid", kPid},
                     {"tid", kSteps},
                     {"args", std::move(args)}});
    }
    const auto& c = s.contains("last_change") ? s["last_change"] : nlohmann::json();
    if (!c.is_object() || !c.contains("version") || !c["version"].is_number_unsigned()) continue;
    const auto version = c["version"].get<std::uint64_t>();
    const auto at = change_at.find(version);
    if (at == change_at.end() || !changes_drawn.insert(version).second) continue;
    static constexpr const char* kPhases[] = {"detect", "agree", "connect", "sync", "resume"};
    std::vector<std::int64_t> dur;
    std::int64_t total = 0;
    for (const char* p : kPhases) {
      const std::string key = std::string(p) + "_ms";
      const double ms = c.contains(key) && c[key].is_number() ? c[key].get<double>() : 0.0;
      dur.push_back(static_cast<std::int64_t>(std::max(0.0, ms) * 1000));
      total += dur.back();
    }
    std::int64_t start = at->second - total;
    for (std::size_t i = 0; i < dur.size(); ++i) {
      out.push_back({{"name", kPhases[i]},
                     {"cat", "change"},
                     {"ph", "X"},
                     {"ts", start},
                     {"dur", dur[i]},
                     {"pid", kPid},
                     {"tid", kChanges},
                     {"args", {{"version", version}, {"kind", c.value("kind", "")}}}});
      start += dur[i];
    }
  }
  return {{"traceEvents", std::move(out)}, {"displayTimeUnit", "ms"}};
}

void trace(CommandContext& ctx) {
  const auto events = ctx.client.get_events();
  const auto summaries = nlohmann::json::parse(ctx.client.get_summaries());
  ctx.out << make_trace(events, summaries).dump() << "\n";
}

}  // namespace kf::member
