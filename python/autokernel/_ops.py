"""The runtime's ops as PyTorch sees them: handles for runtimes, packed weights and fused
layers (custom ops take ints, not Python objects), the ``torch.library`` custom ops with their
fake implementations, the activations the runtime fuses, and :class:`AutokernelLinear`."""

from __future__ import annotations

import logging
import sys
import threading
import weakref
from typing import Any, Iterable, Optional

import torch
from torch import nn

from . import Runtime, _native, _released

log = logging.getLogger("autokernel")

# Handles: custom ops take ints, not Python objects. Runtimes live as long as the process; a
# packed weight's or a layer's entry goes when its _Handle is collected (with its module).
_LOCK = threading.Lock()
_RUNTIMES: dict[int, Runtime] = {}
_WEIGHTS: dict[int, tuple[Runtime, Any]] = {}
_LAYERS: dict[int, Any] = {}
_NEXT = [1]
# While workloads() runs: the workload of every runtime call, in order.
_RECORD = threading.local()


def _register(table: dict, value) -> int:
    """A new integer handle of ``value`` in ``table``."""
    with _LOCK:
        handle = _NEXT[0]
        _NEXT[0] += 1
        table[handle] = value
        return handle


class _Handle:
    """A module's entry in ``table`` (``_WEIGHTS`` or ``_LAYERS``), which the custom ops find
    by its integer ``id``. The entry is released when this object is collected (with the
    module holding it) or by :meth:`release`. A deep copy is a new entry with the same value:
    a copied model packs again into entries of its own, and neither model's release removes
    the other's. Not picklable (the value lives in native memory)."""

    def __init__(self, table: dict, value) -> None:
        self.table = table
        self.id = _register(table, value)
        self._finalizer = weakref.finalize(self, _release, table, self.id)

    def get(self):
        """The entry's value."""
        return self.table[self.id]

    def set(self, value) -> None:
        """Makes ``value`` the entry's value."""
        with _LOCK:
            self.table[self.id] = value

    def release(self) -> None:
        """Removes the entry now (the ops no longer find ``id``)."""
        self._finalizer()

    def __deepcopy__(self, memo) -> "_Handle":
        return _Handle(self.table, self.get())

    def __reduce__(self):
        raise TypeError(
            "an autokernel-optimized model cannot be pickled (its packed weights live in native "
            "memory): save the model's state_dict (its parameters are the original ones, but for "
            "weights optimize(..., keep_weights=False) released: save those before optimizing) and "
            "optimize the loaded model again"
        )


def _weight_handle(runtime: Runtime, packed) -> _Handle:
    """A new :class:`_Handle` of ``packed`` (None until packed), a weight packed for ``runtime``."""
    return _Handle(_WEIGHTS, (runtime, packed))


def _release(table: dict, handle: int) -> None:
    """Removes ``handle``'s entry from ``table`` (if still there)."""
    with _LOCK:
        table.pop(handle, None)


def _record(workload: str) -> None:
    seen = getattr(_RECORD, "seen", None)
    if seen is not None:
        seen.append(workload)


def _record_attention(b: int, h: int, s: int, d: int, causal: bool) -> None:
    """Records the workloads of an attention call: its own, or its blocks' where it is past
    one workload's size."""
    if getattr(_RECORD, "seen", None) is not None:
        for n in _native._sequence_blocks(b, h, s, d):
            _record(f"attention:{n}x{h}x{s}x{d}" + (":causal" if causal else ""))


# ---------------------------------------------------------------------------------------------
# Custom ops

# Each op's Python implementation, by op.
_IMPLS: dict = {}


def _custom_op(name: str):
    """Registers the decorated function as the custom op ``autokernel::name`` (which
    ``torch.compile`` and ``torch.export`` trace through); :func:`call` runs the function itself
    in eager mode."""

    def register(fn):
        op = torch.library.custom_op(f"autokernel::{name}", fn, mutates_args=())
        _IMPLS[op] = fn
        return op

    return register


def call(op, *args):
    """Custom op ``op`` on ``args``: through the dispatcher while ``torch.compile`` or
    ``torch.export`` traces (its graph needs the op), else its implementation directly.
    Measured on a 2-vCPU Zen 4 VM, alternating in one process: through the dispatcher a
    128×768 · 768×3072 linear layer took 50-80 µs longer a call (its own overhead is ~8 µs)."""
    if torch.compiler.is_compiling():
        return op(*args)
    return _IMPLS[op](*args)


