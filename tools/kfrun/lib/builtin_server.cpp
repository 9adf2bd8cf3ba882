// SPDX-License-Identifier: Apache-2.0
#include "kfrun/lib/builtin_server.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <stdexcept>
#include <system_error>

#include "kf-config-server/lib/http_server.hpp"
#include "kf-config-server/lib/service.hpp"
#include "kf/common/env.hpp"
#include "kf/common/log.hpp"
#include "kfrun/lib/output.hpp"
#include "kfrun/lib/signal_pipe.hpp"
#include "kfrun/lib/unique_fd.hpp"
#include "kfrun/lib/worker_env.hpp"

namespace kf::tools {

namespace fs = std::filesystem;

BuiltinServer::BuiltinServer(const BuiltinServerOptions& options) {
  try {
    if (options.token_file) {
      try {
        token_ = read_token_file(options.token_file->string());
      } catch (const std::runtime_error& e) {
        throw std::invalid_argument(std::string("--job-token-file: ") + e.what());
      }
      token_file_ = fs::absolute(*options.token_file);
    }
    if (!options.token_file || !options.state_file) temp_dir_.emplace();
    if (!options.token_file) {
      token_ = random_hex(kTokenBytes);
      token_file_ = temp_dir_->path() / "job.token";
      write_token_file(token_file_, token_);
    }
    config_server::ServiceOptions service_options;
    service_options.state_file = options.state_file.value_or(temp_dir_->path() / "state.json");
    service_options.token = token_;
    // The agent tells every change and event in its own words; the service's info lines would
    // only repeat them. KF_LOG_LEVEL still decides when it is set.
    if (!env::get(env::kLogLevel)) logger().set_level(spdlog::level::warn);
    service_ = std::make_unique<config_server::Service>(std::move(service_options));
    // 127.0.0.1, port 0; HttpServer::run() leaves the signals to kfrun.
    server_ =
        std::make_unique<config_server::HttpServer>(*service_, config_server::ServerOptions{});
    url_ = "http://" + server_->address();
    thread_ = std::thread([server = server_.get()] {
      block_pipe_signals();
      try {
        server->run();
      } catch (const std::exception& e) {
        KF_LOG(err, "kfrun", "builtin config server failed: {}", e.what());
      }
    });
  } catch (...) {
    temp_dir_.reset();
    throw;
  }
}

BuiltinServer::~BuiltinServer() {
  stop();
  temp_dir_.reset();
}

void BuiltinServer::stop() noexcept {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
  server_.reset();  // closes the connections the server still held
}

}  // namespace kf::tools
