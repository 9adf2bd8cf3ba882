// SPDX-License-Identifier: Apache-2.0
// The config service's request handling (kf-config-server/lib/service.hpp), a sequence of
// requests per input, each signed properly, signed with the bearer token (refused: not
// allowed here), unsigned, or carrying input as its Authorization. After each:
//   - the status is one the API documents, and the body is JSON (but the dashboard's page and
//     script, which only a GET of / or /chart.js answers, and the Prometheus text of a GET of
//     /metrics, each line a comment or a sample);
//   - a request that is not a properly signed mutation changes neither the version nor the
//     events, nor does one of the job's summaries or an agent's lease (kept in memory only);
//   - a 200 on PUT means version + 1, a 201 on POST one more event, and the state file then
//     loads to the same state.
#include <filesystem>
#include <set>
#include <stdexcept>

#include "check.hpp"
#include "kf-config-server/lib/service.hpp"
#include "kf-config-server/lib/state.hpp"
#include "kf/common/json.hpp"
#include "kf/runtime/request_signature.hpp"

namespace fs = std::filesystem;
using namespace kf::config_server;

namespace {

const std::string kToken = "fuzz-token";
const auto kNow =
    std::chrono::system_clock::time_point(std::chrono::milliseconds(1'700'000'000'000));

std::string state_text(const State& s) { return s.to_json().dump(); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // Each input starts from no state at all: a log left by the last input would be loaded by the
  // new service (and make an input's outcome depend on the ones before it).
  const fs::path file = kf::fuzz::scratch_dir() / "state.json";
  fs::remove(file);
  fs::remove(log_file(file));
  ServiceOptions options;
  options.state_file = file;
  options.token = kToken;
  options.max_body_bytes = 4096;
  options.now = [] { return kNow; };
  Service service(options);
  const kf::Key control = kf::derive_key(kToken, kf::KeyUse::control);
  static const std::set<int> documented{200, 201, 400, 401, 404, 405, 409, 413};
  static const char* const methods[] = {"GET", "PUT", "POST", "DELETE", "HEAD"};
  kf::fuzz::Input in(data, size);
  for (int n = 0; n < 16 && !in.empty(); ++n) {
    Request r;
    const std::uint8_t op = in.byte();
    r.method = methods[(op & 7) % 5];
    const int auth = (op >> 3) % 4;
    r.target = in.piece();
    r.body = in.piece();
    switch (auth) {
      case 0: break;
      case 1:
        r.authorization = kf::sign_request(
            control, r.method, r.target, r.body,
            std::chrono::duration_cast<std::chrono::milliseconds>(kNow.time_since_epoch()).count());
        break;
      case 2: r.authorization = "Bearer " + kToken; break;
      default: r.authorization = in.piece(); break;
    }
    const std::uint64_t version = service.version();
    const std::size_t events = service.state().events.size();
    const std::string before = state_text(service.state());
    (void)service.watch_after(r);
    const Response a = service.handle(r);
    const std::string what =
        r.method + " " + r.target + " -> " + std::to_string(a.status) + " " + a.body;
    KF_FUZZ_CHECK(documented.contains(a.status), what);
    const std::string path = r.target.substr(0, r.target.find('?'));
    if (a.content_type == "application/json") {
      KF_FUZZ_CHECK(!kf::parse_json_or_discard(a.body).is_discarded(), what);
    } else if (path == "/metrics") {
      KF_FUZZ_CHECK(
          a.status == 200 && r.method == "GET" && !a.body.empty() && a.body.back() == '\n', what);
      for (std::size_t at = 0; at < a.body.size(); at = a.body.find('\n', at) + 1) {
        const char c = a.body[at];
        KF_FUZZ_CHECK(c == '#' || c == '_' || (c >= 'a' && c <= 'z'), what);
      }
    } else {
      KF_FUZZ_CHECK(a.status == 200 && r.method == "GET" && (path == "/" || path == "/chart.js"),
                    what);
    }
    const bool in_memory = path == "/v1/summary" || path == "/v1/agents";
    const bool signed_mutation =
        auth == 1 && (r.method == "PUT" || r.method == "POST") && !in_memory;
    if (!signed_mutation || a.status >= 300) {
      KF_FUZZ_CHECK(state_text(service.state()) == before, "changed: " + what);
      continue;
    }
    if (r.method == "PUT") {
      KF_FUZZ_CHECK(a.status == 200 && service.version() == version + 1, what);
    } else {
      KF_FUZZ_CHECK(a.status == 201 && service.state().events.size() == events + 1 &&
                        service.version() == version,
                    what);
    }
    KF_FUZZ_CHECK(state_text(load_state(file)) == state_text(service.state()),
                  "the state file does not reload to the state after " + what);
  }
  return 0;
}
