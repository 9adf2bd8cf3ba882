// SPDX-License-Identifier: Apache-2.0
// The worker of the elastic tests: deterministic linear regression on fixed synthetic data with a
// kf::Session, started by `kfrun --watch` (or by a test acting as the agent). It checks the
// elastic guarantees itself and fails loudly (exit 3) when one breaks:
//   - every sample of each epoch is used exactly once: a per-sample use counter is part of the
//     state and travels in the gradient allreduce, so it follows commits, rollbacks and syncs
//     exactly as the model does; at each epoch end every counter must equal the epoch count;
//   - the step counter never goes back past the last commit this worker saw;
//   - at the end, all workers hold bitwise-identical parameters (a consensus collective).
// With --mode (sync-sgd, sma:period=P, pair-avg, async-ps) the worker trains in that mode when the
// cluster settings have none: in the averaging modes it steps on its own gradient (the counters
// still travel in the allreduce) and averages the models as the mode says (or, in async-ps, pushes
// its update to the parameter server and takes the server's parameters); at the end it averages
// them once more, so that the final check can ask for identical parameters.
// With --boundaries on-change (pair-avg, async-ps; sma: at its averagings) steps end at a boundary
// only when something changes, and
// the data follows another plan: after each boundary the samples of the epoch not yet used are cut
// into one piece per worker, each trains through its own at its own pace and asks for a boundary
// when it is through; at each boundary the workers add up what each used since the last plan (an
// allreduce right after the boundary, which every worker passes together), and after a change they
// go on from the state they all took (one worker's, with what that worker used): the samples the
// others used since the last plan are used again, so each sample still counts once in the state.
// The epoch ends at the boundary after which no sample is left.
// With --sample-us each step also waits in proportion to this worker's share of the batch, a
// stand-in for an accelerator's compute that takes no core (kf-replay's throughput figures);
// --slow-rank makes the worker started as that rank wait 3x as long (a straggler), from
// --slow-from's step until --slow-until's.
// With --device cuda the gradient is allreduced on the GPU (NCCL, or staging by
// KF_DEVICE_BACKEND); with --device standin, through the staging backend with host memory
// standing in for the device.
// Output (stdout, one line each): "joined v<V> rank <r> size <n> step <s>", "change <json>" for
// each membership change, "left step <s>", and at the end "final step=<s> workers=<n>
// hash=<hex> check_us=<mean per-step boundary cost without change>".
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "device/device_api.hpp"
#include "kf/common/env.hpp"
#include "kf/common/error.hpp"
#include "kf/peer.hpp"
#include "kf/policies/builtin.hpp"
#include "kf/policies/policy.hpp"
#include "kf/runtime/elastic_sampler.hpp"
#include "kf/runtime/job_file.hpp"
#include "kf/runtime/pair_averaging.hpp"
#include "kf/runtime/parameter_server.hpp"
#include "kf/runtime/piece_sampler.hpp"
#include "kf/runtime/policy_runner.hpp"
#include "kf/runtime/session.hpp"
#include "kf/runtime/state.hpp"
#include "kf/runtime/training_mode.hpp"

