"""The single-purpose verbs' way of taking inputs: ``inputs=`` (and ``eval_inputs=`` for held-out text), the
keyword that ``analyze``, ``ablate``, ``fingerprint`` and ``compare`` take too.

These verbs read your own token IDs, so ``inputs`` is an integer tensor ``[n, seq]`` or :class:`RandomTokens`
(drawn here); the names that ``analyze`` draws from (``"tokens"``, ``"text"``) and embeddings are refused in one line
that says what to pass. The earlier keywords ``tokens=`` and ``eval_tokens=`` still work, with a DeprecationWarning.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any, Callable, TypeVar, cast

import torch
from torch import Tensor

from lens_bias.core.errors import LensBiasError, WrongType
from lens_bias.core.inputs import RandomTokens

__all__ = ["takes_token_inputs", "as_token_ids"]

F = TypeVar("F", bound=Callable[..., Any])

# the keywords these verbs took before they shared ``inputs``: old → new
RENAMED = {"tokens": "inputs", "eval_tokens": "eval_inputs"}


def as_token_ids(verb: str, name: str, value: Any) -> Tensor:
    """``value`` as token IDs ``[n, seq]`` for ``verb``'s argument ``name``, or a one-line :class:`LensBiasError`.

    >>> as_token_ids("perplexity", "inputs", RandomTokens(2, 3, 10, seed=0)).shape
    torch.Size([2, 3])
    """
    if isinstance(value, RandomTokens):
        return value.tensor()
    if isinstance(value, str):
        raise LensBiasError(f"{verb} reads your own token IDs, not {name}={value!r} (a name analyze draws from): pass {name}=lens_bias.text_tokens(model.tokenizer, n, seq_len) "
                            "or lens_bias.random_tokens(n, seq_len, d_vocab)")
    if not isinstance(value, Tensor):
        raise WrongType(f"{verb}'s {name} must be token IDs (an integer tensor [n, seq] or RandomTokens), got {type(value).__name__}")
    if value.ndim != 2 or value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
        raise LensBiasError(f"{verb}'s {name} must be token IDs, an integer tensor [n, seq] (e.g. lens_bias.text_tokens); got dtype {value.dtype} and shape {tuple(value.shape)}")
    return value


def takes_token_inputs(fn: F) -> F:
    """Make ``fn``'s ``inputs`` (and ``eval_inputs``) token IDs (:func:`as_token_ids`) before it runs, and map the old
    keywords (``tokens=``, ``eval_tokens=``) onto them with a DeprecationWarning at the caller's line."""
    signature = inspect.signature(fn)
    names = [new for new in RENAMED.values() if new in signature.parameters]

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        for old, new in RENAMED.items():
            if old in kwargs and new in names:
                if new in kwargs:
                    raise LensBiasError(f"{fn.__name__} got both {old}= and {new}=: pass {new}= only")
                warnings.warn(f"{fn.__name__}({old}=...) is deprecated: pass {new}=..., as every lens_bias verb takes its inputs", DeprecationWarning, stacklevel=2)
                kwargs[new] = kwargs.pop(old)
        bound = signature.bind(*args, **kwargs)  # a missing or unknown argument: Python's own TypeError, as before
        for name in names:
            if name in bound.arguments:
                bound.arguments[name] = as_token_ids(fn.__name__, name, bound.arguments[name])
        return fn(*bound.args, **bound.kwargs)

    return cast(F, call)
