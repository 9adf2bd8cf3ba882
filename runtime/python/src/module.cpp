// SPDX-License-Identifier: Apache-2.0
// kf._kf: the Python binding of kf's runtime (docs/python.md). One translation unit, since
// LibTorch's and pybind11's headers are costly. The Python package around it (kf/__init__.py,
// kf/torch.py) gives it its public names.
//
// Torch tensors pass both ways without copies (LibTorch's own type casters: a Python tensor is
// the C++ tensor). Blocking calls (join, a step's boundary, collectives, the optimizer's wait for
// its gradients) release the GIL; a step's body and the wrapped Python optimizer take it back.
// Errors: kf::Error becomes kf.Error with the C++ message (and .code, .category); when a step's
// body lets a kf.Error raised by kf's own calls escape, the session sees the original C++ error,
// so that it recovers from a peer failure as in a C++ program.
#include <torch/extension.h>

#include <pybind11/stl.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kf/common/error.hpp"
#include "kf/policies/builtin.hpp"
#include "kf/policies/policy.hpp"
#include "kf/runtime/elastic_sampler.hpp"
#include "kf/runtime/policy_runner.hpp"
#include "kf/runtime/session.hpp"
#include "kf/runtime/state.hpp"
#include "kf/runtime/training_mode.hpp"
#include "kf/torch/distributed_optimizer.hpp"

namespace py = pybind11;

namespace {

// kf.Error, made in PYBIND11_MODULE.
PyObject* g_error_type = nullptr;
constexpr const char* kCppError = "_kf_cpp_error";

// nlohmann::json to Python and back, through the json module: settings and defaults are small.
py::object to_python(const nlohmann::json& j) {
  return py::module_::import("json").attr("loads")(j.dump());
}
nlohmann::json from_python(const py::handle& o, const char* what) {
  std::string text;
  try {
    text = py::module_::import("json").attr("dumps")(o).cast<std::string>();
  } catch (py::error_already_set& e) {
    throw py::type_error(std::string(what) + " must be JSON-serialisable: " + e.what());
  }
  return nlohmann::json::parse(text);
}

// A State and the tensors registered with it: the state reads and writes their memory, so the
// binding holds a reference to each for as long as the state lives.
struct PyState {
  kf::State state;
  std::vector<at::Tensor> held;
  std::vector<std::string> names;

  void add(const std::string& name, const at::Tensor& t) {
    state.add(name, kf::tensor_buffer(t, "State.add('" + name + "')"));
    held.push_back(t);
    names.push_back(name);
  }
};

// State.add_state_dict: every tensor of a (nested) mapping, under prefix/key.
void add_mapping(PyState& s, const std::string& prefix, const py::handle& mapping) {
  if (!py::isinstance<py::dict>(mapping) && !py::hasattr(mapping, "items")) {
    throw py::type_error("State.add_state_dict('" + prefix + "'): a mapping is needed, not " +
                         std::string(py::str(mapping.get_type().attr("__name__"))));
  }
  for (const py::handle item : mapping.attr("items")()) {
    const auto pair = py::reinterpret_borrow<py::tuple>(item);
    const std::string key = prefix + "/" + std::string(py::str(pair[0]));
    const py::handle value = pair[1];
    if (THPVariable_Check(value.ptr())) {
      s.add(key, value.cast<at::Tensor>());
    } else if (py::isinstance<py::dict>(value)) {
      add_mapping(s, key, value);
    } else {
      throw py::type_error("State.add_state_dict: '" + key + "' is a " +
                           std::string(py::str(value.get_type().attr("__name__"))) +
                           "; tensors and dicts of them can be registered");
    }
  }
}

// One of a State's counters: a view of the 64-bit integer the state owns.
struct Counter {
  std::int64_t* value;
  std::string name;
};

// A torch.optim param group's options as LibTorch sees them: the learning rate is the Python
// group's "lr", read and written there (Session policies and set_learning_rate change it).
class PyGroupOptions : public torch::optim::OptimizerCloneableOptions<PyGroupOptions> {
 public:
  explicit PyGroupOptions(py::dict group) : group_(std::move(group)) {}
  PyGroupOptions(const PyGroupOptions& other) {
    py::gil_scoped_acquire gil;
    group_ = other.group_;
  }
  PyGroupOptions& operator=(const PyGroupOptions&) = delete;
  ~PyGroupOptions() override {
    py::gil_scoped_acquire gil;
    group_ = py::dict();
  }
  double get_lr() const override {
    py::gil_scoped_acquire gil;
    return group_.contains("lr") ? group_["lr"].cast<double>() : 0.0;
  }
  void set_lr(const double lr) override {
    py::gil_scoped_acquire gil;
    group_["lr"] = lr;
  }

