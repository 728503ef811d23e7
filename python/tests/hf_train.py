"""Driver of test_huggingface.py's Trainer test: the transformers Trainer in
two cairn.train.torch.TorchTrainer workers (gloo, CPU) with
RayTrainReportCallback, then a run resumed from a reported checkpoint.

    python hf_train.py STORAGE   prints one JSON line: what the test checks
"""

from __future__ import annotations

import json
import os
import sys

import transformers
from cairn import train
from cairn.train import RunConfig, ScalingConfig
from cairn.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer
from cairn.train.torch import TorchTrainer

import torch

STORAGE = sys.argv[1]


class Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> dict:
        ids = torch.tensor([(i * 7 + j * 3) % 50 for j in range(8)])
        return {"input_ids": ids, "labels": ids}


def loop(config: dict) -> None:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=1,
        n_embd=32,
        n_head=2,
        vocab_size=50,
        n_positions=16,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(cfg)
    args = transformers.TrainingArguments(
        output_dir=config["out"],
        max_steps=4,
        save_steps=2,
        save_strategy="steps",
        logging_steps=1,
        per_device_train_batch_size=2,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
    )
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=Tokens(), callbacks=[RayTrainReportCallback()]
    )
    trainer = prepare_trainer(trainer)
    ckpt = train.get_checkpoint()
    if ckpt is None:
        trainer.train()
    else:
        with ckpt.as_directory() as d:
            trainer.train(resume_from_checkpoint=os.path.join(d, "checkpoint"))


def fit(name: str, resume=None):
    return TorchTrainer(
        loop,
        train_loop_config={"out": os.path.join(STORAGE, name + "-out")},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name=name, storage_path=STORAGE),
        resume_from_checkpoint=resume,
    ).fit()


def weights(checkpoint) -> dict:
    from safetensors.torch import load_file

    with checkpoint.as_directory() as d:
        return load_file(os.path.join(d, "checkpoint", "model.safetensors"))


first = fit("first")
assert first.error is None, first.error
history = first.metrics_history
at_2 = [c for c, m in first.best_checkpoints if m.get("step") == 2]
with first.checkpoint.as_directory() as d:
    files = sorted(os.listdir(os.path.join(d, "checkpoint")))
second = fit("second", resume=at_2[0])
assert second.error is None, second.error
w1, w2 = weights(first.checkpoint), weights(second.checkpoint)
print(
    json.dumps(
        {
            "steps": [m.get("step") for m in history],
            "resumed_steps": [m.get("step") for m in second.metrics_history],
            "files": files,
            "has_loss": all("loss" in m or "train_loss" in m for m in history),
            "same_weights": sorted(w1) == sorted(w2)
            and all(torch.allclose(w1[k], w2[k], atol=1e-6) for k in w1),
        }
    ),
    flush=True,
)