@_custom_op("linear")
def _linear_op(x: torch.Tensor, handle: int, bias: Optional[torch.Tensor]) -> torch.Tensor:
    return _linear(x, handle, bias)


def _linear(x: torch.Tensor, handle: int, bias: Optional[torch.Tensor]) -> torch.Tensor:
    rt, weight = _WEIGHTS[handle]
    x = x.detach().contiguous()
    y = rt.linear(x, weight, None if bias is None else bias.detach())
    if getattr(_RECORD, "seen", None) is not None:
        m, n, k = x.numel() // weight.in_features, weight.out_features, weight.in_features
        op = weight.workload.split(":", 1)[0]
        for rows in _native._row_blocks(m, n, k):  # a call past one workload's size: its blocks'
            _record(f"{op}:{rows}x{n}x{k}")
    return torch.from_numpy(y)


@_linear_op.register_fake
def _(x, handle, bias):
    _, weight = _WEIGHTS[handle]
    return x.new_empty((*x.shape[:-1], weight.out_features))


@_custom_op("attention")
def _attention_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, handle: int, causal: bool, key_lengths: Optional[torch.Tensor] = None
) -> torch.Tensor:
    rt = _RUNTIMES[handle]
    q, k, v = (t.detach().contiguous() for t in (q, k, v))
    o = rt.attention(q, k, v, causal, mask=key_lengths)
    _record_attention(*q.shape, causal)
    return torch.from_numpy(o)


@_attention_op.register_fake
def _(q, k, v, handle, causal, key_lengths=None):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


