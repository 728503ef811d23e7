"""Train a small PyTorch model, checkpointing every epoch with Cairn, and resume.

A two-layer MLP learns y = sin(3x) + noise with Adam. After every epoch the
model's and the optimizer's state are written with ``cairn.torch.save_state``
(one safetensors file, through ``cairn.save``; the epoch in its metadata) and
registered with a ``cairn.CheckpointManager``, which keeps the 3 best by
validation loss (the latest always). When the experiment already has a
checkpoint the run resumes from the latest one: model weights, Adam's
moments and step, and the epoch.

    python3 demo.py --storage /tmp/ckpt --stop-after-epoch 3   # stops after epoch 3
    python3 demo.py --storage /tmp/ckpt --compare              # resumes at epoch 4, finishes

``--compare`` then trains the same model from scratch without stopping and
checks that the resumed run's final weights are bitwise identical.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import cairn
import cairn.torch

import torch

STATE_FILE = "state.safetensors"


def make_data(seed: int = 0) -> tuple[torch.Tensor, ...]:
    """1,000 training and 200 validation samples of y = sin(3x) + noise."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(1200, 1, generator=g) * 4 - 2
    y = torch.sin(3 * x) + 0.1 * torch.randn(1200, 1, generator=g)
    return x[:1000], y[:1000], x[1000:], y[1000:]


def make_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(1, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def train_epoch(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    epoch: int,
    x: torch.Tensor,
    y: torch.Tensor,
    batch: int = 50,
) -> float:
    """One pass in an order that depends only on the epoch, so a resume repeats it."""
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(1000 + epoch))
    total = 0.0
    for i in range(0, len(x), batch):
        idx = order[i : i + batch]
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
        total += loss.item() * len(idx)
    return total / len(x)


def validate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return torch.nn.functional.mse_loss(model(x), y).item()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage", required=True, help="folder or URI for the experiment")
    parser.add_argument("--experiment", default="mlp")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--num-to-keep", type=int, default=3)
    parser.add_argument(
        "--stop-after-epoch",
        type=int,
        default=None,
        help="stop (exit 0) after this epoch, as a preempted job would",
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help="check the final weights against an uninterrupted run",
    )
    args = parser.parse_args()

    torch.set_num_threads(1)  # small tensors; and the same arithmetic in every run
    x, y, val_x, val_y = make_data()
    model, opt = make_model()
    config = cairn.CheckpointConfig(
        num_to_keep=args.num_to_keep,
        checkpoint_score_attribute="val/loss",
        checkpoint_score_order="min",
    )
    with cairn.CheckpointManager(args.storage, args.experiment, config) as manager:
        start = 1
        latest = manager.latest()
        if latest is not None:
            with latest.checkpoint.as_directory() as d:
                # Model and Adam's state restored bit for bit; the metadata back.
                meta = cairn.torch.load_state(os.path.join(d, STATE_FILE), model, opt)
                start = int(meta["epoch"]) + 1
            print(
                f"resumed from {latest.name} (epoch {start - 1}): "
                f"model, Adam's moments and step restored; continuing at epoch {start}"
            )
        else:
            print(f"no checkpoint in {manager.uri}: training from scratch")

        for epoch in range(start, args.epochs + 1):
            train_loss = train_epoch(model, opt, epoch, x, y)
            val_loss = validate(model, val_x, val_y)
            with tempfile.TemporaryDirectory() as tmp:
                # One safetensors file: model and optimizer state, the epoch.
                cairn.torch.save_state(
                    os.path.join(tmp, STATE_FILE), model, opt, metadata={"epoch": epoch}
                )
                record = manager.register_checkpoint(
                    {"epoch": epoch, "train": {"loss": train_loss}, "val": {"loss": val_loss}},
                    cairn.Checkpoint.from_directory(tmp),
                )
            print(
                f"epoch {epoch}: train loss {train_loss:.4f}, val loss {val_loss:.4f} "
                f"-> {record.name}"
            )
            if epoch == args.stop_after_epoch:
                print(
                    f"stopping after epoch {epoch}, as a preempted job would; "
                    "run the same command again to resume"
                )
                return 0

        print(f"kept (best {args.num_to_keep} by val/loss, the latest always):")
        for r in manager.best():
            val_loss = r.metrics["val"]["loss"]
            print(f"  {r.name}: epoch {r.metrics['epoch']}, val loss {val_loss:.4f}")

    if args.compare:
        ref_model, ref_opt = make_model()
        for epoch in range(1, args.epochs + 1):
            train_epoch(ref_model, ref_opt, epoch, x, y)
        same = all(
            torch.equal(a, b)
            for a, b in zip(model.state_dict().values(), ref_model.state_dict().values())
        )
        if not same:
            print("the resumed run's weights differ from an uninterrupted run's", file=sys.stderr)
            return 1
        print("the resumed run's final weights are bitwise identical to an uninterrupted run's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
