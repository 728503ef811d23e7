"""Hugging Face: cairn.torch.save_pretrained / load_pretrained against
transformers' save_pretrained / from_pretrained and DCP's
HuggingFaceStorageWriter (tiny models built from configs, no hub), the bad
folders they must refuse, and the transformers Trainer reporting to
cairn.train (hf_train.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import cairn  # noqa: E402
import cairn.torch as ct  # noqa: E402

if not hasattr(cairn._tensors._torch_helpers() or object(), "save_pretrained"):
    pytest.skip("cairn._cairn_torch without the LibTorch adapter", allow_module_level=True)


def gpt2(seed: int) -> transformers.GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=2,
        vocab_size=100,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel(config)


def llama(seed: int) -> transformers.LlamaForCausalLM:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        tie_word_embeddings=False,
    )
    return transformers.LlamaForCausalLM(config)


def assert_same(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k


def assert_differs(a: torch.nn.Module, b: torch.nn.Module) -> None:
    assert not all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values())
    )


@pytest.mark.parametrize("shard", [None, "20KB"])
def test_cairn_save_loads_with_from_pretrained(tmp_path: Path, shard) -> None:
    model = gpt2(0)
    dest = tmp_path / "gpt2"
    files = ct.save_pretrained(model, dest, **({} if shard is None else {"max_shard_size": shard}))
    if shard is None:
        assert files[0] == "model.safetensors"
    else:
        assert len([f for f in files if f.startswith("model-0")]) > 2
        assert "model.safetensors.index.json" in files
    assert "config.json" in files
    checkpoint = cairn.Checkpoint(str(dest))
    assert checkpoint.is_committed() and checkpoint.verify() == []
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(dest))
    assert_same(model, loaded)
    # And back through Cairn, checked against the manifest.
    other = gpt2(1)
    assert ct.load_pretrained(dest, other) == ([], [])
    assert_same(model, other)
    with pytest.raises(cairn.AlreadyExistsError):
        ct.save_pretrained(model, dest)


@pytest.mark.parametrize("shard", ["5GB", "30KB"])
def test_cairn_loads_transformers_save_pretrained(tmp_path: Path, shard: str) -> None:
    for make in (llama, gpt2):  # gpt2: transformers leaves the tied lm_head out
        model = make(0)
        dest = tmp_path / make.__name__
        model.save_pretrained(str(dest), max_shard_size=shard)
        sharded = (dest / "model.safetensors.index.json").exists()
        assert sharded == (shard != "5GB")
        other = make(1)
        assert_differs(model, other)
        result = ct.load_pretrained(dest, other)
        assert result.unexpected_keys == []
        assert_same(model, other)


def test_cairn_loads_dcp_huggingface_storage_writer(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter

    model = llama(0)
    state = model.state_dict()
    mapping = {name: 1 + i % 3 for i, name in enumerate(state)}
    dcp.save(
        state, storage_writer=HuggingFaceStorageWriter(str(tmp_path), fqn_to_index_mapping=mapping)
    )
    assert (tmp_path / "model-00003-of-00003.safetensors").exists()
    other = llama(1)
    assert ct.load_pretrained(tmp_path, other) == ([], [])
    assert_same(model, other)


def test_s3(tmp_path: Path, s3_through_python: str) -> None:
    model = llama(0)
    uri = s3_through_python + "/llama"
    ct.save_pretrained(model, uri, max_shard_size="40KB")
    assert cairn.Checkpoint(uri).verify() == []
    local = cairn.Checkpoint(uri).to_directory(str(tmp_path / "copy"))
    assert_same(model, transformers.AutoModelForCausalLM.from_pretrained(local))
    other = llama(1)
    ct.load_pretrained(uri, other)
    assert_same(model, other)


def test_bad_folders_name_the_file_and_tensor(tmp_path: Path) -> None:
    model = llama(0)
    dest = tmp_path / "m"
    ct.save_pretrained(model, dest, max_shard_size="30KB")
    index = json.loads((dest / "model.safetensors.index.json").read_text())
    shard, tensors = "model-00002-of-", []
    for name, file in index["weight_map"].items():
        if file.startswith(shard):
            shard = file
            tensors.append(name)
    other = llama(1)
    before = {k: v.clone() for k, v in other.state_dict().items()}

    def unchanged() -> None:
        for k, v in other.state_dict().items():
            assert torch.equal(v, before[k]), k

    # A tensor whose shape differs from the model's.
    small = llama(1)
    small.model.embed_tokens = torch.nn.Embedding(64, 32)
    with pytest.raises(cairn.InvalidArgumentError, match=r"model\.embed_tokens\.weight.*model-0"):
        ct.load_pretrained(dest, small)

    # A checksum that fails: one flipped byte in the last tensor of a shard.
    path = dest / shard
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(cairn.CorruptionError, match=rf"{shard}.*tensor .*"):
        ct.load_pretrained(dest, other)
    unchanged()
    problems = cairn.Checkpoint(str(dest)).verify()
    assert [p.path for p in problems] == [shard]

    # A shard the index names, missing (a folder transformers wrote: no manifest).
    plain = tmp_path / "plain"
    model.save_pretrained(str(plain), max_shard_size="30KB")
    (plain / shard).unlink()
    with pytest.raises(
        cairn.CorruptionError, match=rf"index\.json: names shard {shard} \(tensors .*{tensors[0]}"
    ):
        ct.load_pretrained(plain, other)
    unchanged()

    with pytest.raises(cairn.InvalidArgumentError, match="memory://"):
        ct.save_pretrained(model, "memory://bucket/m")
    with pytest.raises(TypeError, match="model"):
        ct.save_pretrained(42, tmp_path / "x")
    with pytest.raises(cairn.InvalidArgumentError, match="max_shard_size"):
        ct.save_pretrained(model, tmp_path / "y", max_shard_size="lots")


def test_trainer_reports_and_resumes(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("hf_train.py")), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["steps"] == [2, 4]  # one report per save of the Trainer
    assert got["resumed_steps"] == [4]  # resumed at step 2, went on to 4
    assert got["has_loss"]
    # Rank 0's files and rank 1's own random state, in one checkpoint.
    for f in [
        "model.safetensors",
        "optimizer.pt",
        "trainer_state.json",
        "rng_state_0.pth",
        "rng_state_1.pth",
    ]:
        assert f in got["files"]
    assert got["same_weights"]  # the resumed run ends where the whole run did
