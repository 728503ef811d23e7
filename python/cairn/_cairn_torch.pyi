# Internal: cairn.save / cairn.load's per-tensor work for torch tensors, in
# C++ against the LibTorch the interpreter's torch runs on (python/_cairn_torch.cc).
# Present only where it was built for that torch; see cairn._tensors._torch_helpers.
from typing import Any

torch_version: str

def describe(flat: dict[str, Any]) -> list[tuple[str, str, tuple[int, ...], int, int] | None]: ...
def views(
    data: Any, described: list[tuple[str, str, tuple[int, ...], int, int]]
) -> dict[str, Any] | None: ...

# Hugging Face's layout through the LibTorch adapter (present where the
# adapter was built); used by cairn.torch.save_pretrained / load_pretrained.
def save_pretrained(
    uri: str,
    flat: dict[str, Any],
    max_shard_size: int,
    weights_name: str,
    metadata: dict[str, str],
    files: dict[str, bytes],
    user_metadata: str | None,
) -> list[str]: ...
def load_pretrained(
    uri: str, flat: dict[str, Any], strict: bool, weights_name: str
) -> tuple[list[str], list[str]]: ...
