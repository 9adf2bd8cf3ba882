// SPDX-License-Identifier: Apache-2.0
// kfrun's builtin config service (`kfrun --watch --config-server builtin`): kf-config-server's
// Service and HTTP server on a thread of kfrun, listening on 127.0.0.1 on a port the kernel picks,
// so that a one-host elastic job needs no second process. Its token and state file are the user's
// (--job-token-file, --state) or live in a fresh private temporary directory, removed when the
// server is destroyed. Unless KF_LOG_LEVEL is set, it lowers the process's kf log level to warn
// (the service logs each change and event at info; the agent reports them itself).
// Thread-safety: construct, stop and destroy on one thread; the server's own thread is the only
// one that touches the Service.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "kfrun/lib/private_dir.hpp"

namespace kf::config_server {
class Service;
class HttpServer;
}  // namespace kf::config_server

namespace kf::tools {

struct BuiltinServerOptions {
  std::optional<std::filesystem::path> state_file;  ///< else state.json in the temporary dir
  std::optional<std::filesystem::path> token_file;  ///< else a random token in a 0600 file there
};

class BuiltinServer {
 public:
  /// Reads or makes the token, loads the state file (absent: an empty cluster at version 0),
  /// listens and starts serving on a thread of its own (SIGINT, SIGTERM and SIGCHLD blocked).
  /// Throws: std::invalid_argument "--job-token-file: ..." for an unreadable or empty token file;
  /// std::runtime_error "state file F: ..." for an unreadable or corrupt state file;
  /// std::system_error when the temporary directory, a file or the socket cannot be made.
  explicit BuiltinServer(const BuiltinServerOptions& options);
  BuiltinServer(const BuiltinServer&) = delete;
  BuiltinServer& operator=(const BuiltinServer&) = delete;
  /// Stops the server and removes the temporary directory. noexcept.
  ~BuiltinServer();

  /// "http://127.0.0.1:PORT".
  const std::string& url() const noexcept { return url_; }
  /// The job token and the (absolute) file that holds it.
  const std::string& token() const noexcept { return token_; }
  const std::filesystem::path& token_file() const noexcept { return token_file_; }

  /// Stops serving and closes every connection (clients see the service go away). noexcept.
  void stop() noexcept;

 private:
  std::optional<PrivateDir> temp_dir_;  // when one was needed
  std::filesystem::path token_file_;
  std::string token_;
  std::string url_;
  std::unique_ptr<config_server::Service> service_;
  std::unique_ptr<config_server::HttpServer> server_;
  std::thread thread_;
};

}  // namespace kf::tools
