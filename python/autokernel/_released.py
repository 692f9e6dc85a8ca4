"""Weights released by ``optimize(..., keep_weights=False)``: how they are marked, kept in
place, and refused where something would compute with them.

A released weight is a Parameter on the ``meta`` device (its shape, no values) standing where
the float32 weight was; the runtime serves the layer from the packed copy it made before. The
module that held it records a :class:`Release`: the meta Parameters it put in place, their
versions then, and that packed copy — so a deep copy (whose Parameters are new objects), a
``torch.func.functional_call`` round trip or a bias change serves the same copy again, while a
write into a released weight or another meta tensor put in its place, which hold no values, is
refused rather than packed.
"""

from __future__ import annotations

import copy
import types
from typing import Any, Optional, Sequence

import torch
from torch import nn


def is_released(p: Optional[torch.Tensor]) -> bool:
    """Whether ``p`` is a weight without values (a tensor on the ``meta`` device)."""
    return p is not None and p.is_meta


class Release:
    """What ``optimize(..., keep_weights=False)`` released of one module: its path in the model
    (for messages), the modules whose ``weight`` it released (itself, or a fused block's
    query, key and value layers), the meta Parameters put in place, their versions then, and
    the packed copy that serves them (None for a projection packed as part of its block)."""

    def __init__(self, name: str, parts: Sequence[nn.Module], packed: Any) -> None:
        self.name = name
        self.parts = tuple(parts)
        self.params = tuple(x.weight for x in self.parts)
        self.versions = tuple(p._version for p in self.params)
        self.packed = packed

    def holds(self, params: Sequence[torch.Tensor]) -> bool:
        """Whether ``params`` are the released Parameters themselves, never written into."""
        return len(params) == len(self.params) and all(
            p is q and p._version == v for p, q, v in zip(params, self.params, self.versions)
        )

    def __deepcopy__(self, memo) -> "Release":
        # The copy's Parameters (the memo maps them: new tensors, at version 0), the same
        # packed copy (native, shared); a weight written into before the copy stays refused
        # (-1: no version matches).
        new = Release.__new__(Release)
        new.name, new.packed = self.name, self.packed
        new.parts, new.params = copy.deepcopy(self.parts, memo), copy.deepcopy(self.params, memo)
        new.versions = tuple(0 if p._version == v else -1 for p, v in zip(self.params, self.versions))
        return new


def of(m: nn.Module) -> Optional[Release]:
    """Module ``m``'s :class:`Release`, or None."""
    return m.__dict__.get("_autokernel_release")


def packed_copy(m: nn.Module, weights: Sequence[torch.Tensor], where: str, what: str) -> Any:
    """The packed copy that serves module ``m``'s released ``weights`` again (after a deep copy,
    a ``functional_call``, a bias change); a weight written into since, or another meta tensor,
    has no values to pack: :func:`unpackable` (``where``, ``what`` name it)."""
    r = of(m)
    if r is None or not r.holds(weights):
        raise unpackable(where, what)
    return r.packed


def name_of(m: nn.Module) -> str:
    """Module ``m`` for messages: its path in the model where it released weights, else its class."""
    r = of(m)
    return r.name if r is not None else type(m).__name__


def mark(m: nn.Module, release: Release) -> None:
    """Records ``release`` on module ``m`` and keeps its released weights in place when the
    module is moved or converted (``.to()``, ``.cpu()``, ``.half()``: there is nothing to move,
    and copying out of a meta tensor raises)."""
    m.__dict__["_autokernel_release"] = release
    m._apply = types.MethodType(_apply_keeping_released, m)


def _apply_keeping_released(self: nn.Module, fn, recurse: bool = True):
    """``nn.Module._apply`` — what ``.to()``, ``.cpu()``, ``.half()`` run — over the module's
    parameters but its released ones, which stay as they are (a call of another device or
    dtype is refused where it would need their values)."""
    held = {k: p for k, p in self._parameters.items() if is_released(p)}
    for k in held:
        self._parameters[k] = None  # skipped by _apply, its place in the order kept
    try:
        return type(self)._apply(self, fn, recurse)
    finally:
        for k, p in held.items():
            self._parameters[k] = p


def refuse_calls(m: nn.Module) -> None:
    """Makes a call of module ``m`` — a Linear whose released weight its block serves as part of
    a fused one — an error (PyTorch would compute it from no values, without a word)."""
    m.forward = types.MethodType(_refused_call, m)


def _refused_call(self: nn.Module, *args, **kwargs):
    if not is_released(self.weight):  # weights with values assigned since
        return type(self).forward(self, *args, **kwargs)
    raise error(name_of(self), "a direct call of a projection its block serves fused")


def forget_replaced(model: nn.Module, incompatible_keys=None) -> None:
    """``load_state_dict`` post-hook of a model whose weights were released: a module whose
    released weights all have values again (``assign=True``) drops its :class:`Release` — the
    packed copy it kept — and serves and moves as any other (a write without ``assign`` leaves
    meta tensors, refused at the next call)."""
    for m in model.modules():
        r = of(m)
        if r is not None and not any(is_released(x.weight) for x in r.parts):
            del m.__dict__["_autokernel_release"]
            for attr in ("_apply", "forward"):
                if getattr(m.__dict__.get(attr), "__func__", None) in (_apply_keeping_released, _refused_call):
                    del m.__dict__[attr]


def error(where: str, why: str) -> RuntimeError:
    """The error of a call that needs the float32 weights of ``where``, released: PyTorch's own
    forward, for ``why``."""
    return RuntimeError(
        f"{where}: this call needs its float32 weights ({why}), which autokernel.torch.optimize(..., "
        "keep_weights=False) released; the runtime serves float32 CPU inputs that need no gradient, in eval "
        "mode, with no hooks inside fused blocks (optimize with keep_weights=True to keep other calls working)"
    )


def unpackable(where: str, why: str) -> RuntimeError:
    """The error of packing a weight without values: a released one written into since, or
    another meta tensor put in its place (``why`` says which parts)."""
    return RuntimeError(
        f"{where}: {why} has no values to pack (a weight released by autokernel.torch.optimize(..., "
        "keep_weights=False) and written into since — load_state_dict without assign=True — or another "
        "meta tensor): assign a new Parameter with values, or call load_state_dict(..., assign=True)"
    )


def partly_replaced(where: str, replaced: int) -> RuntimeError:
    """The error of packing a fused block's query, key and value weights, packed as one, when
    ``replaced`` of them have values again and the others are still released."""
    verb = "was" if replaced == 1 else "were"
    return RuntimeError(
        f"{where}: its query, key and value weights are packed as one; {replaced} of them {verb} replaced while "
        "the others are released (autokernel.torch.optimize(..., keep_weights=False)): replace all three, "
        "with new Parameters or load_state_dict(..., assign=True)"
    )


def grad_reason(x: torch.Tensor) -> str:
    """Why a call on ``x`` that autograd must record does: its input, or a parameter."""
    return "an input that requires grad" if x.requires_grad else "a parameter that requires grad"

