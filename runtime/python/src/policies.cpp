// SPDX-License-Identifier: Apache-2.0
// kf._kf's policies (docs/python.md, "Policies"): built-ins and plugins by name, Python objects
// with hooks, and the check that a Python policy decides the same on every worker. No LibTorch
// headers here (bridge.hpp).
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include <pybind11/stl.h>

#include "bridge.hpp"
#include "kf/policies/builtin.hpp"
#include "kf/policies/policy.hpp"
#include "kf/runtime/policy_runner.hpp"
#include "kf/runtime/session.hpp"

namespace kf_python {
namespace {

// The PolicyContext a Python hook receives, valid during the call only: a policy that keeps it
// and uses it later gets an error, not a dangling reference.
struct PyPolicyContext {
  kf::PolicyContext* ctx = nullptr;
  kf::PolicyContext& get() const {
    if (ctx == nullptr) {
      throw std::logic_error("a PolicyContext is valid during its hook's call only");
    }
    return *ctx;
  }
};

// FNV-1a, continued from `h`.
std::uint64_t fnv(std::uint64_t h, std::string_view text) {
  for (const char c : text) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

// A Python object whose methods before_train, before_epoch, after_step, after_epoch and
// on_membership_change (those it has) are the hooks, run by the session's PolicyRunner.
//
// The determinism rule, checked: every worker must propose the same from the same inputs. Each
// worker folds what this policy proposed at every call into a digest (20 bits, so that sums of
// them are exact in a double), which it reports as two of the session's metrics, the digest and
// its square, at the next step; the boundary averages them, and the workers proposed the same
// only if the average of the squares is the square of the average. Every worker sees the same
// averages, so every worker finds a difference at the same boundary, and then the policy throws
// on every worker: the runner disables it everywhere at once (logged with the reason). Across a
// change of the cluster (a joiner has not seen the calls before it) one round is not compared.
class PyPolicy : public kf::Policy {
 public:
  PyPolicy(py::object policy, std::string name, kf::Session& session, int digest_slot,
           int square_slot)
      : policy_(std::move(policy)),
        name_(std::move(name)),
        session_(session),
        digest_slot_(digest_slot),
        square_slot_(square_slot) {}
  ~PyPolicy() override {
    py::gil_scoped_acquire gil;
    policy_.release().dec_ref();
  }
  std::string name() const override { return name_; }
  void before_train(kf::PolicyContext& c) override { call("before_train", c); }
  void before_epoch(kf::PolicyContext& c) override { call("before_epoch", c); }
  void after_step(kf::PolicyContext& c) override {
    check(c);
    call("after_step", c);
  }
  void after_epoch(kf::PolicyContext& c) override { call("after_epoch", c); }
  void on_membership_change(kf::PolicyContext& c) override { call("on_membership_change", c); }

 private:
  static constexpr std::uint64_t kDigestMask = (std::uint64_t{1} << 20) - 1;

  void check(const kf::PolicyContext& c) {
    const kf::PolicyInputs& in = c.inputs();
    if (published_ && in.version == published_version_ && failed_.empty()) {
      const double d = c.metric("kf.policy." + name_ + ".digest");
      const double sq = c.metric("kf.policy." + name_ + ".digest_sq");
      if (sq - d * d != 0) {
        failed_ =
            "the workers decided differently from the same inputs (a Python policy must "
            "be deterministic: no clocks, no unseeded random numbers, no rank or host of "
            "its own; found at step " +
            std::to_string(in.step) + ")";
      }
    }
    if (in.version != seen_version_) {
      // The cluster changed since the last round: this round's calls are not compared.
      seen_version_ = in.version;
      published_ = false;
    } else {
      const auto d = static_cast<double>(digest_ & kDigestMask);
      session_.set_metric(digest_slot_, d);
      session_.set_metric(square_slot_, d * d);
      published_ = true;
      published_version_ = in.version;
    }
    digest_ = 1469598103934665603ull;
  }

  void call(const char* hook, kf::PolicyContext& c) {
    if (!failed_.empty()) throw std::runtime_error(failed_);
    py::gil_scoped_acquire gil;
    try {
      if (py::hasattr(policy_, hook)) {
        py::object ctx = py::cast(PyPolicyContext{&c});
        struct Invalidate {
          py::object& ctx;
          ~Invalidate() { ctx.cast<PyPolicyContext&>().ctx = nullptr; }
        } invalidate{ctx};
        policy_.attr(hook)(ctx);
      }
    } catch (py::error_already_set& e) {
      throw std::runtime_error(std::string("Python: ") + e.what());
    }
    digest_ = fnv(digest_, hook);
    digest_ = fnv(digest_, std::to_string(c.inputs().step));
    digest_ = fnv(digest_, c.proposal().to_json().dump());
  }

  py::object policy_;
  std::string name_;
  kf::Session& session_;
  int digest_slot_, square_slot_;
  std::uint64_t digest_ = 1469598103934665603ull;
  bool published_ = false;
  std::uint64_t published_version_ = 0, seen_version_ = 0;
  std::string failed_;
};

// The policies a Python program gives its session (Session(policies=...)): built-ins and
// plugins by name, and Python objects.
struct PyPolicies {
  kf::PolicyRegistry registry;
  kf::PolicyRunner runner;
  bool registry_ready = false;

  kf::PolicyRegistry& reg() {
    if (!registry_ready) {
      kf::register_builtin_policies(registry);
      registry_ready = true;
    }
    return registry;
  }
};

py::dict speed_dict(const kf::WorkerSpeed& w) {
  py::dict d;
  d["worker"] = w.worker;
  d["vs_fastest"] = w.vs_fastest;
  d["vs_own_best"] = w.vs_own_best;
  d["slow"] = w.slow;
  return d;
}
}  // namespace

void bind_policies(py::module_& m) {
  py::class_<PyPolicyContext>(m, "PolicyContext",
                              "What a policy's hook reads and proposes (valid during the call)")
      .def_property_readonly("step", [](const PyPolicyContext& c) { return c.get().step(); })
      .def_property_readonly("epoch",
                             [](const PyPolicyContext& c) { return c.get().inputs().epoch; })
      .def_property_readonly("workers", [](const PyPolicyContext& c) { return c.get().workers(); })
      .def_property_readonly("version",
                             [](const PyPolicyContext& c) { return c.get().inputs().version; })
      .def_property_readonly("settings",
                             [](const PyPolicyContext& c) { return to_python(c.get().settings()); })
      .def_property_readonly("metrics",
                             [](const PyPolicyContext& c) { return c.get().inputs().metrics; })
      .def_property_readonly("speeds",
                             [](const PyPolicyContext& c) {
                               py::list out;
                               for (const auto& w : c.get().speeds()) out.append(speed_dict(w));
                               return out;
                             })
      .def(
          "metric",
          [](const PyPolicyContext& c, const std::string& name, double fallback) {
            return c.get().metric(name, fallback);
          },
          py::arg("name"), py::arg("fallback") = 0.0)
      .def(
          "has_metric",
          [](const PyPolicyContext& c, const std::string& name) {
            return c.get().has_metric(name);
          },
          py::arg("name"))
      .def(
          "resize",
          [](PyPolicyContext& c, int n, const std::string& why) { c.get().resize(n, why); },
          py::arg("workers"), py::arg("why") = "")
      .def(
          "set_batch_size",
          [](PyPolicyContext& c, std::int64_t b, const std::string& why) {
            c.get().set_batch_size(b, why);
          },
          py::arg("batch_size"), py::arg("why") = "")
      .def(
          "set_learning_rate",
          [](PyPolicyContext& c, double lr, const std::string& why) {
            c.get().set_learning_rate(lr, why);
          },
          py::arg("lr"), py::arg("why") = "")
      .def(
          "set_algorithm",
          [](PyPolicyContext& c, const std::string& a, const std::string& why) {
            c.get().set_algorithm(a, why);
          },
          py::arg("algorithm"), py::arg("why") = "")
      .def(
          "set_mode",
          [](PyPolicyContext& c, const std::string& mode, const std::string& why) {
            c.get().set_mode(mode, why);
          },
          py::arg("mode"), py::arg("why") = "")
      .def(
          "set_compression",
          [](PyPolicyContext& c, const std::string& comp, const std::string& why) {
            c.get().set_compression(comp, why);
          },
          py::arg("compression"), py::arg("why") = "")
      .def(
          "set_balance",
          [](PyPolicyContext& c, bool on, const std::string& why) { c.get().set_balance(on, why); },
          py::arg("on"), py::arg("why") = "")
      .def(
          "revoke",
          [](PyPolicyContext& c, const std::string& worker, const std::string& why) {
            c.get().revoke(worker, why);
          },
          py::arg("worker"), py::arg("why") = "")
      .def(
          "stop", [](PyPolicyContext& c, const std::string& why) { c.get().stop(why); },
          py::arg("why") = "")
      .def_property_readonly("proposal", [](const PyPolicyContext& c) {
        return to_python(c.get().proposal().to_json());
      });

  py::class_<PyPolicies>(m, "PolicyRunner", "The policies of a session (Session(policies=...))")
      .def(py::init<>())
      .def(
          "load_plugin", [](PyPolicies& p, const std::string& path) { p.reg().load_plugin(path); },
          py::arg("path"))
      .def(
          "add",
          [](PyPolicies& p, const std::string& name, const py::object& params) {
            const nlohmann::json j =
                params.is_none() ? nlohmann::json::object() : from_python(params, "params");
            p.runner.add(p.reg().make(name, j));
          },
          py::arg("name"), py::arg("params") = py::none())
      .def_property_readonly("names", [](PyPolicies& p) { return p.reg().names(); })
      .def_property_readonly("disabled", [](const PyPolicies& p) { return p.runner.disabled(); })
      .def(
          "record_to", [](PyPolicies& p, const std::string& path) { p.runner.record_to(path); },
          py::arg("path"));

  m.def(
      "_add_python_policy",
      [](kf::Session& s, PyPolicies& p, py::object policy, const std::string& name) {
        const int digest = s.add_metric("kf.policy." + name + ".digest");
        const int square = s.add_metric("kf.policy." + name + ".digest_sq");
        p.runner.add(std::make_unique<PyPolicy>(std::move(policy), name, s, digest, square));
      },
      py::arg("session"), py::arg("runner"), py::arg("policy"), py::arg("name"),
      "Adds a Python policy to runner, with its two digest metrics in session (before join)");
  m.def(
      "_set_policies", [](kf::Session& s, PyPolicies& p) { s.set_policies(&p.runner); },
      py::arg("session"), py::arg("runner"), py::keep_alive<1, 2>(),
      "Makes runner the session's policies (the session keeps it alive)");
}

}  // namespace kf_python
