// SPDX-License-Identifier: Apache-2.0
// kf-config-server: holds a kf job's cluster document (membership and settings, versioned,
// changed by compare-and-swap) and its audit trail of events, served over HTTP/1.1.
//   kf-config-server --token-file F --state FILE [--listen HOST:PORT] [--watch-timeout-ms MS]
// Prints "listening on HOST:PORT" on stdout once it accepts connections; stops on SIGINT/SIGTERM.
// Exit codes: 0 after a signal; 2 for a usage error; 1 for other errors (unreadable token file,
// unreadable or corrupt state file, address in use). API: docs/config-server.md.
#include <CLI/CLI.hpp>
#include <chrono>
#include <exception>
#include <iostream>
#include <stdexcept>
#include <string>

#include "kf-config-server/lib/http_server.hpp"
#include "kf-config-server/lib/listen_address.hpp"
#include "kf-config-server/lib/service.hpp"
#include "kf/common/env.hpp"

namespace {

constexpr int kUsageError = 2;
constexpr int kRuntimeError = 1;
constexpr int kMaxWatchTimeoutMs = 3'600'000;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Serves a kf job's cluster document and event log over HTTP: workers and agents watch it, "
      "kf-member and policies change it by compare-and-swap.",
      "kf-config-server"};
  app.footer(
      "Mutations must be signed with a key derived from the token in --token-file "
      "(\"Authorization: KF-HMAC-SHA256 ...\", as kf's clients do; docs/config-server.md).\n"
      "Exit code: 0 after SIGINT/SIGTERM, 2 for a usage error, 1 for other errors.");
  std::string listen = "127.0.0.1:0";
  std::string token_file;
  std::string state_file;
  int watch_timeout_ms = 25'000;
  bool allow_bearer = false;
  app.add_option("--listen", listen, "HOST:PORT to listen on (port 0: any free port)")
      ->capture_default_str();
  app.add_option("--token-file", token_file, "file holding the job token (first line)")->required();
  app.add_option("--state", state_file,
                 "state file: a snapshot, loaded on start with its log FILE.log, to which each "
                 "change is appended")
      ->required();
  app.add_flag("--allow-bearer", allow_bearer,
               "also accept \"Authorization: Bearer TOKEN\" (sends the token itself: for curl by "
               "hand on a trusted network)");
  std::string chart_js = kf::config_server::ServiceOptions{}.chart_js.string();
  app.add_option("--chart-js", chart_js,
                 "Chart.js 3 (a UMD build) for the dashboard's charts at /; without the file the "
                 "dashboard shows its tables only")
      ->capture_default_str();
  app.add_option("--watch-timeout-ms", watch_timeout_ms,
                 "longest wait of a long-poll (GET /v1/cluster?watch=1) in milliseconds")
      ->check(CLI::Range(1, kMaxWatchTimeoutMs))
      ->capture_default_str();
  kf::config_server::ServerOptions server_options;
  app.add_option("--max-connections", server_options.max_connections,
                 "open connections at most; past it a connection gets 503")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-connections-per-source", server_options.max_connections_per_source,
                 "open connections from one address at most")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-watches", server_options.max_watches,
                 "long-polls waiting at once at most; past it a long-poll gets 503")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-watches-per-source", server_options.max_watches_per_source,
                 "long-polls waiting at once from one address at most")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kUsageError;
  }

  try {
    server_options.listen = kf::config_server::ListenAddress::parse(listen);
  } catch (const std::invalid_argument& e) {
    std::cerr << "kf-config-server: " << e.what() << "\n";
    return kUsageError;
  }
  server_options.watch_timeout = std::chrono::milliseconds(watch_timeout_ms);
  server_options.on_listening = [](const std::string& address) {
    std::cout << "listening on " << address << std::endl;  // flushed: tests read the port
  };

  try {
    kf::config_server::ServiceOptions service_options;
    service_options.state_file = state_file;
    service_options.token = kf::read_token_file(token_file);
    service_options.allow_bearer = allow_bearer;
    service_options.chart_js = chart_js;
    service_options.max_body_bytes = server_options.max_body_bytes;
    kf::config_server::Service service(std::move(service_options));
    kf::config_server::run_server(service, server_options);
    return 0;
  } catch (const std::invalid_argument& e) {
    std::cerr << "kf-config-server: " << e.what() << "\n";
    return kUsageError;
  } catch (const std::exception& e) {
    std::cerr << "kf-config-server: " << e.what() << "\n";
    return kRuntimeError;
  }
}