 private:
  py::dict group_;
};

// A Python torch.optim optimizer as a LibTorch one: the same parameter tensors, in the same
// groups, and a step() that runs the Python optimizer's. The optimizer's state stays Python's
// (kf/torch.py registers it with the State).
class PyOptimizer : public torch::optim::Optimizer {
 public:
  explicit PyOptimizer(py::object optimizer)
      : torch::optim::Optimizer(groups_of(optimizer), std::make_unique<PyGroupOptions>(py::dict())),
        optimizer_(std::move(optimizer)) {}
  ~PyOptimizer() override {
    py::gil_scoped_acquire gil;
    optimizer_ = py::object();
  }
  at::Tensor step(LossClosure closure) override {
    if (closure) throw std::invalid_argument("kf: a closure cannot be passed to step()");
    py::gil_scoped_acquire gil;
    optimizer_.attr("step")();
    return {};
  }

 private:
  static std::vector<torch::optim::OptimizerParamGroup> groups_of(const py::object& optimizer) {
    if (!py::hasattr(optimizer, "param_groups") || !py::hasattr(optimizer, "step")) {
      throw py::type_error(
          "DistributedOptimizer: wraps a torch.optim optimizer (an object with "
          "param_groups and step())");
    }
    std::vector<torch::optim::OptimizerParamGroup> groups;
    for (const py::handle g : optimizer.attr("param_groups")) {
      py::dict group = py::reinterpret_borrow<py::dict>(g);
      std::vector<at::Tensor> params;
      for (const py::handle p : group["params"]) params.push_back(p.cast<at::Tensor>());
      groups.emplace_back(std::move(params), std::make_unique<PyGroupOptions>(group));
    }
    return groups;
  }
  py::object optimizer_;
};

// kf::DistributedOptimizer over a Python optimizer.
struct PyDistributedOptimizer {
  PyDistributedOptimizer(kf::Session& session, py::object optimizer,
                         const kf::DistributedOptimizerOptions& options)
      : shim(std::make_unique<PyOptimizer>(std::move(optimizer))),
        opt(std::make_unique<kf::DistributedOptimizer>(session, *shim, options)) {}
  std::unique_ptr<PyOptimizer> shim;
  std::unique_ptr<kf::DistributedOptimizer> opt;
};

// Runs a step's Python body with the GIL. A kf.Error that kf raised inside it goes on as the
// C++ error it was, so that Session::step recovers from peer failures.
void run_body(const py::function& body) {
  py::gil_scoped_acquire gil;
  try {
    body();
  } catch (py::error_already_set& e) {
    if (e.matches(g_error_type) && py::hasattr(e.value(), kCppError)) {
      const auto cap = e.value().attr(kCppError).cast<py::capsule>();
      const std::exception_ptr original = *cap.get_pointer<std::exception_ptr>();
      std::rethrow_exception(original);
    }
    throw;
  }
}

const char* outcome_name(kf::Session::Outcome o) {
  switch (o) {
    case kf::Session::Outcome::committed: return "committed";
    case kf::Session::Outcome::rolled_back: return "rolled_back";
    case kf::Session::Outcome::left: return "left";
  }
  return "?";
}

kf::ReduceOp reduce_op(const std::string& op) {
  if (op == "sum") return kf::ReduceOp::sum;
  if (op == "min") return kf::ReduceOp::min;
  if (op == "max") return kf::ReduceOp::max;
  if (op == "prod") return kf::ReduceOp::prod;
  if (op == "avg") return kf::ReduceOp::avg;
  throw py::value_error("op must be one of sum, min, max, prod, avg, not '" + op + "'");
}

kf::Buffer host_buffer(const at::Tensor& t, const char* what) {
  if (t.is_cuda()) {
    throw py::value_error(std::string(what) + ": a CPU tensor is needed here");
  }
  return kf::tensor_buffer(t, what);
}

py::dict change_dict(const kf::ChangeRecord& c) {
  py::dict d;
  d["kind"] = c.kind;
  d["detail"] = c.detail;
  d["from_version"] = c.from_version;
  d["to_version"] = c.to_version;
  d["from_size"] = c.from_size;
  d["to_size"] = c.to_size;
  d["commit"] = c.commit;
  d["sync_bytes"] = c.sync_bytes;
  d["summary"] = c.summary();
  return d;
}

// ---- policies -----------------------------------------------------------------------------

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
    policy_ = py::object();
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

kf::PolicyHook hook_named(const std::string& name) {
  try {
    return kf::parse_policy_hook(name);
  } catch (const std::invalid_argument& e) {
    throw py::value_error(e.what());
  }
}

}  // namespace

