// SPDX-License-Identifier: Apache-2.0
// Test helper: a one-member etcd on 127.0.0.1 (the `etcd` of Debian's etcd-server, found in PATH
// or in ETCD_EXE) with its data in a fresh directory, removed with it. error() says why there is
// none (not installed, did not answer).
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "kf/runtime/config_client.hpp"
#include "support/process.hpp"

namespace kf::test {

/// A TCP port of 127.0.0.1 that was free a moment ago.
inline std::uint16_t free_tcp_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(s);
  return ntohs(a.sin_port);
}

/// The etcd executable: ETCD_EXE, else `etcd` in PATH; empty when there is none.
inline std::string etcd_executable() {
  if (const char* e = std::getenv("ETCD_EXE"); e != nullptr && *e != '\0') return e;
  const Ran r = run_shell("command -v etcd");
  if (r.exit_code != 0) return "";
  std::string path = r.output;
  while (!path.empty() && (path.back() == '\n' || path.back() == '\r')) path.pop_back();
  return path;
}

/// An etcd that serves its clients over TLS (etcds://) and asks them for a certificate: the
/// PEM files of its certificate and key, and of the authority its clients' certificates are
/// signed by.
struct EtcdTls {
  std::string cert_file;
  std::string key_file;
  std::string client_ca_file;
  /// What the readiness probe connects with: the authority of cert_file, a client certificate.
  ConfigClientOptions probe;
};

class EtcdProcess {
 public:
  explicit EtcdProcess(const EtcdTls* tls = nullptr) {
    const std::string exe = etcd_executable();
    if (exe.empty()) {
      error_ = "no etcd here (install etcd-server, or set ETCD_EXE)";
      return;
    }
    dir_ = std::filesystem::temp_directory_path() /
           ("kf-etcd-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    const std::uint16_t client = free_tcp_port();
    const std::uint16_t peer = free_tcp_port();
    client_url_ = (tls ? "https://127.0.0.1:" : "http://127.0.0.1:") + std::to_string(client);
    const std::string peer_url = "http://127.0.0.1:" + std::to_string(peer);
    const std::string tls_flags =
        tls ? " --cert-file '" + tls->cert_file + "' --key-file '" + tls->key_file +
                  "' --client-cert-auth --trusted-ca-file '" + tls->client_ca_file + "'"
            : "";
    child_ = spawn({"/bin/sh", "-c",
                    "exec '" + exe + "' --name t --data-dir '" + (dir_ / "data").string() +
                        "' --listen-client-urls " + client_url_ + " --advertise-client-urls " +
                        client_url_ + " --listen-peer-urls " + peer_url +
                        " --initial-advertise-peer-urls " + peer_url + " --initial-cluster t=" +
                        peer_url + tls_flags + " > '" + (dir_ / "etcd.log").string() + "' 2>&1"},
                   {});
    url_ = (tls ? "etcds://127.0.0.1:" : "etcd://127.0.0.1:") + std::to_string(client);
    // Ready when it answers a read.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    ConfigClientOptions probe = tls ? tls->probe : ConfigClientOptions{};
    probe.deadline = std::chrono::milliseconds(1000);
    ConfigClient c(url_, "probe", probe);
    for (;;) {
      try {
        c.get_cluster();
        return;
      } catch (const std::exception& e) {
        if (std::chrono::steady_clock::now() > until) {
          error_ = std::string("etcd did not answer within 30 s: ") + e.what();
          return;
        }
      }
      if (auto st = wait_exit(
              child_, std::chrono::steady_clock::now() + std::chrono::milliseconds(50), false)) {
        error_ = "etcd exited at start";
        child_.pid = -1;
        return;
      }
    }
  }
  ~EtcdProcess() {
    stop();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;

  const std::string& error() const { return error_; }
  /// "etcd://127.0.0.1:PORT".
  const std::string& url() const { return url_; }
  /// Its client port, for URLs of several members.
  std::string member() const { return client_url_.substr(7); }
  void stop() {
    if (child_.pid > 0) {
      ::kill(child_.pid, SIGKILL);
      ::waitpid(child_.pid, nullptr, 0);
      child_.pid = -1;
    }
    if (child_.out_fd >= 0) ::close(child_.out_fd);
    child_.out_fd = -1;
  }

 private:
  static int& counter() {
    static int n = 0;
    return n;
  }
  std::string error_;
  std::filesystem::path dir_;
  std::string client_url_;
  std::string url_;
  Child child_;
};

}  // namespace kf::test
