"""Pad a transformer's text sequence to a bucket, with a mask, so calls of nearby lengths share one graph.

Why: kopt compiles one graph per input shape. Qwen-Image's pipeline encodes the prompt and the
negative prompt separately, so the two halves of each classifier-free-guidance pair reach the
transformer with different text lengths: two graphs (two compiles, two copies of every merged
weight) and two step-invariant memos, so neither half can reuse the other's timestep work.
Padding the text embeddings with zeros and marking the padding in the transformer's own text mask
gives both halves one shape. Valid because a masked key gets zero attention weight (the mask adds
minus infinity before the softmax), so no image token reads the padding, and the transformer's
output is its image tokens only; each real text token keeps its position. Tested end to end
against the unpadded pipeline (``tests/integrations/test_diffusers_pipeline.py``).

A call pads to ``bucket`` tokens times the smallest count that holds its text, or to the largest
bucket among the ``window`` calls before it if that is larger: the second half of a CFG pair always
sees its partner, and when the negative prompt is the longer one the positive half of the next step
pads up to it, so from the second step on both halves share one graph.
"""

from __future__ import annotations

import collections
import inspect
from typing import Any

import torch

TEXT_ARGUMENT = "encoder_hidden_states"
MASK_ARGUMENTS = ("encoder_hidden_states_mask",)  # 1 = a real token, 0 = padding (diffusers' Qwen-Image family)


def mask_argument(module: torch.nn.Module) -> str | None:
    """The name of ``module.forward``'s text-mask argument when it also takes text embeddings, else None."""
    try:
        names = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return None
    if TEXT_ARGUMENT not in names:
        return None
    return next((name for name in MASK_ARGUMENTS if name in names), None)


class TextPadding:
    """Rewrites a call's keyword arguments: text padded to a bucket, its mask extended with zeros."""

    def __init__(self, mask_name: str, bucket: int, window: int = 2) -> None:
        if bucket < 1:
            raise ValueError(f"text bucket must be a positive number of tokens, got {bucket}")
        self.mask_name, self.bucket = mask_name, bucket
        self.recent: collections.deque[int] = collections.deque(maxlen=window)
        self.padded_calls = 0

    def __call__(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        text = kwargs.get(TEXT_ARGUMENT)
        if not isinstance(text, torch.Tensor) or text.dim() != 3:
            return kwargs  # not the layout this rule knows (batch, tokens, channels): leave the call alone
        length = text.shape[1]
        own = -(-length // self.bucket) * self.bucket
        target = max([own, *self.recent])
        self.recent.append(own)
        mask = kwargs.get(self.mask_name)
        if mask is None:
            mask = torch.ones(text.shape[:2], dtype=torch.long, device=text.device)
        elif mask.shape != text.shape[:2]:
            return kwargs  # a mask of another layout: not ours to extend
        padding = target - length
        if padding:
            self.padded_calls += 1
            text = torch.cat([text, text.new_zeros(text.shape[0], padding, text.shape[2])], dim=1)
            mask = torch.cat([mask, mask.new_zeros(mask.shape[0], padding)], dim=1)
        return {**kwargs, TEXT_ARGUMENT: text, self.mask_name: mask}
