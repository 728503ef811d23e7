# Internal: cairn.save / cairn.load's per-tensor work for torch tensors, in
# C++ against the LibTorch the interpreter's torch runs on (python/_cairn_torch.cc).
# Present only where it was built for that torch; see cairn._tensors._torch_helpers.
from typing import Any

torch_version: str

def describe(flat: dict[str, Any]) -> list[tuple[str, str, tuple[int, ...], int, int] | None]: ...
def views(
    data: Any, described: list[tuple[str, str, tuple[int, ...], int, int]]
) -> dict[str, Any] | None: ...
