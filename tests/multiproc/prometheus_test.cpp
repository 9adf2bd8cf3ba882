// SPDX-License-Identifier: Apache-2.0
// A real Prometheus (Debian's prometheus package) scrapes a live elastic job on loopback: the
// agent lists its workers' endpoints in a file (kfrun --metrics-sd-file), Prometheus discovers
// them there, kf_steps_total rises, kf_cluster_size follows a `kf-member resize`, promtool
// passes every worker's page and the config service's, the service counts the joins and the
// learning rate's scale, the shipped scrape configuration is valid, and every query of the
// shipped Grafana dashboard is valid PromQL over series kf exports. Skips, saying why, without
// the prometheus binaries.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <string>

#include "support/elastic_job.hpp"

namespace kf::test {
namespace {

const std::string kArgs = "--samples 20000 --dim 32 --batch 64 --epochs 100000 --sample-us 20";

// Whether a TCP listener can take 127.0.0.1:port now.
bool port_free(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

// The first of `count` consecutive ports from `from` that are free now.
int free_ports(int from, int count) {
  for (int base = from; base + count < 65535; base += count) {
    bool all = true;
    for (int p = base; p < base + count && all; ++p) all = port_free(p);
    if (all) return base;
  }
  return 0;
}

// The root of the repository (tests/multiproc/prometheus_test.cpp is three levels below).
std::filesystem::path source_root() {
  return std::filesystem::path(__FILE__).parent_path().parent_path().parent_path();
}

class PrometheusServer {
 public:
  PrometheusServer(const std::filesystem::path& dir, int port) : port_(port) {
    child_ = spawn({"/bin/sh", "-c",
                    "exec prometheus --config.file=" + (dir / "prometheus.yml").string() +
                        " --storage.tsdb.path=" + (dir / "tsdb").string() +
                        " --web.listen-address=127.0.0.1:" + std::to_string(port) + " > " +
                        (dir / "prometheus.log").string() + " 2>&1"},
                   {});
  }
  ~PrometheusServer() {
    ::kill(child_.pid, SIGKILL);
    ::waitpid(child_.pid, nullptr, 0);
    if (child_.out_fd >= 0) ::close(child_.out_fd);
  }
  // The API's answer to an instant query, parsed; nullopt when it did not answer.
  std::optional<nlohmann::json> query(const std::string& promql) const {
    const Ran r = run_shell("curl -s -G --max-time 5 http://127.0.0.1:" + std::to_string(port_) +
                            "/api/v1/query --data-urlencode 'query=" + promql + "'");
    if (r.exit_code != 0) return std::nullopt;
    auto j = nlohmann::json::parse(r.output, nullptr, false);
    if (j.is_discarded()) return std::nullopt;
    return j;
  }
  // The single value of a query that returns one series, or nullopt.
  std::optional<double> value(const std::string& promql) const {
    const auto j = query(promql);
    if (!j || j->value("status", "") != "success") return std::nullopt;
    const auto& result = (*j)["data"]["result"];
    if (!result.is_array() || result.size() != 1) return std::nullopt;
    return std::stod(result[0]["value"][1].get<std::string>());
  }

 private:
  int port_;
  Child child_;
};

TEST(Prometheus, ScrapesALiveJobFoundThroughTheAgentsFileAndSeesItGrow) {
  if (run_shell("command -v prometheus && command -v promtool").exit_code != 0) {
    GTEST_SKIP() << "prometheus and promtool are not installed (apt install prometheus)";
  }
  ElasticJob job("prometheus");
  const int metrics = free_ports(19100, 8);
  const int web = free_ports(metrics + 8, 1);
  ASSERT_GT(metrics, 0);
  ASSERT_GT(web, 0);
  const auto targets = job.dir() / "targets.json";
  const std::string service = job.url().substr(std::string("http://").size());
  std::ofstream(job.dir() / "prometheus.yml")
      << "global:\n  scrape_interval: 1s\n"
         "scrape_configs:\n  - job_name: kf\n    file_sd_configs:\n      - files: ['"
      << targets.string()
      << "']\n        refresh_interval: 1s\n"
         "  - job_name: kf-config\n    static_configs:\n      - targets: ['"
      << service << "']\n";
  job.set_agent_options("--metrics-port " + std::to_string(metrics) + " --metrics-sd-file " +
                        targets.string());
  job.start(2, kArgs);
  ASSERT_TRUE(job.wait_progress(20)) << job.err();
  ASSERT_TRUE(eventually([&] { return std::filesystem::exists(targets); }, 10s)) << job.err();
  PrometheusServer prometheus(job.dir(), web);

  // Steps rise; the two workers are found through the file, with the agent's labels.
  std::optional<double> first;
  ASSERT_TRUE(eventually(
      [&] { return (first = prometheus.value("sum(kf_steps_total)")).has_value(); }, 30s))
      << "Prometheus never had kf_steps_total:\n"
      << slurp(job.dir() / "prometheus.log");
  ASSERT_TRUE(eventually(
      [&] {
        const auto now = prometheus.value("sum(kf_steps_total)");
        return now && *now > *first;
      },
      30s));
  EXPECT_TRUE(eventually(
      [&] {
        return prometheus.value("count(kf_steps_total{kf_job!=\"\",kf_worker!=\"\"})") == 2.0;
      },
      30s));
  EXPECT_TRUE(eventually([&] { return prometheus.value("max(kf_cluster_size)") == 2.0; }, 30s));

  // The settings the gauges of the batch and the learning rate show (the values the workers
  // use already), then a third worker: the agent's file names it, Prometheus scrapes it, and
  // the size follows.
  const auto set = job.member("set batch_size=64 lr=0.05");
  ASSERT_EQ(set.exit_code, 0) << set.output;
  EXPECT_TRUE(
      eventually([&] { return prometheus.value("max(kf_global_batch_size)") == 64.0; }, 30s));
  const auto r = job.member("resize 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(job.wait_size(3)) << job.err();
  EXPECT_TRUE(eventually([&] { return prometheus.value("min(kf_cluster_size)") == 3.0; }, 30s))
      << slurp(targets);
  EXPECT_TRUE(
      eventually([&] { return prometheus.value("count(up{job=\"kf\"} == 1)") == 3.0; }, 30s));

  // The config service's own series: three joins (the first two workers and the third), the
  // size; the learning rate against the first one the settings had (0.05 above).
  EXPECT_TRUE(eventually(
      [&] {
        return prometheus.value("kf_config_membership_events_total{kind=\"join\"}") == 3.0 &&
               prometheus.value("kf_config_workers") == 3.0;
      },
      30s))
      << slurp(job.dir() / "prometheus.log");
  const auto faster = job.member("set lr=0.2");
  ASSERT_EQ(faster.exit_code, 0) << faster.output;
  EXPECT_TRUE(
      eventually([&] { return prometheus.value("kf_config_learning_rate_scale") == 4.0; }, 30s));
  EXPECT_EQ(prometheus.value("kf_config_membership_events_total{kind=\"fail\"}"), 0.0);

  // Every worker's page and the service's pass promtool; what they export, for the
  // dashboard's queries.
  std::set<std::string> exported;
  for (int slot = 0; slot < 4; ++slot) {
    const std::string url =
        slot < 3 ? "http://127.0.0.1:" + std::to_string(metrics + slot) : job.url();
    const Ran page = run_shell(
        "curl -s --max-time 5 " + url + "/metrics > " + (job.dir() / "page.prom").string() +
        " && promtool check metrics < " + (job.dir() / "page.prom").string());
    EXPECT_EQ(page.exit_code, 0) << url << ": " << page.output;
    std::ifstream in(job.dir() / "page.prom");
    for (std::string line; std::getline(in, line);) {
      std::smatch m;
      if (std::regex_search(line, m, std::regex("^# TYPE (kf_[a-z_]+) "))) exported.insert(m[1]);
    }
  }
  EXPECT_TRUE(exported.count("kf_steps_total")) << "nothing scraped";

  // The shipped configuration and dashboard.
  const Ran config = run_shell("promtool check config " +
                               (source_root() / "deploy/prometheus/prometheus.yml").string());
  EXPECT_EQ(config.exit_code, 0) << config.output;
  std::ifstream dashboard_file(source_root() / "deploy/grafana/kf-dashboard.json");
  const auto dashboard = nlohmann::json::parse(dashboard_file, nullptr, false);
  ASSERT_FALSE(dashboard.is_discarded()) << "deploy/grafana/kf-dashboard.json is not JSON";
  std::vector<std::string> queries;
  for (const auto& panel : dashboard.at("panels")) {
    for (const auto& target : panel.at("targets")) queries.push_back(target.at("expr"));
  }
  for (const auto& a : dashboard.at("annotations").at("list")) queries.push_back(a.at("expr"));
  ASSERT_GE(queries.size(), 10u);
  const std::regex series_name("kf_[a-z_]+");
  for (const std::string& q : queries) {
    const auto answer = prometheus.query(q);
    ASSERT_TRUE(answer.has_value()) << q;
    EXPECT_EQ(answer->value("status", ""), "success") << q << ": " << answer->dump();
    for (std::sregex_iterator it(q.begin(), q.end(), series_name), end; it != end; ++it) {
      std::string name = it->str();
      for (const char* suffix : {"_bucket", "_sum", "_count"}) {
        if (name.ends_with(suffix) && !exported.count(name)) {
          name.resize(name.size() - std::string(suffix).size());
        }
      }
      // kf_job and kf_worker are the agent's labels; straggler and GNS series appear only once
      // measured (this program reports neither), policy decisions once a policy decided.
      if (name == "kf_job" || name == "kf_worker") continue;
      const bool later = name.starts_with("kf_straggler_") || name.starts_with("kf_gns_") ||
                         name == "kf_policy_decisions_total";
      if (!later) {
        EXPECT_TRUE(exported.count(name)) << q << ": no series " << name;
      }
    }
  }
  job.finish_soon();
  job.expect_clean_finish(job.wait(), 3);
}

}  // namespace
}  // namespace kf::test