@_custom_op("attention_qkv")
def _attention_qkv_op(
    qkv: torch.Tensor, handle: int, heads: int, causal: bool, key_lengths: Optional[torch.Tensor] = None
) -> torch.Tensor:
    rt = _RUNTIMES[handle]
    o = rt.attention_qkv(qkv.detach().contiguous(), heads, causal, mask=key_lengths)
    b, s, width = qkv.shape
    _record_attention(b, heads, s, width // (3 * heads), causal)
    return torch.from_numpy(o)


@_attention_qkv_op.register_fake
def _(qkv, handle, heads, causal, key_lengths=None):
    return qkv.new_empty((*qkv.shape[:-1], qkv.shape[-1] // 3))


@_custom_op("linear_add_layer_norm")
def _linear_add_layer_norm_op(
    x: torch.Tensor,
    handle: int,
    bias: Optional[torch.Tensor],
    residual: torch.Tensor,
    ln_weight: torch.Tensor,
    ln_bias: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    y = _linear(x, handle, bias)
    rt, _ = _WEIGHTS[handle]
    rt.add_layer_norm(y, residual.detach().contiguous(), ln_weight.detach(), ln_bias.detach(), eps)
    return y


@_linear_add_layer_norm_op.register_fake
def _(x, handle, bias, residual, ln_weight, ln_bias, eps):
    _, weight = _WEIGHTS[handle]
    return x.new_empty((*x.shape[:-1], weight.out_features))


def _run_layers(x: torch.Tensor, handles: list[int], key_lengths: Optional[torch.Tensor]) -> torch.Tensor:
    """The fused encoder layers ``handles`` one after the other on ``x``, in one runtime call."""
    layers = [_LAYERS[h] for h in handles]
    y = layers[0].runtime.encoder(layers, x.detach().contiguous(), mask=key_lengths)
    if getattr(_RECORD, "seen", None) is not None:
        for layer in layers:
            for w in layer.workloads(x.shape[0], x.shape[1]):
                _record(w)
    return torch.from_numpy(y)


@_custom_op("encoder_layer")
def _encoder_layer_op(x: torch.Tensor, handle: int, key_lengths: Optional[torch.Tensor] = None) -> torch.Tensor:
    return _run_layers(x, [handle], key_lengths)


@_custom_op("encoder")
def _encoder_op(x: torch.Tensor, handles: list[int], key_lengths: Optional[torch.Tensor] = None) -> torch.Tensor:
    return _run_layers(x, handles, key_lengths)


def _like_x(x, handle_or_handles, key_lengths=None):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


_encoder_layer_op.register_fake(_like_x)
_encoder_op.register_fake(_like_x)


# ---------------------------------------------------------------------------------------------
# Activations


def _classify_act(module: nn.Module) -> Optional[str]:
    """The runtime's name of an activation module ('relu', 'gelu_tanh', 'gelu_erf'), judged by
    what it computes on a probe (so any class that computes it is recognised), or None. The
    probe reaches far past the bends (to ±1e4): a clipped activation (ReLU6, transformers'
    ``gelu_10``) agrees with its unclipped form below its clip."""
    if not isinstance(module, nn.Module) or any(True for _ in module.parameters()):
        return None
    far = torch.tensor([7.0, 8.0, 10.5, 12.0, 20.0, 100.0, 1e4], dtype=torch.float32)
    x = torch.cat([-far.flip(0), torch.linspace(-6.0, 6.0, 241, dtype=torch.float32), far])
    try:
        with torch.no_grad():
            y = module(x)
    except Exception:  # not an elementwise activation
        return None
    if not isinstance(y, torch.Tensor) or y.shape != x.shape:
        return None
    refs = {
        "relu": torch.relu(x),
        "gelu_tanh": nn.functional.gelu(x, approximate="tanh"),
        "gelu_erf": nn.functional.gelu(x),
    }
    for name, ref in refs.items():
        if torch.allclose(y, ref, atol=1e-6, rtol=0):
            return name
    return None


# The activations the runtime fuses into a linear layer.
_FUSABLE = ("relu", "gelu_tanh", "gelu_erf")


# ---------------------------------------------------------------------------------------------
# Modules


class AutokernelLinear(nn.Module):
    """An ``nn.Linear`` — or a transformers ``Conv1D`` (GPT-2's), a Linear whose weight is
    stored ``(in, out)`` — optionally followed by a fused activation, served by the runtime,
    its weight packed once — and again if it changes in place (``load_state_dict``, an
    optimizer step). Keeps the original parameters (shared, not copied) for ``state_dict`` and
    for calls the runtime does not take (gradients, other dtypes or devices), which compute as
    the module it stands for does."""

    def __init__(self, linear: nn.Module, runtime: Runtime, act: Optional[str] = None, ms: Iterable[int] = (1,)):
        super().__init__()
        self.train(linear.training)  # the mode of the module it stands for, not a new one's
        # Conv1D's weight is (in, out): the runtime's K×N layout as it is, no transposed copy.
        self._kn = _is_conv1d(linear)
        self.weight = linear.weight
        self.bias = linear.bias
        self.act = act
        self._runtime = runtime
        self._ms = list(ms)
        self.handle = _weight_handle(runtime, None)
        self.refresh()

    def refresh(self) -> None:
        """Packs the weight again if it changed since it was packed (a no-op otherwise), its
        sizes taken from it as it is now (``resize_token_embeddings`` replaces a tied one)."""
        stamp = _stamp((self.weight, self.bias))
        if stamp is None or getattr(self, "_stamp", None) == stamp:
            return
        self._pack(stamp)

    def _pack(self, stamp: Optional[tuple]) -> None:
        """Packs the weight as it is now, recording ``stamp`` (its :func:`_stamp`) as packed."""
        if _released.is_released(self.weight):
            packed = _released.packed_copy(self, (self.weight,), self._where(), "its weight")
            self.handle.set((self._runtime, packed))
            self.packed, self._stamp = packed, stamp
            return
        if self._kn:
            layout, (self.in_features, self.out_features) = "kn", self.weight.shape
        else:
            layout, (self.out_features, self.in_features) = "nk", self.weight.shape
        with torch.no_grad():
            packed = self._runtime.pack_weight(self.weight.detach(), act=self.act, ms=self._ms, layout=layout)
        self.handle.set((self._runtime, packed))
        self.packed = packed
        self._stamp = stamp

    def _act_seen(self) -> bool:
        """Whether this layer must compute without its fused activation: it stands for a Linear
        whose activation module followed it (:class:`FusedActivation`), and a hook on either,
        or a global one, must see the values between them, as in the stock model."""
        stand_in = self.__dict__.get("_stand_in")
        return stand_in is not None and (_hooked(self) or _hooked(stand_in) or _global_hooks())

    def _stock(self, x: torch.Tensor) -> torch.Tensor:
        """What the module it stands for computes (without the fused activation)."""
        if _released.is_released(self.weight):
            raise _released.error(self._where(), self._why_stock(x))
        if self._kn:  # transformers' Conv1D.forward
            y = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
            return y.view(x.size()[:-1] + (self.weight.shape[1],))
        return nn.functional.linear(x, self.weight, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.act is not None and self._act_seen():
            return self._stock(x)
        if _served(x) and not _needs_grad(x, (self.weight, self.bias)):
            self.refresh()
            bias = None if self.bias is None else self.bias.detach()
            return call(_linear_op, x, self.handle.id, bias)
        y = self._stock(x)
        stand_in = self.__dict__.get("_stand_in")
        if self.act is not None and stand_in is not None:
            return stand_in.act(y)  # the model's own activation module, exactly
        if self.act == "relu":
            return torch.relu(y)
        if self.act == "gelu_tanh":
            return nn.functional.gelu(y, approximate="tanh")
        if self.act == "gelu_erf":
            return nn.functional.gelu(y)
        return y

    def _where(self) -> str:
        """The layer, for messages: its path in the model where known."""
        r = _released.of(self)
        if r is not None:
            return r.name
        return f"{type(self).__name__}(in_features={self.in_features}, out_features={self.out_features})"

    def _why_stock(self, x: torch.Tensor) -> str:
        """Why a call on ``x`` runs the module's own forward (see :meth:`forward`)."""
        if self.act is not None and self._act_seen():
            return "a hook sees the values between it and its activation"
        if not _served(x):
            return f"a {x.dtype} input on {x.device.type}"
        return _released.grad_reason(x)

    def extra_repr(self) -> str:
        released = ", weight released" if _released.is_released(self.weight) else ""
        return (
            f"in_features={self.in_features}, out_features={self.out_features}{released}, "
            f"bias={self.bias is not None}, act={self.act!r}, packed={self.packed.workload} ({self.packed.level})"
        )


class FusedActivation(nn.Module):
    """Stands where an activation module was after the Linear it is fused into (an
    :class:`AutokernelLinear` with ``act``, module ``name`` of ``parent``): passes that
    layer's output on, or applies the activation itself when the layer computed without it (a
    hook registered on either module, or a global one, sees what it would see in the stock
    model) or no longer stands where it did (a module put in its place after ``optimize``,
    e.g. by an adapter library, computes without the activation)."""

    def __init__(self, act: nn.Module, linear: AutokernelLinear, parent: nn.Module, name: str):
        super().__init__()
        self.act = act
        self.train(act.training)
        # Not submodules (they are their parent's, or the parent): plain references, which
        # copy.deepcopy maps to the copies.
        self.__dict__["_linear"] = linear
        self.__dict__["_slot"] = (parent, name)
        linear.__dict__["_stand_in"] = self

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        parent, name = self._slot
        in_place = parent._modules.get(name) is self._linear
        return y if in_place and not self._linear._act_seen() else self.act(y)


def _stamp(params: Iterable[Optional[torch.Tensor]]) -> Optional[tuple]:
    """Which tensors ``params`` are, where their data lives and how often each was changed in
    place: packed copies of them are stale when this differs from the stamp taken when they
    were made (a new Parameter, ``.data =`` or a dtype round trip, an in-place op). None
    while ``torch.compile`` or ``torch.export`` traces (its parameters are stand-ins; what is
    packed stays — a compiled model keeps serving the weights it was compiled with).
    Inference tensors keep no version counter: their in-place changes are not seen."""
    if torch.compiler.is_compiling():
        return None
    return tuple(
        (id(p), None if p is None else p.data_ptr(), None if p is None or p.is_inference() else p._version)
        for p in params
    )


def _needs_grad(x: torch.Tensor, params: Iterable[Optional[torch.Tensor]]) -> bool:
    """Whether a call on ``x`` with parameters ``params`` must be recorded for autograd (the
    runtime's ops have no backward): grad mode on, and the input or any parameter requiring
    a gradient."""
    return torch.is_grad_enabled() and (x.requires_grad or any(p is not None and p.requires_grad for p in params))


def _served(x: torch.Tensor) -> bool:
    return x.dtype == torch.float32 and x.device.type == "cpu" and x.dim() >= 1


def _is_conv1d(m: nn.Module) -> bool:
    """Whether ``m`` is transformers' ``Conv1D`` (GPT-2 and its kin): a Linear whose weight is
    stored ``(in, out)``, with a bias. Only that class: a subclass may compute otherwise."""
    utils = sys.modules.get("transformers.pytorch_utils")
    return utils is not None and type(m) is getattr(utils, "Conv1D", None)


def _linear_like(m: nn.Module) -> bool:
    """Whether the runtime's GEMM stands for ``m``: an ``nn.Linear`` or a ``Conv1D`` (exactly
    those classes)."""
    return type(m) is nn.Linear or _is_conv1d(m)


def _features(m: nn.Module) -> tuple[int, int]:
    """``(in, out)`` features of a Linear-like module (:func:`_linear_like`)."""
    if _is_conv1d(m):
        return tuple(m.weight.shape)
    return m.in_features, m.out_features


def _linear_ok(m: nn.Module) -> Optional[str]:
    """Why the runtime cannot serve Linear-like ``m`` (None when it can)."""
    if _is_conv1d(m) and (m.weight.dim() != 2 or m.bias is None or tuple(m.bias.shape) != m.weight.shape[1:]):
        return "a Conv1D whose weight and bias are not (in, out) and (out,)"
    n_in, n_out = _features(m)
    if n_in == 0 or n_out == 0:
        return f"zero-sized ({n_in} → {n_out} features)"
    if m.weight.dtype != torch.float32:
        return f"weight dtype {m.weight.dtype} (float32 only)"
    if m.weight.device.type != "cpu":
        return f"weight on {m.weight.device} (CPU only)"
    if _hooked(m):
        return "hooks registered on it (left to PyTorch, which runs them)"
    return None


def _hooked(m: nn.Module) -> bool:
    """Whether ``m`` has forward or backward hooks of its own (a module the runtime serves in
    its place would skip them) — but for transformers' output-capturing hooks while nothing
    is being collected (:func:`_idle_capture_hook`)."""
    if m._forward_pre_hooks or m._backward_pre_hooks or m._backward_hooks:
        return True
    return any(not _idle_capture_hook(h) for h in m._forward_hooks.values())


def _idle_capture_hook(hook) -> bool:
    """Whether ``hook`` is transformers' output-capturing hook (which transformers 5 installs
    for good on every layer and attention module the first time a call asks for hidden states
    or attention weights) and no output collection is active: then it returns at once, and a
    fused forward that skips it changes nothing. Any other hook, or a transformers without
    that collector, counts as one that must run."""
    if getattr(hook, "__name__", None) != "output_capturing_hook":
        return False
    if not getattr(hook, "__module__", "").startswith("transformers."):
        return False
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:
        return False
    return not _active_collector.get()


def _global_hooks() -> bool:
    """Whether module hooks are registered for every module (``register_module_forward_hook``
    and its pre-hook twin): a fused forward would skip them for the modules it stands in for."""
    from torch.nn.modules import module as torch_module

    return bool(torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks)


def _walk(m: nn.Module) -> tuple[bool, list]:
    """One pass over ``m``'s modules for a fused forward's per-call checks: whether its own
    forward must run — hooks it would skip (:func:`_hooks_below`), or a module in training
    mode (a dropout switched on inside an eval model, as Monte Carlo dropout does) — and
    ``m``'s parameters as they are now (to stamp)."""
    own_forward = _global_hooks()
    params = []
    for c in m.modules():
        own_forward = own_forward or c.training or (c is not m and _hooked(c))
        params.extend(p for p in c._parameters.values() if p is not None)
    return own_forward, params


def _training(m: nn.Module) -> bool:
    """Whether ``m`` or a module inside it is in training mode (its dropout is on)."""
    return any(c.training for c in m.modules())


def _hooks_below(m: nn.Module) -> bool:
    """Whether a module inside ``m`` (not ``m`` itself, whose hooks run around any forward)
    has hooks, or global module hooks are registered: a fused forward of ``m`` would skip
    them."""
    return _global_hooks() or any(_hooked(c) for c in m.modules() if c is not m)