namespace {

std::uint64_t fnv1a(const void* data, std::size_t n, std::uint64_t h = 1469598103934665603ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

nlohmann::json to_json(const kf::ChangeRecord& r) {
  return {{"kind", r.kind},
          {"from_version", r.from_version},
          {"to_version", r.to_version},
          {"from_size", r.from_size},
          {"to_size", r.to_size},
          {"commit", r.commit},
          {"detected_us", r.detected_us},
          {"boundary_us", r.boundary_us},
          {"agreed_us", r.agreed_us},
          {"switch_us", r.switch_us},
          {"connected_us", r.connected_us},
          {"synced_us", r.synced_us},
          {"resumed_us", r.resumed_us},
          {"sync_bytes", r.sync_bytes},
          {"detail", r.detail}};
}

// Test policies: one that grows the job and changes the batch size in one proposal at a given
// step, one that throws at a given step.
class GrowPolicy : public kf::Policy {
 public:
  GrowPolicy(std::int64_t at, int to, std::int64_t batch) : at_(at), to_(to), batch_(batch) {}
  std::string name() const override { return "test-grow"; }
  void after_step(kf::PolicyContext& ctx) override {
    if (ctx.step() < at_ || ctx.workers() >= to_) return;
    ctx.resize(to_, "step " + std::to_string(ctx.step()));
    if (batch_ > 0) ctx.set_batch_size(batch_, "with the resize");
    if (!ctx.has_metric("loss")) throw std::logic_error("the loss metric did not arrive");
  }

 private:
  std::int64_t at_;
  int to_;
  std::int64_t batch_;
};

class ThrowingPolicy : public kf::Policy {
 public:
  explicit ThrowingPolicy(std::int64_t at) : at_(at) {}
  std::string name() const override { return "test-thrower"; }
  void after_step(kf::PolicyContext& ctx) override {
    if (ctx.step() >= at_)
      throw std::runtime_error("thrown on purpose at step " + std::to_string(ctx.step()));
  }

 private:
  std::int64_t at_;
};

[[noreturn]] void broken(const std::string& what) {
  std::cout << "BROKEN " << what << std::endl;
  std::cerr << "elastic-worker: guarantee broken: " << what << std::endl;
  std::exit(3);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"elastic test worker: linear regression with kf::Session", "elastic-worker"};
  int samples = 2048, dim = 16, batch = 64, epochs = 3;
  std::size_t extra_floats = 0;
  double lr = 0.05;
  std::string mode_text;
  std::string fail_start_once, progress_file;
  app.add_option("--samples", samples)->check(CLI::Range(1, 1 << 22));
  app.add_option("--dim", dim)->check(CLI::Range(1, 4096));
  app.add_option("--batch", batch, "global batch size")->check(CLI::Range(1, 1 << 20));
  app.add_option("--epochs", epochs, "unless the cluster settings say \"epochs\"")
      ->check(CLI::Range(1, 100000));
  app.add_option("--lr", lr);
  app.add_option("--mode", mode_text,
                 "training mode when the cluster settings have none: sync-sgd, sma:period=P, "
                 "pair-avg, async-ps[:max_staleness=S,soft_sync=C]");
  app.add_option("--extra-floats", extra_floats, "extra float32 state (synced to joiners)");
  app.add_option("--fail-start-once", fail_start_once,
                 "if this file exists: remove it and exit 1 before joining (a failed start)");
  int bench_check = 0;
  std::int64_t grow_at = -1, grow_batch = 0, throw_at = -1;
  int grow_to = 0;
  std::string policy_record, job_path;
  app.add_option("--job", job_path, "a job file whose policies (and plugins) this worker runs");
  app.add_option("--policy-grow-at", grow_at, "test policy: at this step grow to --policy-grow-to");
  app.add_option("--policy-grow-to", grow_to);
  app.add_option("--policy-batch", grow_batch, "test policy: with the growth, this global batch");
  app.add_option("--policy-throw-at", throw_at, "test policy that throws at this step");
  app.add_option("--policy-record", policy_record,
                 "record the policy runs (JSON lines) to this path + \"-PORT.jsonl\"");
  app.add_option("--bench-check", bench_check,
                 "measure the boundary's cost: N steps of one 4-byte allreduce without and N "
                 "with Session::step, alternating in blocks; prints 'bench_check ...' and exits");
  std::string boundaries;
  app.add_option("--boundaries", boundaries,
                 "settings \"boundaries\" when the cluster has none: every-step or on-change "
                 "(pair-avg: a boundary only when something changes, each worker through its own "
                 "piece of the epoch)")
      ->check(CLI::IsMember({"every-step", "on-change"}));
  bool balance = false;
  app.add_flag("--balance", balance,
               "settings \"balance\" when the cluster has none: batch parts by measured speed "
               "(each step reports its samples and compute time)");
  bool print_gns = false;
  app.add_flag("--gns", print_gns,
               "report the gradient norms to the session's monitors and print, per step, "
               "'gns step=S sqr=.. tr_sigma=.. b_simple=..' (every value to 17 digits)");
  app.add_option("--progress-file", progress_file,
                 "rank 0 writes the committed step count here after each step");
  int sample_us = 0;
  app.add_option("--sample-us", sample_us,
                 "each step also waits this many microseconds per sample of this worker's share "
                 "of the batch, as an accelerator's compute would: a wait that takes no core, so "
                 "that the job's rate grows with its workers even where they share the cores")
      ->check(CLI::Range(0, 1000000));
  int slow_rank = -1;
  app.add_option("--slow-rank", slow_rank,
                 "the worker kfrun started as this rank (KF_RANK) among the job's first workers "
                 "(not a spare, nor one that joins later) waits 3x as long per sample "
                 "(--sample-us): a straggler, whatever its rank later")
      ->check(CLI::Range(0, 1 << 20));
  std::int64_t slow_from = 0;
  app.add_option("--slow-from", slow_from, "--slow-rank's worker is slow from this step on")
      ->check(CLI::Range(std::int64_t{0}, std::numeric_limits<std::int64_t>::max()));
  std::int64_t slow_until = std::numeric_limits<std::int64_t>::max();
  app.add_option("--slow-until", slow_until,
                 "--slow-rank's worker is slow only before this step, and recovers after it")
      ->check(CLI::Range(std::int64_t{0}, std::numeric_limits<std::int64_t>::max()));
  std::string device = "cpu";
  app.add_option("--device", device,
                 "where the gradient is allreduced: cpu, cuda, or standin (host memory standing "
                 "in for a device)")
      ->check(CLI::IsMember({"cpu", "cuda", "standin"}));
  CLI11_PARSE(app, argc, argv);
  // The rank kfrun started this worker as, when it is one of the job's first workers: what
  // --slow-rank names (a hot spare, or a worker placed later, is never slowed).
  const char* kf_rank = std::getenv("KF_RANK");
  int started_as = kf_rank != nullptr ? std::atoi(kf_rank) : -1;

  std::shared_ptr<kf::detail::DeviceApi> dev;
  if (device == "standin") {
    dev = kf::detail::standin_device_api();
    kf::detail::set_device_api_for_tests(dev);
  } else if (device == "cuda") {
    std::string why;
    dev = kf::detail::cuda_device_api(why);
    if (!dev) {
      std::cerr << "elastic-worker: --device cuda: " << why << "\n";
      return 1;
    }
    // Several workers on one GPU: NCCL takes them for separate hosts.
    if (auto self = kf::env::get(kf::env::kSelf)) setenv("NCCL_HOSTID", ("kf-" + *self).c_str(), 0);
  }

  if (!fail_start_once.empty() && std::filesystem::remove(fail_start_once)) {
    std::cerr << "elastic-worker: failing at start as asked (" << fail_start_once << ")\n";
    return 1;
  }

  // Fixed synthetic data, the same in every process: y = w* . x + noise.
  std::mt19937_64 gen(42);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<double> x(static_cast<std::size_t>(samples) * dim), y(samples), wstar(dim);
  for (auto& v : wstar) v = nd(gen);
  for (int i = 0; i < samples; ++i) {
    double dot = 0;
    for (int d = 0; d < dim; ++d) {
      x[i * dim + d] = nd(gen);
      dot += x[i * dim + d] * wstar[d];
    }
    y[i] = dot + 0.01 * nd(gen);
  }

  kf::State state;
  std::vector<double> w(dim, 0.0);
  std::vector<double> uses(samples, 0.0);  // per-sample use count over all epochs
  std::vector<float> extra(extra_floats, 0.5f);
  state.add("w", kf::buffer(w.data(), w.size()));
  state.add("uses", kf::buffer(uses.data(), uses.size()));
  if (extra_floats > 0) state.add("extra", kf::buffer(extra.data(), extra.size()));
  std::int64_t& step = state.counter("step");
  std::int64_t& epoch = state.counter("epoch");
  std::int64_t& position = state.counter("position");
  // Boundaries on change: each worker's pieces of the epoch (kf::PieceSampler), and the uses at
  // the last plan, from which the next boundary adds up what each worker used since.
  kf::PieceSampler pieces(static_cast<std::size_t>(samples), /*seed=*/7, state);
  std::vector<double> base(samples, 0.0);
  state.add("base", kf::buffer(base.data(), base.size()));

  std::unique_ptr<kf::Session> session;
  kf::PolicyRunner policies;
  if (grow_at >= 0) policies.add(std::make_unique<GrowPolicy>(grow_at, grow_to, grow_batch));
  if (throw_at >= 0) policies.add(std::make_unique<ThrowingPolicy>(throw_at));
  int loss_slot = -1;
  try {
    if (!job_path.empty()) {
      const kf::JobFile job = kf::load_job_file(job_path);
      kf::PolicyRegistry registry;
      kf::register_builtin_policies(registry);
      for (const auto& plugin : job.plugins) registry.load_plugin(plugin);
      for (const auto& spec : job.policies) policies.add(registry.make(spec.name, spec.params));
    }
    if (!policy_record.empty()) {
      const char* self = std::getenv("KF_SELF");
      const std::string who =
          self ? std::string(self).substr(std::string(self).rfind(':') + 1) : "0";
      policies.record_to(policy_record + "-" + who + ".jsonl");
    }
    nlohmann::json defaults = nlohmann::json::object();
    if (!mode_text.empty()) defaults["mode"] = kf::parse_mode(mode_text).str();
    if (balance) defaults["balance"] = true;
    if (!boundaries.empty()) defaults["boundaries"] = boundaries;
    session = kf::Session::from_environment(state, defaults);
    // Without test policies or --job, the session keeps those of KF_JOB_FILE (kfrun --job).
    if (!policies.empty()) session->set_policies(&policies);
    loss_slot = session->add_metric("loss");
    if (!session->join()) {
      std::cout << "removed before joining" << std::endl;
      return 0;
    }
    // A worker that joins a job already training is a spare or a later one: never --slow-rank's.
    if (step != 0) started_as = -1;
  } catch (const std::exception& e) {
    std::cerr << "elastic-worker: " << e.what() << "\n";
    return 1;
  }
  std::cout << "joined v" << session->version() << " rank " << session->rank() << " size "
            << session->size() << " step " << step << std::endl;

  if (bench_check > 0) {
    // Alternate blocks of plain steps and session steps so that machine drift hits both.
    float v = 1.f;
    double plain_us = 0, session_us = 0;
    const int block = 100;
    using Clock = std::chrono::steady_clock;
    for (int done = 0; done < bench_check; done += block) {
      auto t0 = Clock::now();
      for (int i = 0; i < block; ++i) {
        session->peer().allreduce("b", kf::buffer(&v, 1), kf::buffer(&v, 1)).wait();
      }
      auto t1 = Clock::now();
      for (int i = 0; i < block; ++i) {
        session->step(
            [&] { session->peer().allreduce("b", kf::buffer(&v, 1), kf::buffer(&v, 1)).wait(); });
      }
      auto t2 = Clock::now();
      plain_us += std::chrono::duration<double, std::micro>(t1 - t0).count();
      session_us += std::chrono::duration<double, std::micro>(t2 - t1).count();
    }
    const int n = (bench_check + block - 1) / block * block;
    std::cout << "bench_check workers=" << session->size() << " steps=" << n
              << " plain_step_us=" << plain_us / n << " session_step_us=" << session_us / n
              << " boundary_us=" << (session_us - plain_us) / n << std::endl;
    session->finish();
    return 0;
  }

  kf::ElasticSampler sampler(static_cast<std::size_t>(samples), /*seed=*/7);
  std::int64_t last_committed = step;
  std::size_t changes_printed = 0;
  double check_sum = 0;
  std::int64_t check_n = 0;
  std::int64_t plans = 0;  // --boundaries on-change: plans cut (boundaries and changes passed)
  auto print_changes = [&] {
    for (; changes_printed < session->changes().size(); ++changes_printed) {
      std::cout << "change " << to_json(session->changes()[changes_printed]).dump() << std::endl;
    }
  };
  print_changes();

  std::vector<double> buf(static_cast<std::size_t>(dim) + 1 + samples);
  // --device: the gradient's copy on the device, and the stream its work runs on.
  void* dev_buf = dev ? dev->alloc_device(buf.size() * sizeof(double)) : nullptr;
  void* dev_stream = dev ? dev->create_stream() : nullptr;
  auto allreduce_gradient = [&] {
    if (!dev) {
      session->peer()
          .allreduce("grad", kf::buffer(buf.data(), buf.size()), kf::buffer(buf.data(), buf.size()))
          .wait();
      return;
    }
    const std::size_t bytes = buf.size() * sizeof(double);
    dev->copy(dev_buf, buf.data(), bytes, dev_stream);
    kf::CollOptions o;
    o.stream = dev_stream;
    const kf::Buffer d{dev_buf, buf.size(), kf::DType::f64, kf::Device::cuda};
    const kf::Handle h = session->peer().allreduce("grad", d, d, o);
    h.order_on(dev_stream);
    dev->copy(buf.data(), dev_buf, bytes, dev_stream);
    dev->synchronize(dev_stream);
    h.wait();
  };
  // The averaging modes: each worker's own gradient, the mean of the models, a pair exchange.
  std::vector<double> local_grad;
  std::unique_ptr<kf::PairAverager> pair;
  std::uint64_t pair_seed = 0;
  std::unique_ptr<kf::ParameterServer> server;
  kf::ParameterServer::Options server_options;
  std::vector<double> w_start;
  auto average_w = [&] {
    kf::CollOptions o;
    o.op = kf::ReduceOp::avg;
    session->peer()
        .allreduce("model", kf::buffer(w.data(), w.size()), kf::buffer(w.data(), w.size()), o)
        .wait();
  };
  try {
    // The job's length may be changed while it runs (settings "epochs" on the config service):
    // every worker reads it from the same cluster version at the same step.
    std::string last_setting;
    std::vector<double> used(samples);
    // Right after a boundary (every worker is there): the pieces' next plan, and the uses added
    // up, which must agree with it. Returns false when this worker left (removed in the
    // recovery of a failed allreduce).
    std::function<bool()> settle = [&]() -> bool {
      if (const auto out = pieces.settle(*session)) {
        if (*out == kf::Session::Outcome::left) return false;
        print_changes();
        return settle();  // from the state every worker took in the recovery
      }
      if (pieces.last_settle() == kf::PieceSampler::Settled::kept) return true;
      if (pieces.last_settle() == kf::PieceSampler::Settled::after_boundary) {
        for (int i = 0; i < samples; ++i) used[i] = uses[i] - base[i];
        try {
          session->peer()
              .allreduce("plan/uses", kf::buffer(used.data(), used.size()),
                         kf::buffer(used.data(), used.size()))
              .wait();
        } catch (const kf::Error& e) {
          if (session->recover(e) == kf::Session::Outcome::left) return false;
          print_changes();
          return settle();
        }
        for (int i = 0; i < samples; ++i) uses[i] = base[i] + used[i];
      }
      // Every sample counts once in each epoch the pieces finished, and the ones they count as
      // used in this epoch once more.
      epoch = pieces.epoch();
      std::size_t now_used = 0;
      for (int i = 0; i < samples; ++i) {
        if (uses[i] != static_cast<double>(epoch) && uses[i] != static_cast<double>(epoch + 1)) {
          broken("sample " + std::to_string(i) + " used " + std::to_string(uses[i]) +
                 " times in epoch " + std::to_string(epoch));
        }
        now_used += uses[i] == static_cast<double>(epoch + 1);
      }
      if (now_used != pieces.used_at_plan()) {
        broken(std::to_string(now_used) + " samples used in epoch " + std::to_string(epoch) +
               ", the pieces count " + std::to_string(pieces.used_at_plan()));
      }
      ++plans;
      base = uses;
      return true;
    };
    for (;;) {
      if (session->boundaries_on_change() && !settle()) {
        std::cout << "left step " << step << std::endl;
        return 0;
      }
      if (epoch >= session->settings().value("epochs", static_cast<std::int64_t>(epochs)) ||
          session->stop_requested()) {
        break;
      }
      // The global batch follows the policies (settings "batch_size"), at the same step on all.
      const int gbatch = session->settings().value("batch_size", batch);
      const std::string setting =
          "workers=" + std::to_string(session->size()) + " batch=" + std::to_string(gbatch);
      if (setting != last_setting) {
        std::cout << "setting step=" << step << " " << setting << " version=" << session->version()
                  << std::endl;
        last_setting = setting;
      }
      const bool on_change = session->boundaries_on_change();
      std::vector<std::size_t> mine;
      if (on_change) {
        mine = pieces.take(*session,
                           std::max<std::size_t>(1, static_cast<std::size_t>(gbatch) /
                                                        static_cast<std::size_t>(session->size())));
      } else {
        sampler.start_epoch(epoch, static_cast<std::size_t>(position));
        const auto [first, count] =
            session->batch_part(sampler.step_samples(static_cast<std::size_t>(gbatch)));
        mine = sampler.range(first, count);
      }
      const auto outcome = session->step([&] {
        const auto compute_from = std::chrono::steady_clock::now();
        std::fill(buf.begin(), buf.end(), 0.0);
        double loss = 0;
        for (std::size_t i : mine) {
          double err = -y[i];
          for (int d = 0; d < dim; ++d) err += w[d] * x[i * dim + d];
          for (int d = 0; d < dim; ++d) buf[d] += err * x[i * dim + d];
          loss += err * err;
          buf[dim + 1 + i] += 1.0;
        }
        buf[dim] = loss;
        if (sample_us > 0) {
          const std::int64_t factor =
              started_as == slow_rank && step >= slow_from && step < slow_until ? 3 : 1;
          std::this_thread::sleep_for(
              std::chrono::microseconds(factor * static_cast<std::int64_t>(sample_us) *
                                        static_cast<std::int64_t>(mine.size())));
        }
        session->set_metric(loss_slot, loss);
        // What balanced batches and the straggler scores measure.
        session->report_samples(static_cast<double>(mine.size()));
        session->report_compute(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - compute_from).count());
        // |g|² of this worker's mean gradient, before the allreduce.
        double local_sq = 0;
        const double local_n = static_cast<double>(mine.size());
        for (int d = 0; d < dim && !mine.empty(); ++d) {
          local_sq += (buf[d] / local_n) * (buf[d] / local_n);
        }
        const kf::ModePlan plan = kf::plan_step(session->mode(), session->steps());
        if (!plan.average_gradients) local_grad.assign(buf.begin(), buf.begin() + dim);
        if (!on_change) allreduce_gradient();  // else: the uses are added up at boundaries
        const double n =
            static_cast<double>(sampler.step_samples(static_cast<std::size_t>(gbatch)));
        if (print_gns && !mine.empty() && !on_change) {
          double global_sq = 0;
          for (int d = 0; d < dim; ++d) global_sq += (buf[d] / n) * (buf[d] / n);
          session->report_gradients(local_sq, global_sq, local_n);
        }
        const double rate = session->settings().value("lr", lr);  // policies may change it
        w_start = w;
        if (plan.average_gradients) {
          for (int d = 0; d < dim; ++d) w[d] -= rate * buf[d] / n;
        } else if (!mine.empty()) {  // this worker's own step, then the mode's averaging
          for (int d = 0; d < dim; ++d) w[d] -= rate * local_grad[d] / local_n;
        }
        if (plan.average_parameters) average_w();
        if (plan.average_with_pair) {
          const std::uint64_t seed = session->mode().seed;
          if (!pair || pair_seed != seed) {
            pair.reset();
            pair = std::make_unique<kf::PairAverager>(session->peer(), "pair", seed);
            pair_seed = seed;
          }
          // The averager takes float32: the change it makes is carried over to the doubles.
          std::vector<float> wf(w.begin(), w.end()), before(wf);
          pair->exchange(wf, session->steps());
          for (int d = 0; d < dim; ++d) w[d] += double(wf[d]) - double(before[d]);
        }
        if (plan.exchange_with_server) {
          const kf::ModeSpec& m = session->mode();
          const kf::ParameterServer::Options o{m.max_staleness, m.soft_sync, m.scale_lr};
          if (!server || o != server_options) {
            server.reset();
            server = std::make_unique<kf::ParameterServer>(*session, "ps", o);
            server_options = o;
          }
          std::vector<float> wf(w.begin(), w.end()), before(wf);
          const std::vector<float> start(w_start.begin(), w_start.end());
          server->step(wf, start, session->steps(),
                       std::max(1.0, static_cast<double>(mine.size())));
          for (int d = 0; d < dim; ++d) w[d] += double(wf[d]) - double(before[d]);
        }
        for (int i = 0; i < samples; ++i) uses[i] += buf[dim + 1 + i];
        ++step;
        if (on_change) return;  // the pieces ask for a boundary when this worker's is through
        sampler.advance(static_cast<std::size_t>(gbatch));
        position = static_cast<std::int64_t>(sampler.position());
        if (sampler.epoch_done()) {
          for (int i = 0; i < samples; ++i) {
            if (uses[i] != static_cast<double>(epoch + 1)) {
              broken("sample " + std::to_string(i) + " used " + std::to_string(uses[i]) +
                     " times after epoch " + std::to_string(epoch));
            }
          }
          ++epoch;
          position = 0;
        }
      });
      print_changes();
      if (print_gns && outcome == kf::Session::Outcome::committed) {
        const auto& m = session->metrics();
        const auto get = [&](const char* k) { return m.count(k) ? m.at(k) : -1.0; };
        std::printf("gns step=%" PRId64 " sqr=%.17g tr_sigma=%.17g b_simple=%.17g\n", step,
                    get("gns.sqr"), get("gns.tr_sigma"), get("gns.b_simple"));
        std::fflush(stdout);
      }
      if (outcome == kf::Session::Outcome::left) {
        std::cout << "left step " << step << std::endl;
        return 0;
      }
      if (step < last_committed) {
        broken("step " + std::to_string(step) + " went back past commit " +
               std::to_string(last_committed));
      }
      last_committed = step;
      if (outcome == kf::Session::Outcome::committed && session->last_check_us() > 0) {
        check_sum += session->last_check_us();
        ++check_n;
      }
      if (!progress_file.empty() && session->rank() == 0) {
        const std::string tmp = progress_file + ".tmp";
        if (FILE* f = std::fopen(tmp.c_str(), "w")) {
          std::fprintf(f, "%" PRId64 "\n", step);
          std::fclose(f);
          std::filesystem::rename(tmp, progress_file);
        }
      }
    }
    if (kf::models_may_diverge(session->mode())) average_w();
    bool same = false;
    session->peer().consensus("final/w", kf::buffer(w.data(), w.size()), &same).wait();
    if (!same) broken("workers hold different parameters at the end");
    session->finish();
  } catch (const std::exception& e) {
    std::cerr << "elastic-worker: " << e.what() << "\n";
    return 1;
  }
  double loss = 0;
  for (int i = 0; i < samples; ++i) {
    double err = -y[i];
    for (int d = 0; d < dim; ++d) err += w[d] * x[i * dim + d];
    loss += err * err;
  }
  char hash[32];
  std::snprintf(hash, sizeof hash, "%016" PRIx64, fnv1a(w.data(), w.size() * sizeof(double)));
  for (const auto& d : policies.disabled()) std::cout << "policy disabled: " << d << std::endl;
  // A write that failed while no agent read this worker's output (its agent was killed and a new
  // one adopted it) left the stream failed; the new agent reads it again.
  std::cout.clear();
  std::cout << "final step=" << step << " workers=" << session->size() << " hash=" << hash
            << " loss=" << loss / samples
            << " check_us=" << (check_n > 0 ? check_sum / static_cast<double>(check_n) : 0.0)
            << " plans=" << plans << std::endl;
  return 0;
}
