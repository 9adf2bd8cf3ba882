// SPDX-License-Identifier: Apache-2.0
// The config client's reading of answers (kf/runtime/config_client.hpp), from kf-config-server
// and from etcd's JSON gateway alike. A fake server on 127.0.0.1 answers each request the client
// makes with the next answer the input describes: raw bytes, a status with a body, or a body
// shaped like etcd's (a range, a transaction, a watch stream, a lease) around base64 of input
// bytes; kf-config-server's answers signed as the service signs them, unless the input says
// not to. Each input runs a few client calls against it. After each:
//   - it returned, or threw kf::Error (ConflictError is one) and nothing else;
//   - a cluster document it returned reads back the same through to_json and from_json;
//   - a successful etcd put_cluster returned the version it was given plus one.
// Once its answers are used up the server answers 503, so every call ends.
#include <deque>
#include <openssl/evp.h>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "check.hpp"
#include "config_client/etcd.hpp"
#include "kf/runtime/config_client.hpp"
#include "support/canned_http.hpp"

namespace {

using nlohmann::json;

std::string base64(std::string_view s) {
  std::string out(4 * ((s.size() + 2) / 3) + 1, '\0');
  const int n =
      EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                      reinterpret_cast<const unsigned char*>(s.data()), static_cast<int>(s.size()));
  out.resize(static_cast<std::size_t>(n));
  return out;
}

// The job's cluster key in etcd (the client's prefix is derived from its token).
const std::string& cluster_key() {
  static const std::string key = kf::detail::prefix_for_token("fuzz-token") + "/cluster";
  return key;
}

// A revision or lease field as etcd writes it (an int64 in a string), or something else.
json revision(kf::fuzz::Input& in) {
  const std::uint8_t b = in.byte();
  switch (b % 4) {
    case 0: return std::to_string(b / 4);
    case 1: return b / 4;
    case 2: return in.piece();
    default: return "18446744073709551615";
  }
}

// A kv of an etcd range answer whose value is base64 of input bytes, sealed as the job's
// processes seal a document (sealed_text) or not, or the bytes as they are.
json kv(kf::fuzz::Input& in, const std::string& key) {
  static const kf::Key control = kf::derive_key("fuzz-token", kf::KeyUse::control);
  const std::uint8_t b = in.byte();
  std::string value = in.piece();
  if (b & 2) value = kf::detail::sealed_text(control, key, value);
  return json{{"key", base64(key)},
              {"value", b & 1 ? value : base64(value)},
              {"mod_revision", revision(in)},
              {"create_revision", revision(in)}};
}

json range(kf::fuzz::Input& in) {
  json kvs = json::array();
  for (int n = in.byte() % 3; n > 0; --n) kvs.push_back(kv(in, cluster_key()));
  return json{{"header", {{"revision", revision(in)}}}, {"kvs", kvs}};
}

