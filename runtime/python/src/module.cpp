// SPDX-License-Identifier: Apache-2.0
// kf._kf: the Python binding of kf's runtime (docs/python.md). Two translation units, since
// LibTorch's and pybind11's headers are costly: this one (the state, the session, the sampler,
// the optimizer: LibTorch's headers) and policies.cpp (pybind11's only). The Python package
// around it (kf/__init__.py, kf/torch.py) gives it its public names.
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

#include "bridge.hpp"
#include "kf/common/error.hpp"
#include "kf/runtime/elastic_sampler.hpp"
#include "kf/runtime/policy_runner.hpp"
#include "kf/runtime/session.hpp"
#include "kf/runtime/state.hpp"
#include "kf/runtime/training_mode.hpp"
#include "kf/shared_memory.hpp"
#include "kf/torch/distributed_optimizer.hpp"

namespace py = pybind11;
using kf_python::from_python;
using kf_python::to_python;

namespace {

// kf.Error, made in PYBIND11_MODULE.
PyObject* g_error_type = nullptr;
constexpr const char* kCppError = "_kf_cpp_error";

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
    group_.release().dec_ref();
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
    optimizer_.release().dec_ref();
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

  // kf.shared_tensor's memory: `bytes` zeroed bytes of a kf::SharedMemory as a uint8 tensor that
  // owns it (the memory goes with the tensor's storage).
  m.def(
      "_shared_bytes",
      [](std::int64_t bytes) {
        if (bytes < 0) throw py::value_error("shared_tensor: " + std::to_string(bytes) + " bytes");
        auto mem = std::make_shared<kf::SharedMemory>(static_cast<std::size_t>(bytes));
        void* data = mem->data();
        return torch::from_blob(
            data, {bytes}, [mem](void*) mutable { mem.reset(); },
            torch::TensorOptions().dtype(torch::kUInt8));
      },
      py::arg("bytes"));
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

  kf_python::bind_policies(m);

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
      .def_property_readonly(
          "transport_stats",
          [](kf::Session& s) {
            const kf::TransportStats t = s.peer().transport_stats();
            py::dict d;
            d["tcp_bytes"] = t.tcp_bytes;
            d["socket_bytes"] = t.socket_bytes;
            d["single_copy_bytes"] = t.single_copy_bytes;
            d["shared_read_bytes"] = t.shared_read_bytes;
            d["shm_bytes"] = t.shm_bytes;
            d["early_bytes"] = t.early_bytes;
            return d;
          },
          "Bytes this worker moved by each path since it started (kf::TransportStats)")
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
