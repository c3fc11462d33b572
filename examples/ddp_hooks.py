"""Plain PyTorch DDP with a shoal compressor as its communication hook (docs/ddp-hooks.md).

    .venv/bin/torchrun --standalone --nproc-per-node 2 examples/ddp_hooks.py            # top-k, 10%, error feedback
    .venv/bin/torchrun --standalone --nproc-per-node 2 examples/ddp_hooks.py --method powersgd

Each rank trains a small MLP on its half of scikit-learn's digits (CPU, gloo); rank 0 prints the test
accuracy and how many bytes the hook sent against dense.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import shoal.ddp
from shoal.data import load_dataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--method", default="topk", help="a shoal compressor (topk, dgc, fp16, qsgd, randk, powersgd) "
                        "or none (plain DDP)")
    parser.add_argument("--density", type=float, default=0.1)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--init", default="env://", help="torch.distributed init method (torchrun sets env://)")
    args = parser.parse_args()
    dist.init_process_group("gloo", init_method=args.init, rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    data = load_dataset("digits", seed=0, test_fraction=0.2)
    x, y = data.x_train.flatten(1), data.y_train
    mine = slice(rank * len(y) // world, (rank + 1) * len(y) // world)  # each rank its own shard
    net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    model = DDP(net)
    hook = None if args.method == "none" else shoal.ddp.register(model, method=args.method, density=args.density)

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(args.epochs):
        for i in range(mine.start, mine.stop, 50):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x[i:min(i + 50, mine.stop)]), y[i:min(i + 50, mine.stop)]).backward()
            optimizer.step()

    with torch.no_grad():
        accuracy = (net(data.x_test.flatten(1)).argmax(1) == data.y_test).float().mean().item()
    if rank == 0 and hook is None:
        print(f"no hook: test accuracy {accuracy:.3f}")
    elif rank == 0:  # hook.state_dict() is the hook's state for a checkpoint (load_state_dict restores it)
        print(f"{args.method}: test accuracy {accuracy:.3f}; sent {hook.bytes_sent / 1e6:.2f} MB of "
              f"{hook.bytes_dense / 1e6:.2f} MB dense ({hook.bytes_sent / hook.bytes_dense:.1%})")
    dist.barrier()  # neither rank tears gloo down while the other still talks to it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
