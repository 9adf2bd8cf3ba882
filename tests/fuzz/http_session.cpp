// SPDX-License-Identifier: Apache-2.0
// The config service's HTTP session (kf-config-server/lib/http_server.hpp, serve_bytes): the
// input is what a client sends on one connection before it closes its side. The harness reads
// the input as the session's own parser would, with the same limits, to know which answers are
// due: one per complete request while the connection is kept alive, then one 400 for a malformed
// request, a 413 for a body over the limit or a 401 for a mutation without credentials, after
// which the connection closes; nothing for a request cut short. Then:
//   - what the server wrote is a sequence of whole HTTP/1.1 responses and nothing else (a
//     "100 Continue" before the answer to a request that asked for one);
//   - exactly the answers due, each with a documented status, in order;
//   - every JSON answer's body is JSON.
#include <filesystem>
#include <set>
#include <stdexcept>

#include <boost/beast/http.hpp>

#include "check.hpp"
#include "kf-config-server/lib/http_server.hpp"
#include "kf-config-server/lib/service.hpp"
#include "kf-config-server/lib/state.hpp"
#include "kf/common/json.hpp"

namespace fs = std::filesystem;
namespace beast = boost::beast;
namespace http = beast::http;
using namespace kf::config_server;

namespace {

constexpr std::size_t kHeaderLimit = 1024;
constexpr std::size_t kBodyLimit = 2048;

struct Due {
  int status = 0;        // 0: any documented answer to a complete request; -1: none
  bool go_on = false;    // a "100 Continue" comes first
  bool to_head = false;  // the answer to a HEAD request: no body
};

// Feeds `input` from `at` to `p` until `until` holds, an error, or the input ends (then the
// parser is told so). Returns the error; need_more never comes back.
template <typename Until>
beast::error_code feed(http::request_parser<http::string_body>& p, std::string_view input,
                       std::size_t& at, Until until) {
  beast::error_code ec;
  while (!until()) {
    std::size_t n = 0;
    if (at < input.size()) {
      n = p.put(boost::asio::buffer(input.data() + at, input.size() - at), ec);
      at += n;
      if (ec && ec != http::error::need_more) return ec;
      ec = {};
    }
    if (n == 0) {  // the input ends before the parser has what it needs
      p.put_eof(ec);
      return ec ? ec : beast::error_code(http::error::partial_message);
    }
  }
  return ec;
}

// The answers the session owes a client that sent `input`, found by reading it as the session
// does (http_server.cpp, async_session): the head, the credentials of a mutation, a 100 when
// asked for (a read that announces a body is refused first), the body.
std::vector<Due> answers_due(const Service& service, std::string_view input) {
  std::vector<Due> due;
  std::size_t at = 0;
  while (at < input.size()) {
    http::request_parser<http::string_body> p;
    p.header_limit(static_cast<std::uint32_t>(kHeaderLimit));
    p.body_limit(kBodyLimit);
    beast::error_code ec = feed(p, input, at, [&] { return p.is_header_done(); });
    const auto stop_on = [&](bool go_on) {
      if (ec == http::error::body_limit) {
        due.push_back({413, go_on});
      } else if (ec == http::error::partial_message || ec == http::error::end_of_stream) {
        if (go_on) due.push_back({-1, true});
      } else {
        due.push_back({400, go_on});
      }
      return due;
    };
    if (ec) return stop_on(false);
    const auto& req = p.get();
    const bool head = req.method() == http::verb::head;
    if ((req.method() == http::verb::get || head) &&
        (p.chunked() || p.content_length().value_or(0) > 0)) {
      due.push_back({400, false, head});  // a read with a body: refused unread, then closed
      return due;
    }
    if (req.method() != http::verb::get && !head &&
        !service.unauthorized_before_body(std::string(req[http::field::authorization])).empty()) {
      due.push_back({401});
      return due;
    }
    const bool go_on = req[http::field::expect] == "100-continue";
    ec = feed(p, input, at, [&] { return p.is_done(); });
    if (ec) return stop_on(go_on);
    due.push_back({0, go_on, head});
    if (!p.get().keep_alive()) return due;
  }
  return due;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const fs::path file = kf::fuzz::scratch_dir() / "state.json";
  fs::remove(file);
  fs::remove(kf::config_server::log_file(file));  // each input starts from no state
  ServiceOptions service_options;
  service_options.state_file = file;
  service_options.token = "fuzz-token";
  service_options.max_body_bytes = kBodyLimit;
  Service service(service_options);
  ServerOptions options;
  options.watch_timeout = std::chrono::milliseconds(0);
  options.max_header_bytes = kHeaderLimit;
  options.max_body_bytes = kBodyLimit;
  const std::vector<Due> due = answers_due(service, input);
  const std::string output = serve_bytes(service, options, input);

  static const std::set<int> documented{200, 201, 400, 401, 404, 405, 409, 413};
  std::size_t at = 0;
  for (std::size_t i = 0; i < due.size(); ++i) {
    const std::string where =
        "answer " + std::to_string(i) + " of " + std::to_string(due.size()) + " in: " + output;
    const auto read_one = [&](http::response_parser<http::string_body>& p) {
      beast::error_code ec;
      while (!p.is_done()) {
        const std::size_t n =
            p.put(boost::asio::buffer(output.data() + at, output.size() - at), ec);
        at += n;
        KF_FUZZ_CHECK(!ec, "not a whole response (" + ec.message() + "): " + where);
        KF_FUZZ_CHECK(n > 0, "not a whole response: " + where);
      }
    };
    if (due[i].go_on) {
      http::response_parser<http::string_body> p;
      read_one(p);
      KF_FUZZ_CHECK(p.get().result_int() == 100, "expected 100 Continue: " + where);
    }
    if (due[i].status < 0) break;  // a 100 and nothing more
    http::response_parser<http::string_body> p;
    p.skip(due[i].to_head);
    read_one(p);
    const int status = static_cast<int>(p.get().result_int());
    KF_FUZZ_CHECK(documented.contains(status), "undocumented status: " + where);
    KF_FUZZ_CHECK(due[i].status == 0 || due[i].status == status,
                  "expected " + std::to_string(due[i].status) + ": " + where);
    if (!due[i].to_head && p.get()[http::field::content_type] == "application/json") {
      KF_FUZZ_CHECK(!kf::parse_json_or_discard(p.get().body()).is_discarded(),
                    "a body is not JSON: " + where);
    }
  }
  KF_FUZZ_CHECK(at == output.size(), "more than the answers due: " + output);
  return 0;
}
