# SPDX-License-Identifier: Apache-2.0
"""What the training tests and their workers share: the model, the data and the optimizers."""

import torch

ROWS = 32


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(10, 16)
        self.fc2 = torch.nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def make_net(seed):
    torch.manual_seed(seed)
    return Net()


def make_data():
    g = torch.Generator().manual_seed(99)
    return torch.randn(ROWS, 10, generator=g), torch.randint(0, 3, (ROWS,), generator=g)


# Every optimizer kf registers the state of, with the options that give each the most state.
OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "adam": lambda p: torch.optim.Adam(p, lr=0.01),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1, amsgrad=True),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.5, centered=True),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=0.1, lr_decay=0.05),
}


def train_plain(name, steps):
    """Plain PyTorch on the whole batch: the parameters after `steps` steps."""
    torch.set_num_threads(1)
    net = make_net(1)
    opt = OPTIMIZERS[name](net.parameters())
    x, y = make_data()
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in net.parameters()]
