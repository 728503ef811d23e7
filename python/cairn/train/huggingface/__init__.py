"""Hugging Face integrations of :mod:`cairn.train`, laid out as Ray's
``ray.train.huggingface``: :mod:`cairn.train.huggingface.transformers`."""

from __future__ import annotations