PYBIND11_MODULE(_kf, m) {
  m.doc() = "kf's runtime from Python (use the kf package: docs/python.md)";

  g_error_type = PyErr_NewExceptionWithDoc(
      "kf.Error",
      "An error of kf's runtime: the C++ kf::Error's message, with .code (its error code) "
      "and .category (its category's name)",
      PyExc_RuntimeError, nullptr);
  m.attr("Error") = py::handle(g_error_type);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const kf::Error& e) {
      py::object type = py::reinterpret_borrow<py::object>(g_error_type);
      py::object exc = type(e.what());
      exc.attr("code") = e.code().value();
      exc.attr("category") = std::string(e.code().category().name());
      exc.attr(kCppError) = py::capsule(new std::exception_ptr(p), [](void* ptr) {
        delete static_cast<std::exception_ptr*>(ptr);
      });
      PyErr_SetObject(g_error_type, exc.ptr());
    }
  });

  py::class_<Counter>(m, "Counter", "A 64-bit counter owned by a State (committed with it)")
      .def_property(
          "value", [](const Counter& c) { return *c.value; },
          [](Counter& c, std::int64_t v) { *c.value = v; })
      .def_readonly("name", &Counter::name)
      .def("__int__", [](const Counter& c) { return *c.value; })
      .def("__index__", [](const Counter& c) { return *c.value; })
      .def("__repr__", [](const Counter& c) {
        return "Counter('" + c.name + "', " + std::to_string(*c.value) + ")";
      });

  py::class_<PyState>(m, "State")
      .def(py::init<>())
      .def("add", &PyState::add, py::arg("name"), py::arg("tensor"),
           "Registers a contiguous float32, float64 or int64 tensor (CPU or CUDA) under name; "
           "the state holds a reference to it")
      .def(
          "add_state_dict",
          [](PyState& s, const std::string& prefix, const py::handle& mapping) {
            add_mapping(s, prefix, mapping);
          },
          py::arg("prefix"), py::arg("state_dict"),
          "Registers every tensor of a state dict (a module's state_dict(), whose tensors share "
          "the module's memory) as prefix/key; nested dicts as prefix/key/inner")
      .def(
          "counter",
          [](PyState& s, const std::string& name) {
            return Counter{&s.state.counter(name), name};
          },
          py::arg("name"), py::keep_alive<0, 1>(),
          "The counter of that name, created at 0 on first use")
      .def("commit", [](PyState& s) { s.state.commit(); })
      .def("restore", [](PyState& s) { s.state.restore(); })
      .def("save", [](const PyState& s, const std::string& path) { s.state.save(path); })
      .def("load", [](PyState& s, const std::string& path) { s.state.load(path); })
      .def_property_readonly("commits", [](const PyState& s) { return s.state.commits(); })
      .def_property_readonly("bytes", [](const PyState& s) { return s.state.bytes(); })
      .def_property_readonly("names", [](const PyState& s) { return s.names; })
      .def_property_readonly("layout", [](const PyState& s) { return s.state.layout(); });

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

  py::class_<kf::ElasticSampler>(m, "ElasticSampler")
      .def(py::init<std::size_t, std::uint64_t, bool>(), py::arg("dataset_size"), py::arg("seed"),
           py::arg("shuffle") = true)
      .def("start_epoch", &kf::ElasticSampler::start_epoch, py::arg("epoch"),
           py::arg("position") = 0)
      .def("batch", &kf::ElasticSampler::batch, py::arg("rank"), py::arg("size"),
           py::arg("global_batch"))
      .def("range", &kf::ElasticSampler::range, py::arg("first"), py::arg("count"))
      .def("step_samples", &kf::ElasticSampler::step_samples, py::arg("global_batch"))
      .def("advance", &kf::ElasticSampler::advance, py::arg("global_batch"))
      .def_property_readonly("epoch", &kf::ElasticSampler::epoch)
      .def_property_readonly("position", &kf::ElasticSampler::position)
      .def_property_readonly("epoch_done", &kf::ElasticSampler::epoch_done)
      .def("__len__", &kf::ElasticSampler::size);

  py::class_<kf::Session>(m, "Session")
      .def(py::init([](PyState& state, const py::object& defaults) {
             const nlohmann::json d =
                 defaults.is_none() ? nlohmann::json::object() : from_python(defaults, "defaults");
             if (!d.is_object()) throw py::type_error("defaults must be a dict");
             return kf::Session::from_environment(state.state, d);
           }),
           py::arg("state"), py::arg("defaults") = py::none(), py::keep_alive<1, 2>())
      .def("join", &kf::Session::join, py::call_guard<py::gil_scoped_release>())
      .def(
          "step",
          [](kf::Session& s, const py::function& body) {
            kf::Session::Outcome o;
            {
              py::gil_scoped_release release;
              o = s.step([&body] { run_body(body); });
            }
            return outcome_name(o);
          },
          py::arg("body"))
      .def(
          "_add_python_policy",
          [](kf::Session& s, PyPolicies& p, py::object policy, const std::string& name) {
            const int digest = s.add_metric("kf.policy." + name + ".digest");
            const int square = s.add_metric("kf.policy." + name + ".digest_sq");
            p.runner.add(std::make_unique<PyPolicy>(std::move(policy), name, s, digest, square));
          },
          py::arg("runner"), py::arg("policy"), py::arg("name"))
      .def(
          "_set_policies", [](kf::Session& s, PyPolicies& p) { s.set_policies(&p.runner); },
          py::arg("runner"), py::keep_alive<1, 2>())
      .def(
          "run_hook",
          [](kf::Session& s, const std::string& hook, std::int64_t epoch) {
            const kf::PolicyHook h = hook_named(hook);
            kf::Proposal p;
            {
              py::gil_scoped_release release;
              p = s.run_hook(h, epoch);
            }
            return to_python(p.to_json());
          },
          py::arg("hook"), py::arg("epoch") = -1,
          "Runs a hook of the session's policies (before_train, before_epoch, after_epoch; "
          "after_step and on_membership_change run by themselves) and applies their proposal; "
          "returns it")
      .def("finish", &kf::Session::finish, py::call_guard<py::gil_scoped_release>())
      .def("add_metric", &kf::Session::add_metric, py::arg("name"))
      .def("set_metric", &kf::Session::set_metric, py::arg("slot"), py::arg("value"))
      .def_property_readonly("metrics", &kf::Session::metrics)
      .def("batch_part", &kf::Session::batch_part, py::arg("samples"))
      .def_property_readonly("rank", &kf::Session::rank)
      .def_property_readonly("size", &kf::Session::size)
      .def_property_readonly("version", &kf::Session::version)
      .def_property_readonly("steps", &kf::Session::steps)
      .def_property_readonly("commits", &kf::Session::commits)
      .def_property_readonly("settings",
                             [](const kf::Session& s) { return to_python(s.settings()); })
      .def_property_readonly("mode", [](const kf::Session& s) { return s.mode().str(); })
      .def_property_readonly("models_may_diverge",
                             [](const kf::Session& s) { return kf::models_may_diverge(s.mode()); })
      .def_property_readonly("compression",
                             [](const kf::Session& s) { return s.compression().str(); })
      .def_property_readonly("stop_requested", &kf::Session::stop_requested)
      .def_property_readonly("boundaries_on_change", &kf::Session::boundaries_on_change)
      .def_property_readonly("decisions",
                             [](const kf::Session& s) {
                               py::list out;
                               for (const auto& d : s.decisions()) {
                                 py::dict e;
                                 e["step"] = d.step;
                                 e["hook"] = d.hook;
                                 e["proposal"] = to_python(d.proposal.to_json());
                                 out.append(e);
                               }
                               return out;
                             })
      .def_property_readonly("changes",
                             [](const kf::Session& s) {
                               py::list out;
                               for (const auto& c : s.changes()) out.append(change_dict(c));
                               return out;
                             })
      .def(
          "allreduce",
          [](kf::Session& s, const at::Tensor& t, const std::string& name, const std::string& op) {
            const kf::Buffer b = host_buffer(t, "allreduce");
            kf::CollOptions o;
            o.op = reduce_op(op);
            py::gil_scoped_release release;
            s.peer().allreduce(name, b, b, o).wait();
          },
          py::arg("tensor"), py::arg("name"), py::arg("op") = "sum",
          "In place, over every worker (every worker calls it with the same name)")
      .def(
          "consensus",
          [](kf::Session& s, const at::Tensor& t, const std::string& name) {
            const kf::Buffer b = host_buffer(t, "consensus");
            bool agreed = false;
            py::gil_scoped_release release;
            s.peer().consensus(name, b, &agreed).wait();
            return agreed;
          },
          py::arg("tensor"), py::arg("name"),
          "Whether every worker holds the same bytes in tensor");

  py::class_<PyDistributedOptimizer>(m, "DistributedOptimizer")
      .def(py::init([](kf::Session& session, py::object optimizer, std::size_t bucket_bytes,
                       bool overlap, bool momentum_correction, bool momentum_masking) {
             kf::DistributedOptimizerOptions o;
             o.bucket_bytes = bucket_bytes;
             o.overlap = overlap;
             o.momentum_correction = momentum_correction;
             o.momentum_masking = momentum_masking;
             return std::make_unique<PyDistributedOptimizer>(session, std::move(optimizer), o);
           }),
           py::arg("session"), py::arg("optimizer"), py::arg("bucket_bytes") = 4u << 20,
           py::arg("overlap") = true, py::arg("momentum_correction") = true,
           py::arg("momentum_masking") = true, py::keep_alive<1, 2>())
      .def("zero_grad", [](PyDistributedOptimizer& d) { d.opt->zero_grad(); })
      .def(
          "begin_step",
          [](PyDistributedOptimizer& d, std::int64_t local, std::int64_t global) {
            d.opt->begin_step(local, global);
          },
          py::arg("local_samples"), py::arg("global_samples"))
      .def(
          "step", [](PyDistributedOptimizer& d) { d.opt->step(); },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "average_parameters", [](PyDistributedOptimizer& d) { d.opt->average_parameters(); },
          py::call_guard<py::gil_scoped_release>())
      .def_property(
          "learning_rate", [](const PyDistributedOptimizer& d) { return d.opt->learning_rate(); },
          [](PyDistributedOptimizer& d, double lr) { d.opt->set_learning_rate(lr); })
      .def_property_readonly("bytes_sent",
                             [](const PyDistributedOptimizer& d) { return d.opt->bytes_sent(); })
      .def_property_readonly(
          "exposed_comm",
          [](const PyDistributedOptimizer& d) { return d.opt->exposed_comm().count(); })
      .def_property_readonly(
          "comm_span", [](const PyDistributedOptimizer& d) { return d.opt->comm_span().count(); })
      .def_property_readonly("buckets",
                             [](const PyDistributedOptimizer& d) { return d.opt->buckets(); });
}
