// SPDX-License-Identifier: Apache-2.0
#include "kf-bench/lib/runner.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <span>
#include <stdexcept>
#include <string>

#include "device/device_api.hpp"
#include "kf-bench/lib/parse.hpp"
#include "kf-bench/lib/pattern.hpp"
#include "kf-bench/lib/report.hpp"
#include "kf-bench/lib/slots.hpp"
#include "kf-bench/lib/stats.hpp"
#include "kf/common/error.hpp"
#include "kf/shared_memory.hpp"

namespace kf::tools::bench {

namespace {

using Clock = std::chrono::steady_clock;

// Elements of one iteration's send and receive buffers on this worker. Broadcast works in
// place on the receive buffer.
struct Layout {
  std::size_t send = 0;
  std::size_t recv = 0;
};

Layout layout_of(CollOp op, std::size_t count, int rank, int workers, int root) {
  const auto n = static_cast<std::size_t>(workers);
  switch (op) {
    case CollOp::allreduce: return {count, count};
    case CollOp::broadcast: return {0, count};
    case CollOp::allgather: return {count, n * count};
    case CollOp::reduce_scatter: return {n * count, count};
    case CollOp::gather: return {count, rank == root ? n * count : 0};
    default: return {};
  }
}

// One worker's benchmark state: the options, the value tables, the collective names.
class Bench {
 public:
  Bench(Peer& peer, const BenchOptions& o, std::shared_ptr<detail::DeviceApi> dev)
      : peer_(peer), o_(o), pattern_(o.dtype, o.reduce, peer.size()), dev_(std::move(dev)) {
    if (dev_) stream_ = dev_->create_stream();
  }
  ~Bench() {
    release_device();
    if (dev_) dev_->destroy_stream(stream_);
  }
  Bench(const Bench&) = delete;
  Bench& operator=(const Bench&) = delete;

  Row run_case(Algorithm algorithm, std::size_t bytes);
  Row run_back_to_back(Algorithm algorithm, std::size_t bytes);

 private:
  // Takes the maximum over the workers of each timed sample and whether all were correct,
  // and completes `row` with the median, p90 and bandwidths.
  void finish(Row& row, std::vector<double>& times_us, bool correct);
  // Where host buffers come from: kf::SharedMemory with --memory shared, else (empty) the heap.
  Slots::Allocate allocate() const {
    if (!o_.shared_memory) return {};
    return [](std::size_t bytes) {
      auto m = std::make_shared<SharedMemory>(bytes);
      return std::shared_ptr<std::byte>(m, m->data());
    };
  }
  void prepare(std::byte* send, std::byte* recv, std::uint64_t iter) const;
  bool verify(const std::byte* recv, std::uint64_t iter) const;
  Handle submit(const std::string& name, std::byte* send, std::byte* recv, Algorithm algorithm);
  std::string label(Algorithm algorithm) const;
  // Every call of every worker gets the same sequence of names.
  std::string next_name() { return "kf-bench#" + std::to_string(seq_++); }

  // --device: one device send and receive buffer per case, filled from and read back into the
  // host slots outside the timed region.
  void release_device() {
    if (dev_ && dev_send_) dev_->free_device(dev_send_);
    if (dev_ && dev_recv_) dev_->free_device(dev_recv_);
    dev_send_ = dev_recv_ = nullptr;
  }
  void to_device(const std::byte* send, const std::byte* recv) {
    const std::size_t esz = dtype_bytes(o_.dtype);
    if (layout_.send > 0) dev_->copy(dev_send_, send, layout_.send * esz, stream_);
    if (layout_.recv > 0) dev_->copy(dev_recv_, recv, layout_.recv * esz, stream_);
    dev_->synchronize(stream_);
  }
  void from_device(std::byte* recv) {
    if (layout_.recv > 0) {
      dev_->copy(recv, dev_recv_, layout_.recv * dtype_bytes(o_.dtype), stream_);
    }
    dev_->synchronize(stream_);
  }

