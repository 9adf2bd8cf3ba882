// SPDX-License-Identifier: Apache-2.0
// An HTTP server on 127.0.0.1 that answers each connection's one request with the next of the
// answers it was given (whole responses, bytes as they are), then closes the connection; once
// they are used up it answers 503. For testing clients against answers a real service would not
// give (tests/runtime/config_client_test.cpp, the config_client fuzz harness). With sign_as() it
// signs its answers as kf-config-server does, so that kf's client takes them.
// Thread-safety: set_answers() from any thread; the server runs on a thread of its own until
// destruction.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <openssl/crypto.h>

#include "kf/common/keys.hpp"
#include "kf/runtime/request_signature.hpp"

namespace kf::test {

class CannedHttpServer {
 public:
  CannedHttpServer() {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (listener_ < 0 || ::bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(listener_, 64) != 0 ||
        ::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      throw std::runtime_error("CannedHttpServer: cannot listen on 127.0.0.1");
    }
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  CannedHttpServer(const CannedHttpServer&) = delete;
  CannedHttpServer& operator=(const CannedHttpServer&) = delete;
  ~CannedHttpServer() {
    ::shutdown(listener_, SHUT_RDWR);  // accept() returns: the thread ends
    thread_.join();
    ::close(listener_);
  }

  std::uint16_t port() const noexcept { return port_; }
  /// "SCHEME://127.0.0.1:PORT".
  std::string url(const std::string& scheme) const {
    return scheme + "://127.0.0.1:" + std::to_string(port_);
  }

  /// The answers to the next requests, in order (replacing those not used yet); forgets the
  /// requests answered so far.
  void set_answers(std::deque<std::string> answers) {
    std::lock_guard lock(mu_);
    answers_ = std::move(answers);
    requests_.clear();
  }

  /// From now on, signs each answer as kf's config service does for the job of `token` (an
  /// X-KF-Answer header bound to the request's nonce), so that kf's client takes it; "" stops
  /// signing. An answer without a status line and a head, or to a request without a nonce, is
  /// sent as it is.
  void sign_as(const std::string& token) {
    std::lock_guard lock(mu_);
    key_.reset();
    if (!token.empty()) key_ = derive_key(token, KeyUse::control);
  }

  /// The requests answered so far (head and body), oldest first.
  std::vector<std::string> requests() {
    std::lock_guard lock(mu_);
    return requests_;
  }

  /// A response with `status`, a JSON content type and `body`.
  static std::string answer(int status, const std::string& body) {
    return "HTTP/1.1 " + std::to_string(status) +
           " X\r\nContent-Length: " + std::to_string(body.size()) +
           "\r\nContent-Type: application/json\r\n\r\n" + body;
  }

 private:
  void serve() {
    for (;;) {
      const int s = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (s < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;  // shut down
      }
      timeval tv{2, 0};
      ::setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      ::setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
      std::string request;
      if (read_request(s, request)) {
        std::string answer;
        {
          std::lock_guard lock(mu_);
          requests_.push_back(std::move(request));
          if (answers_.empty()) {
            answer = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n";
          } else {
            answer = std::move(answers_.front());
            answers_.pop_front();
          }
          if (key_) {
            answer = signed_answer(*key_, requests_.back(), std::move(answer));
            // OpenSSL keeps state for each thread that used it until the thread ends; this one
            // runs until the server goes, and LeakSanitizer (the fuzz harnesses) does not see
            // where OpenSSL holds it.
            OPENSSL_thread_stop();
          }
        }
        for (std::size_t sent = 0; sent < answer.size();) {
          const ssize_t n = ::send(s, answer.data() + sent, answer.size() - sent, MSG_NOSIGNAL);
          if (n <= 0) break;
          sent += static_cast<std::size_t>(n);
        }
      }
      ::shutdown(s, SHUT_WR);
      ::close(s);
    }
  }

  // The value of header `name` (lower case) in the head of `request`, or "".
  static std::string header(const std::string& request, const std::string& name) {
    std::string lower = request.substr(0, request.find("\r\n\r\n")) + "\r\n";
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    const auto at = lower.find("\r\n" + name + ":");
    if (at == std::string::npos) return {};
    std::size_t from = at + 3 + name.size();
    while (from < lower.size() && lower[from] == ' ') ++from;
    return request.substr(from, lower.find("\r\n", from) - from);
  }

  // `answer` with the X-KF-Answer header kf-config-server would give it for `request`.
  static std::string signed_answer(const Key& key, const std::string& request, std::string answer) {
    const auto head_end = answer.find("\r\n\r\n");
    const auto sp1 = request.find(' ');
    const auto sp2 = sp1 == std::string::npos ? sp1 : request.find(' ', sp1 + 1);
    if (head_end == std::string::npos || !answer.starts_with("HTTP/1.1 ") ||
        sp2 == std::string::npos) {
      return answer;
    }
    std::string why;
    const auto sig = parse_request_signature(header(request, "authorization"), why);
    const std::string nonce = sig ? sig->nonce : header(request, "x-kf-nonce");
    if (!is_nonce(nonce)) return answer;
    const auto status = static_cast<unsigned>(std::strtoul(answer.c_str() + 9, nullptr, 10));
    const std::string mac =
        answer_mac(key, request.substr(0, sp1), request.substr(sp1 + 1, sp2 - sp1 - 1), nonce,
                   status, std::string_view(answer).substr(head_end + 4));
    answer.insert(head_end, "\r\n" + std::string(kAnswerHeader) + ": " + mac);
    return answer;
  }

  // Reads the head and the Content-Length bytes of body that follow it into `in`. False when
  // the client went away first.
  static bool read_request(int s, std::string& in) {
    char buf[4096];
    std::size_t need = std::string::npos;
    while (need == std::string::npos || in.size() < need) {
      const ssize_t n = ::recv(s, buf, sizeof buf, 0);
      if (n <= 0) return false;
      in.append(buf, static_cast<std::size_t>(n));
      if (need != std::string::npos) continue;
      const auto end = in.find("\r\n\r\n");
      if (end == std::string::npos) continue;
      std::string head = in.substr(0, end);
      std::transform(head.begin(), head.end(), head.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      std::size_t body = 0;
      if (const auto at = head.find("content-length:"); at != std::string::npos) {
        body = std::strtoull(head.c_str() + at + 15, nullptr, 10);
      }
      need = end + 4 + body;
    }
    return true;
  }

  int listener_ = -1;
  std::uint16_t port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::deque<std::string> answers_;
  std::vector<std::string> requests_;
  std::optional<Key> key_;
};

}  // namespace kf::test
