// SPDX-License-Identifier: Apache-2.0
// The small parsers of outside text. Each either accepts its input or throws
// std::invalid_argument saying what is wrong (never anything else), and what it accepts prints
// as text it accepts again as the same value:
//   config-service URLs (ConfigClient::parse_service_url), listen addresses
//   (kf-config-server --listen), port ranges (kfrun --ports), config-service queries
//   (parse_query), signed requests' Authorization values (parse_request_signature), the
//   service's time in an answer (read_service_time: taken only as service_time_proof makes it),
//   and the
//   worker's environment (Env::from_environment, every KF_* variable at once).
#include <cstdlib>
#include <stdexcept>

#include "check.hpp"
#include "kf-config-server/lib/listen_address.hpp"
#include "kf-config-server/lib/service.hpp"
#include "kf/common/env.hpp"
#include "kf/common/host.hpp"
#include "kf/runtime/config_client.hpp"
#include "kf/runtime/request_signature.hpp"
#include "kfrun/lib/ports.hpp"

namespace {

template <class F>
void only_invalid_argument(const char* what, const std::string& text, F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    KF_FUZZ_CHECK(std::string_view(e.what()).size() > 0, std::string(what) + ": empty reason");
  } catch (const std::exception& e) {
    KF_FUZZ_CHECK(false,
                  std::string(what) + "('" + text + "') threw another exception: " + e.what());
  }
}

const char* const kVariables[] = {
    "KF_SELF",
    "KF_CLUSTER",
    "KF_JOB_ID",
    "KF_CONFIG_SERVER",
    "KF_ALGORITHM",
    "KF_TRANSPORT",
    "KF_TIMEOUT_MS",
    "KF_SPIN_US",
    "KF_EXPRESS_BYTES",
    "KF_HEARTBEAT_MS",
    "KF_CONNECT_TIMEOUT_MS",
    "KF_CHECKPOINT_EVERY",
    "KF_MONITORS",
    "KF_GNS_THETA",
    "KF_METRICS_PORT",
    "KF_METRICS_EVERY",
    "KF_SERVICE_TIMEOUT_MS",
    "KF_FRAME_AUTH",
    "KF_DEVICE_BACKEND",
    "KF_RECOVERY_WRITER_WAIT_MS",
    "KF_LISTEN_FD",
    "KF_BOUNDARY_INTERVAL_MS",
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  kf::fuzz::Input in(data, size);
  const std::uint8_t which = in.byte();
  const std::string text = in.piece(which >= 6);
  switch (which % 6) {
    case 0:
      only_invalid_argument("parse_service_url", text, [&] {
        const auto u = kf::ConfigClient::parse_service_url(text);
        KF_FUZZ_CHECK(!u.endpoints.empty(), text);
        for (const auto& e : u.endpoints) {
          KF_FUZZ_CHECK(kf::host_problem(e.host).empty(), text + ": host " + e.host);
        }
      });
      break;
    case 1:
      only_invalid_argument("ListenAddress::parse", text, [&] {
        const auto a = kf::config_server::ListenAddress::parse(text);
        KF_FUZZ_CHECK(kf::host_problem(a.host).empty(), text + ": host " + a.host);
        const std::string again =
            (a.host.find(':') != std::string::npos ? "[" + a.host + "]" : a.host) + ":" +
            std::to_string(a.port);
        const auto b = kf::config_server::ListenAddress::parse(again);
        KF_FUZZ_CHECK(b.host == a.host && b.port == a.port, text + " -> " + again);
      });
      break;
    case 2:
      only_invalid_argument("PortRange::parse", text, [&] {
        const auto r = kf::tools::PortRange::parse(text);
        KF_FUZZ_CHECK(r.first >= 1 && r.first <= r.last, text);
        KF_FUZZ_CHECK(kf::tools::PortRange::parse(r.str()) == r, text + " -> " + r.str());
      });
      break;
    case 3:
      only_invalid_argument("parse_query", text, [&] {
        const auto q = kf::config_server::parse_query(text);
        std::string again;
        for (const auto& [k, v] : q) again += (again.empty() ? "" : "&") + k + "=" + v;
        KF_FUZZ_CHECK(kf::config_server::parse_query(again) == q, text + " -> " + again);
      });
      break;
    case 4: {
      std::string why;
      const auto s = kf::parse_request_signature(text, why);
      KF_FUZZ_CHECK(s.has_value() != !why.empty(), "a refusal says why, an acceptance nothing");
      // The service's time in an answer (X-KF-Time): taken only as the service made it.
      static const kf::Key key = kf::derive_key("fuzz-token", kf::KeyUse::control);
      const std::string nonce(32, 'a');
      if (const auto ms = kf::read_service_time(key, text, nonce)) {
        KF_FUZZ_CHECK(
            *ms >= 0 &&
                text.ends_with(kf::service_time_proof(key, *ms, nonce)
                                   .substr(kf::service_time_proof(key, *ms, nonce).find(','))),
            "a service time was taken without its MAC");
      }
      break;
    }
    default: {
      // Every variable from the input (an empty piece leaves it unset).
      for (const char* v : kVariables) {
        const std::string value = in.piece();
        if (value.empty() || value.find('\0') != std::string::npos) {
          ::unsetenv(v);
        } else {
          ::setenv(v, value.c_str(), 1);
        }
      }
      ::unsetenv("KF_JOB_TOKEN_FILE");
      ::setenv("KF_JOB_TOKEN", "t", 1);
      only_invalid_argument("Env::from_environment", "", [] { (void)kf::Env::from_environment(); });
      break;
    }
  }
  return 0;
}