  Peer& peer_;
  const BenchOptions& o_;
  Pattern pattern_;
  std::shared_ptr<detail::DeviceApi> dev_;
  void* stream_ = nullptr;
  void* dev_send_ = nullptr;
  void* dev_recv_ = nullptr;
  std::uint64_t seq_ = 0;
  std::size_t count_ = 0;  // the current case's elements per worker
  Layout layout_;          // the current case's buffers
};

void Bench::prepare(std::byte* send, std::byte* recv, std::uint64_t iter) const {
  if (o_.op == CollOp::broadcast) {
    if (peer_.rank() == o_.root) return pattern_.fill(recv, count_, o_.root, 0, iter);
    return pattern_.poison(recv, count_);
  }
  pattern_.fill(send, layout_.send, peer_.rank(), 0, iter);
  pattern_.poison(recv, layout_.recv);
}

bool Bench::verify(const std::byte* recv, std::uint64_t iter) const {
  const std::size_t block_bytes = count_ * dtype_bytes(o_.dtype);
  switch (o_.op) {
    case CollOp::allreduce: return pattern_.matches_reduced(recv, count_, 0, iter);
    case CollOp::broadcast: return pattern_.matches_rank(recv, count_, o_.root, 0, iter);
    case CollOp::reduce_scatter:
      return pattern_.matches_reduced(recv, count_, static_cast<std::size_t>(peer_.rank()) * count_,
                                      iter);
    case CollOp::allgather:
    case CollOp::gather:
      if (layout_.recv == 0) return true;  // gather: not the root
      for (int q = 0; q < peer_.size(); ++q) {
        if (!pattern_.matches_rank(recv + q * block_bytes, count_, q, 0, iter)) return false;
      }
      return true;
    default: return true;
  }
}

Handle Bench::submit(const std::string& name, std::byte* send, std::byte* recv,
                     Algorithm algorithm) {
  CollOptions co;
  co.algorithm = algorithm;
  co.op = o_.reduce;
  co.root = o_.root;
  Buffer s{send, layout_.send, o_.dtype};
  Buffer r{recv, layout_.recv, o_.dtype};
  if (dev_) {
    co.stream = stream_;
    s = Buffer{dev_send_, layout_.send, o_.dtype, Device::cuda};
    r = Buffer{dev_recv_, layout_.recv, o_.dtype, Device::cuda};
    if (o_.op == CollOp::gather && layout_.recv == 0) r.data = nullptr;
  }
  switch (o_.op) {
    case CollOp::allreduce: return peer_.allreduce(name, s, r, co);
    case CollOp::broadcast: return peer_.broadcast(name, r, co);
    case CollOp::allgather: return peer_.allgather(name, s, r, co);
    case CollOp::reduce_scatter: return peer_.reduce_scatter(name, s, r, co);
    case CollOp::gather: return peer_.gather(name, s, r, co);
    default: return peer_.barrier(name, co);
  }
}

std::string Bench::label(Algorithm algorithm) const {
  std::string text(to_string(algorithm));
  if (algorithm != Algorithm::auto_select) return text;
  // The engine resolves an algorithm from the send buffer's bytes (the buffer for broadcast).
  const std::size_t send = o_.op == CollOp::broadcast ? layout_.recv : layout_.send;
  const Algorithm chosen = peer_.resolve(o_.op, algorithm, send * dtype_bytes(o_.dtype));
  return text + "(" + std::string(to_string(chosen)) + ")";
}

Row Bench::run_case(Algorithm algorithm, std::size_t bytes) {
  const std::size_t element_bytes = dtype_bytes(o_.dtype);
  count_ = o_.op == CollOp::barrier ? 0 : element_count(bytes, o_.dtype);
  layout_ = layout_of(o_.op, count_, peer_.rank(), peer_.size(), o_.root);
  Row row;
  row.algo = label(algorithm);
  row.count = count_;
  row.bytes = count_ * element_bytes;
  row.iters = o_.iters.value_or(default_iterations(row.bytes));
  const int total = o_.warmup + row.iters;
  const Slots slots(layout_.send * element_bytes, layout_.recv * element_bytes, total, allocate());
  const std::size_t rotation = slots.count();
  for (std::size_t s = 0; s < rotation && s < static_cast<std::size_t>(total); ++s) {
    prepare(slots.send(s), slots.recv(s), s);
  }
  if (dev_) {
    release_device();
    // One byte more, so that an empty buffer still has an address.
    dev_send_ = dev_->alloc_device(layout_.send * element_bytes + 1);
    dev_recv_ = dev_->alloc_device(layout_.recv * element_bytes + 1);
  }
  std::vector<double> times_us(static_cast<std::size_t>(row.iters));
  bool correct = true;
  for (int t = 0; t < total; ++t) {
    const auto iter = static_cast<std::uint64_t>(t);
    if (dev_) to_device(slots.send(iter), slots.recv(iter));
    peer_.barrier(next_name()).wait();
    // Named before the clock starts, as the Gloo baseline builds its algorithm objects before
    // it: a training loop names its collectives with constant strings, not formatted ones.
    const std::string name = next_name();
    const auto start = Clock::now();
    submit(name, slots.send(iter), slots.recv(iter), algorithm).wait();
    const std::chrono::duration<double, std::micro> elapsed = Clock::now() - start;
    if (dev_) from_device(slots.recv(iter));
    // Warmup results are checked too: a wrong result is a bug whenever it happens.
    correct = verify(slots.recv(iter), iter) && correct;
    if (t >= o_.warmup) times_us[static_cast<std::size_t>(t - o_.warmup)] = elapsed.count();
    if (iter + rotation < static_cast<std::uint64_t>(total)) {
      prepare(slots.send(iter), slots.recv(iter), iter + rotation);
    }
  }
  finish(row, times_us, correct);
  return row;
}

Row Bench::run_back_to_back(Algorithm algorithm, std::size_t bytes) {
  count_ = element_count(bytes, DType::f32);
  layout_ = layout_of(CollOp::allreduce, count_, peer_.rank(), peer_.size(), o_.root);
  Row row;
  row.algo = label(algorithm);
  row.count = count_;
  row.bytes = count_ * sizeof(float);
  row.iters = o_.iters.value_or(default_iterations(row.bytes));
  // One buffer, written by this thread (warm, as a gradient just computed) and reduced in place.
  const std::size_t room = std::max<std::size_t>(count_, 1) * sizeof(float);
  const std::shared_ptr<std::byte> memory =
      o_.shared_memory
          ? allocate()(room)
          : std::shared_ptr<std::byte>(new std::byte[room](), std::default_delete<std::byte[]>());
  const std::span<float> data(reinterpret_cast<float*>(memory.get()), room / sizeof(float));
  const Buffer buf{data.data(), count_, DType::f32};
  CollOptions co;
  co.algorithm = algorithm;
  co.op = ReduceOp::sum;
  // One name for every call, as a training loop names each gradient bucket.
  const std::string name = "kf-bench-b2b";
  std::vector<double> times_us(static_cast<std::size_t>(row.iters));
  bool correct = true;
  for (int t = 0; t < o_.warmup + row.iters; ++t) {
    fill_back_to_back(data.data(), count_, peer_.rank());
    peer_.barrier(next_name()).wait();
    const auto start = Clock::now();
    for (int c = 0; c < o_.calls; ++c) peer_.allreduce(name, buf, buf, co).wait();
    const std::chrono::duration<double, std::micro> elapsed = Clock::now() - start;
    correct = matches_back_to_back(data.data(), count_, peer_.size(), o_.calls) && correct;
    if (t >= o_.warmup)
      times_us[static_cast<std::size_t>(t - o_.warmup)] = elapsed.count() / o_.calls;
  }
  finish(row, times_us, correct);
  return row;
}

void Bench::finish(Row& row, std::vector<double>& times_us, bool correct) {
  CollOptions max_op;
  max_op.op = ReduceOp::max;
  peer_
      .allreduce(next_name(), buffer(times_us.data(), times_us.size()),
                 buffer(times_us.data(), times_us.size()), max_op)
      .wait();
  std::int32_t all_correct = correct ? 1 : 0;
  CollOptions min_op;
  min_op.op = ReduceOp::min;
  peer_.allreduce(next_name(), buffer(&all_correct, 1), buffer(&all_correct, 1), min_op).wait();
  row.correct = all_correct == 1;
  set_statistics(row, times_us, o_.op, peer_.size());
}

}  // namespace

bool run_bench(Peer& peer, const BenchOptions& o, std::ostream& out) {
  const bool rooted = o.op == CollOp::broadcast || o.op == CollOp::gather;
  if (rooted && (o.root < 0 || o.root >= peer.size())) {
    throw std::invalid_argument("--root " + std::to_string(o.root) + " is not a rank of this " +
                                std::to_string(peer.size()) + "-worker job");
  }
  std::shared_ptr<detail::DeviceApi> dev;
  if (o.device == "standin") {
    dev = detail::standin_device_api();
    detail::set_device_api_for_tests(dev);
  } else if (o.device == "cuda") {
    std::string why;
    dev = detail::cuda_device_api(why);
    if (!dev) throw Error(make_error_code(errc::device_error), "--device cuda: " + why);
  }
  if (o.method == Method::back_to_back && (o.op != CollOp::allreduce || o.device != "cpu")) {
    throw std::invalid_argument(
        "--method back-to-back measures allreduce of host memory only (--device cpu)");
  }
  if (o.method == Method::back_to_back && (o.dtype != DType::f32 || o.reduce != ReduceOp::sum)) {
    throw std::invalid_argument("--method back-to-back measures f32 sum allreduce only");
  }
  if (o.method == Method::back_to_back) {
    if (std::string why = check_back_to_back_calls(o.calls, peer.size()); !why.empty()) {
      throw std::invalid_argument(why);
    }
  }
  const RunInfo info{o.op, peer.size(), o.dtype, o.reduce, o.root, o.warmup, o.method, o.calls};
  const bool printer = peer.rank() == 0;
  if (printer && !o.json) print_header(out, info);
  const std::vector<std::size_t> sizes =
      o.op == CollOp::barrier ? std::vector<std::size_t>{0} : o.sizes;
  Bench bench(peer, o, dev);
  bool all_correct = true;
  for (const Algorithm a : o.algorithms) {
    for (const std::size_t bytes : sizes) {
      const Row row = o.method == Method::back_to_back ? bench.run_back_to_back(a, bytes)
                                                       : bench.run_case(a, bytes);
      if (printer) print_row(out, info, row, o.json);
      all_correct = all_correct && row.correct;
    }
  }
  if (printer && !o.json) print_transport(out, peer.transport_stats());
  if (printer && dev && !o.json)
    out << "# device: " << dev->name() << ", backend " << peer.device_backend() << "\n";
  return all_correct;
}

int run_worker(const BenchOptions& o, std::ostream& out, std::ostream& err) noexcept {
  constexpr int kIncorrect = 1;
  constexpr int kUsageError = 2;
  int rank = -1;
  try {
    const auto peer = Peer::from_environment();
    rank = peer->rank();
    return run_bench(*peer, o, out) ? 0 : kIncorrect;
  } catch (const kf::Error& e) {
    err << "kf-bench: rank " << rank << ": " << e.what() << std::endl;
    return kIncorrect;
  } catch (const std::invalid_argument& e) {
    err << "kf-bench: " << e.what() << std::endl;
    return kUsageError;
  } catch (const std::exception& e) {
    err << "kf-bench: rank " << rank << ": " << e.what() << std::endl;
    return kIncorrect;
  }
}

}  // namespace kf::tools::bench