// Input bytes that are not UTF-8 are replaced: the server's JSON is made, not copied.
std::string text(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string etcd_body(kf::fuzz::Input& in, int shape) {
  switch (shape) {
    case 0: return text(range(in));
    case 1: {
      const bool succeeded = in.byte() & 1;
      json responses = json::array();
      if (!succeeded) responses.push_back(json{{"response_range", range(in)}});
      return text(json{{"succeeded", succeeded},
                       {"header", {{"revision", revision(in)}}},
                       {"responses", responses}});
    }
    case 2: {  // a watch stream: one message per line
      std::string lines;
      for (int n = in.byte() % 4; n > 0; --n) {
        const std::uint8_t b = in.byte();
        json events = json::array();
        events.push_back(json{{"type", b & 1 ? "DELETE" : "PUT"}, {"kv", kv(in, cluster_key())}});
        json m = {{"result", {{"events", events}, {"canceled", (b & 2) != 0}}}};
        // The watch's first message: created, at a revision (the client reads again when it
        // is past the revision it read).
        if (b & 16) m["result"] = {{"created", true}, {"header", {{"revision", revision(in)}}}};
        if (b & 4) m = json{{"error", {{"message", in.piece()}}}};
        lines += (b & 8 ? in.piece() : text(m)) + "\n";
      }
      return lines;
    }
    default:
      return text(
          json{{"ID", revision(in)}, {"TTL", revision(in)}, {"result", {{"TTL", revision(in)}}}});
  }
}

std::string answer(kf::fuzz::Input& in) {
  static constexpr int kStatuses[] = {200, 200, 200, 201, 409, 400, 401, 404, 413, 500, 503, 302};
  const std::uint8_t form = in.byte();
  if (form % 4 == 0) return in.piece();  // raw bytes
  const std::uint8_t s = in.byte();
  const int status = s < 240 ? kStatuses[s % std::size(kStatuses)] : s + 300;
  const std::string body = form % 4 == 1 ? in.piece() : etcd_body(in, (form >> 2) % 4);
  std::string out = "HTTP/1.1 " + std::to_string(status) + " X\r\n";
  if (!(form & 0x40)) out += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  out += "Content-Type: application/json\r\n\r\n" + body;
  return out;
}

kf::Cluster some_cluster(std::uint64_t version) {
  kf::Cluster c;
  c.version = version;
  c.workers.push_back(kf::WorkerSpec{kf::Endpoint{"127.0.0.1", 4000}, 0});
  c.workers.push_back(kf::WorkerSpec{kf::Endpoint{"127.0.0.1", 4001}, 1});
  return c;
}

void reads_back(const kf::Cluster& c, const char* what) {
  const json j = c.to_json();
  kf::Cluster again;
  try {
    again = kf::Cluster::from_json(j);
  } catch (const std::invalid_argument& e) {
    KF_FUZZ_CHECK(false, std::string(what) + " returned a document that does not read back: " +
                             e.what() + ": " + j.dump());
  }
  KF_FUZZ_CHECK(again.to_json() == j, std::string(what) + ": " + j.dump());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static kf::test::CannedHttpServer server;
  kf::fuzz::Input in(data, size);
  const std::uint8_t first = in.byte();
  const bool etcd = first & 1;
  // kf's service signs its answers; an input may leave them unsigned (the client drops them).
  server.sign_as(!etcd && (first & 2) == 0 ? "fuzz-token" : "");
  const std::string url =
      (etcd ? "etcd://127.0.0.1:" : "http://127.0.0.1:") + std::to_string(server.port());
  kf::ConfigClientOptions options;
  options.deadline = std::chrono::milliseconds(3000);
  kf::ConfigClient client(url, "fuzz-token", options);
  for (int call = 0; call < 4 && !in.empty(); ++call) {
    const std::uint8_t op = in.byte();
    std::deque<std::string> answers;
    for (int n = in.byte() % 4 + 1; n > 0; --n) answers.push_back(answer(in));
    server.set_answers(std::move(answers));
    const std::uint64_t version = in.byte();
    std::string what = "call " + std::to_string(op % 8);
    try {
      switch (op % 8) {
        case 0: reads_back(client.get_cluster(), "get_cluster"); break;
        case 1: {
          // With the document it was edited from when the next bit says so (compared by value).
          const kf::Cluster base = some_cluster(version);
          const kf::Cluster stored =
              client.put_cluster(some_cluster(version), (op & 8) != 0 ? &base : nullptr);
          reads_back(stored, "put_cluster");
          if (etcd) KF_FUZZ_CHECK(stored.version == version + 1, "etcd put_cluster's version");
          break;
        }
        case 2: reads_back(client.watch(version, std::chrono::milliseconds(200)), "watch"); break;
        case 3: (void)client.post_event("added", "127.0.0.1:4000", "x", version); break;
        case 4: (void)client.get_events(version); break;
        case 5: client.announce_agent("h1", std::chrono::seconds(10), 2); break;
        case 6: client.keep_agent_alive(); break;
        default: (void)client.live_agents(); break;
      }
    } catch (const kf::ConflictError& e) {
      reads_back(e.current(), "put_cluster's conflict");
    } catch (const kf::Error&) {
    } catch (const std::exception& e) {
      KF_FUZZ_CHECK(false, what + " threw something other than kf::Error: " + e.what());
    }
  }
  server.set_answers({});
  return 0;
}
