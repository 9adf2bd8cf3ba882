#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Fashion-MNIST with PyTorch on kf: the MLP of the C++ example (examples/fashion_mnist), trained
data-parallel by every worker of a kf job, elastic when started by ``kfrun --watch``, adaptive
when the job file names policies. Start it with kfrun (docs/python.md):

    PYTHONPATH=build/runtime/python kfrun -np 2 -- python3 examples/fashion_mnist.py

The global batch and the learning rate are the cluster's settings ``batch_size`` and ``lr``, so
a policy that changes them changes them on every worker at the same step. The training state
(model, optimizer, epoch and position in it) is a kf.State: committed every step, restored
after a failure and sent to joiners. Rank 0 prints a progress line every --log-every steps, the
test accuracy after each epoch, and at the end the same summary as the C++ example, ending with

    final test accuracy: 0.NNN (workers at end: N, membership changes: N)
"""

import argparse
import gzip
import hashlib
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import kf
import kf.torch

MEAN, STD = 0.2860, 0.3530  # of Fashion-MNIST's training pixels


def read_idx(path, dims):
    """An IDX file (gzip or not) as a uint8 array of `dims` dimensions; ValueError naming the
    file and what is wrong."""
    for name in (path + ".gz", path):
        if os.path.exists(name):
            break
    else:
        raise ValueError("%s.gz: no such file (nor %s)" % (path, path))
    opener = gzip.open if name.endswith(".gz") else open
    with opener(name, "rb") as f:
        data = f.read()
    if len(data) < 4 + 4 * dims:
        raise ValueError("%s: truncated header" % name)
    magic = struct.unpack(">I", data[:4])[0]
    if magic != 0x800 + dims:
        raise ValueError("%s: magic number %#x, expected %#x" % (name, magic, 0x800 + dims))
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims)
    if body.size != int(np.prod(shape)):
        raise ValueError("%s: %d bytes of data, %d expected" % (name, body.size, np.prod(shape)))
    return body.reshape(shape)


def read_split(directory, prefix):
    images = read_idx(os.path.join(directory, prefix + "-images-idx3-ubyte"), 3)
    labels = read_idx(os.path.join(directory, prefix + "-labels-idx1-ubyte"), 1)
    if images.shape[0] != labels.shape[0]:
        raise ValueError("%s: %d images, %d labels" % (prefix, images.shape[0], labels.shape[0]))
    if images.shape[1:] != (28, 28):
        raise ValueError("%s: images are %dx%d, expected 28x28" % ((prefix,) + images.shape[1:]))
    return torch.from_numpy(images.reshape(-1, 784).copy()), torch.from_numpy(
        labels.astype(np.int64))


def normalized(pixels):
    return (pixels.to(torch.float32) / 255.0 - MEAN) / STD


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(784, 256)
        self.fc2 = torch.nn.Linear(256, 128)
        self.fc3 = torch.nn.Linear(128, 10)

    def forward(self, x):
        x = torch.relu(self.fc1(x.view(-1, 784)))
        return self.fc3(torch.relu(self.fc2(x)))


def parameters_hash(model):
    """Equal on two workers iff they hold the same parameters."""
    h = hashlib.blake2b(digest_size=8)
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def make_optimizer(name, params, lr, momentum):
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=lr)
    return torch.optim.Adagrad(params, lr=lr)


def main():
    ap = argparse.ArgumentParser(description="Fashion-MNIST with PyTorch on kf (start it with "
                                 "kfrun)")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist",
                    help="directory of the IDX files (gzip or not)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64,
                    help="global batch when the cluster settings have none")
    ap.add_argument("--lr", type=float, default=None,
                    help="learning rate when the cluster settings have none (default 0.05 for "
                    "sgd, 0.001 for the others)")
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--optimizer", default="sgd",
                    choices=["sgd", "adam", "adamw", "rmsprop", "adagrad"])
    ap.add_argument("--log-every", type=int, default=50, help="steps between progress lines")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    ap.add_argument("--seed", type=int, default=1, help="initial weights (rank 0's are used)")
    ap.add_argument("--limit", type=int, default=0, help="train on the first N images (0: all)")
    ap.add_argument("--mode", default="sync-sgd",
                    help="training mode when the cluster settings have none "
                    "(docs/training-modes.md)")
    ap.add_argument("--compression", default="none",
                    help="gradient compression when the cluster settings have none")
    ap.add_argument("--trace-samples", default="",
                    help="directory: at the start of each step each worker appends 'step S "
                    "version V epoch E position P i...', the samples it trains on (a step that "
                    "fails is tried again in a newer version: the newest version's lines of a "
                    "step are the ones committed)")
    args = ap.parse_args()
    if args.epochs < 1 or args.batch < 1 or args.log_every < 1 or args.threads < 1:
        ap.error("--epochs, --batch, --log-every and --threads must be at least 1")
    if args.lr is None:
        args.lr = 0.05 if args.optimizer == "sgd" else 0.001

    try:
        train_x, train_y = read_split(args.data, "train")
        test_x, test_y = read_split(args.data, "t10k")
    except ValueError as e:
        print("fashion_mnist.py: %s" % e, file=sys.stderr)
        return 1
    if args.limit > 0:
        train_x, train_y = train_x[:args.limit], train_y[:args.limit]
    train_count = train_x.shape[0]

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = Mlp()
    base_opt = make_optimizer(args.optimizer, model.parameters(), args.lr, args.momentum)

    state = kf.State()
    epoch = state.counter("epoch")
    position = state.counter("position")
    accuracy_ppm = state.counter("test_accuracy_ppm")
    try:
        session = kf.Session(state, defaults={"mode": args.mode,
                                              "compression": args.compression})
        opt = kf.torch.DistributedOptimizer(session, base_opt)
        opt.register_state(state, model)
        loss_slot = session.add_metric("loss")
        acc_slot = session.add_metric("train_accuracy")
        if not session.join():
            return 0
    except (kf.Error, ValueError, TypeError, RuntimeError) as e:
        print("fashion_mnist.py: %s" % e, file=sys.stderr)
        return 1

    trace = None
    if args.trace_samples:
        name = os.environ.get("KF_SELF", "worker").replace(":", "_").replace("/", "_")
        trace = open(os.path.join(args.trace_samples, name + ".txt"), "a")

    sampler = kf.ElasticSampler(train_count, 7)
    t_start = time.monotonic()
    eval_seconds = 0.0
    exposed_seconds = 0.0
    batches = []  # (step, global batch) changes
    changes_seen = 0

    def evaluate():
        nonlocal eval_seconds
        t0 = time.monotonic()
        n = test_x.shape[0]
        lo, hi = n * session.rank // session.size, n * (session.rank + 1) // session.size
        with torch.no_grad():
            right = model(normalized(test_x[lo:hi])).argmax(1).eq(test_y[lo:hi]).sum().item()
        counts = torch.tensor([float(right), float(hi - lo)], dtype=torch.float64)
        session.allreduce(counts, "fmnist.eval")
        eval_seconds += time.monotonic() - t0
        return counts[0].item() / counts[1].item()

    def print_changes():
        nonlocal changes_seen
        changes = session.changes
        for c in changes[changes_seen:]:
            print("membership v%d step %d workers %d params %s" %
                  (c["to_version"], session.steps, session.size, parameters_hash(model)),
                  flush=True)
        changes_seen = len(changes)

    while True:
        settings = session.settings
        if epoch.value >= settings.get("epochs", args.epochs) or session.stop_requested:
            break
        gbatch = int(settings.get("batch_size", args.batch))
        rate = float(settings.get("lr", args.lr))
        if rate != opt.learning_rate:
            opt.learning_rate = rate
        if not batches or batches[-1][1] != gbatch:
            batches.append((session.steps, gbatch))
        sampler.start_epoch(epoch.value, position.value)
        total = sampler.step_samples(gbatch)
        first, count = session.batch_part(total)
        mine = sampler.range(first, count)
        step_epoch, step_position = epoch.value, position.value

        def body():
            nonlocal exposed_seconds
            if trace is not None:
                trace.write("step %d version %d epoch %d position %d %s\n" %
                            (session.steps + 1, session.version, step_epoch, step_position,
                             " ".join(map(str, mine))))
                trace.flush()
            opt.zero_grad()
            opt.begin_step(len(mine), total)
            if mine:
                idx = torch.as_tensor(mine, dtype=torch.long)
                x, y = normalized(train_x[idx]), train_y[idx]
                out = model(x)
                loss = F.cross_entropy(out, y)
                loss.backward()
                session.set_metric(loss_slot, loss.item())
                session.set_metric(acc_slot, out.argmax(1).eq(y).sum().item() / len(mine))
            opt.step()
            exposed_seconds += opt.exposed_comm
            sampler.advance(gbatch)
            position.value = sampler.position
            if sampler.epoch_done:
                accuracy_ppm.value = round(evaluate() * 1e6)
                epoch.value += 1
                position.value = 0
                if session.rank == 0:
                    print("epoch %d test accuracy %.4f (%.1f s)" %
                          (epoch.value, accuracy_ppm.value / 1e6, time.monotonic() - t_start),
                          flush=True)

        outcome = session.step(body)
        if outcome == kf.LEFT:
            return 0
        print_changes()
        if outcome == kf.COMMITTED and session.rank == 0 and session.steps % args.log_every == 0:
            m = session.metrics
            print("epoch %d step %d loss %.4f acc %.3f workers %d batch %d lr %.4g "
                  "samples/s %.0f" % (epoch.value, session.steps, m.get("loss", 0.0),
                                      m.get("train_accuracy", 0.0), session.size, gbatch, rate,
                                      m.get("throughput", 0.0)), flush=True)

    if session.models_may_diverge:
        opt.average_parameters()
        accuracy_ppm.value = round(evaluate() * 1e6)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    same = session.consensus(flat, "fmnist.final")
    if session.rank == 0:
        print("parameters identical on all %d workers: %s" % (session.size,
                                                             "yes" if same else "NO"))
    if not same:
        print("fashion_mnist.py: the workers hold different parameters", file=sys.stderr)
        return 3
    session.finish()
    if session.rank == 0:
        changes = session.changes
        print("membership changes:")
        for c in changes:
            print("  " + c["summary"])
        print("global batch sizes (from step):" +
              "".join(" %d@%d" % (b, s) for s, b in batches))
        resizes = sum(1 for c in changes if c["kind"] in ("resize", "recovery"))
        steps = max(1, session.steps)
        train_time = time.monotonic() - t_start - eval_seconds
        print("steps %d, %.1f s; per step %.3f ms training, %.3f ms exposed allreduce" %
              (session.steps, time.monotonic() - t_start, train_time / steps * 1e3,
               exposed_seconds / steps * 1e3))
        print("mode %s, compression %s: %.0f bytes sent per step by rank 0" %
              (session.mode, session.compression, opt.bytes_sent / steps))
        print("final test accuracy: %.3f (workers at end: %d, membership changes: %d)" %
              (accuracy_ppm.value / 1e6, session.size, resizes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
