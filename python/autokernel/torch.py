"""PyTorch drop-in: serve a model's linear layers and attention through the autokernel runtime.

    import autokernel.torch
    model = autokernel.torch.optimize(model, db="tuning.db")   # in place; returns the model
    model.autokernel_unsupported                                # [(module name, why)]
    autokernel.torch.workloads(model, (input_ids,))             # what a forward pass calls

``optimize`` replaces every float32 ``nn.Linear`` by an :class:`AutokernelLinear` whose weight
is packed once; a Linear followed by its activation (a Hugging Face feed-forward block's
``dense`` + ``intermediate_act_fn``, or ``nn.Sequential(Linear, act)``) becomes one fused
``gemm_bias_<act>`` call (ReLU, tanh GELU, exact-erf GELU). Hugging Face models'
scaled-dot-product attention is served by the runtime through the ``autokernel`` attention
implementation, padded batches included (a right-padding mask becomes per-sequence key
lengths); calls it cannot serve (another mask pattern, dropout, another scale) run PyTorch's
own. A BERT-family self-attention block's query, key and value projections become one GEMM
(one packed 3·H × hidden weight: in int8, one quantisation of the input instead of three),
and its attention reads that GEMM's output rows directly (no head split or merge copies in
PyTorch). An output block's ``LayerNorm(dense(x) + input_tensor)`` is one call too (the
residual add and LayerNorm in place, in parallel). The ops are ``torch.library`` custom ops
with fake implementations, so
``torch.compile`` and ``torch.export`` trace through them.
"""

from __future__ import annotations

import copy
import logging
import math
import threading
import types
import weakref
from typing import Any, Iterable, Optional

import torch
from torch import nn

from . import Runtime

__all__ = ["AutokernelLinear", "optimize", "workloads", "runtime_of"]

log = logging.getLogger("autokernel")

# Handles: custom ops take ints, not Python objects. Runtimes live as long as the process; a
# packed weight's entry goes when the module that registered it is collected.
_LOCK = threading.Lock()
_RUNTIMES: dict[int, Runtime] = {}
_WEIGHTS: dict[int, tuple[Runtime, Any]] = {}
_LAYERS: dict[int, Any] = {}
_NEXT = [1]
# While workloads() runs: the workload of every runtime call, in order.
_RECORD = threading.local()


def _register(table: dict, value) -> int:
    with _LOCK:
        handle = _NEXT[0]
        _NEXT[0] += 1
        table[handle] = value
        return handle


def _register_owned(owner: nn.Module, table: dict, value) -> int:
    """The custom ops' handle of ``value`` in ``table``, released when ``owner`` is collected."""
    handle = _register(table, value)
    weakref.finalize(owner, _release, table, handle)
    return handle


def _register_weight(owner: nn.Module, runtime: Runtime, packed) -> int:
    """The custom ops' handle of ``packed``, released when ``owner`` is collected."""
    return _register_owned(owner, _WEIGHTS, (runtime, packed))


def _release(table: dict, handle: int) -> None:
    with _LOCK:
        table.pop(handle, None)


def _record(workload: str) -> None:
    seen = getattr(_RECORD, "seen", None)
    if seen is not None:
        seen.append(workload)


# ---------------------------------------------------------------------------------------------
# Custom ops


@torch.library.custom_op("autokernel::linear", mutates_args=())
def _linear_op(x: torch.Tensor, handle: int, bias: Optional[torch.Tensor]) -> torch.Tensor:
    return _linear(x, handle, bias)


def _linear(x: torch.Tensor, handle: int, bias: Optional[torch.Tensor]) -> torch.Tensor:
    rt, weight = _WEIGHTS[handle]
    x = x.contiguous()
    y = rt.linear(x, weight, bias)
    if getattr(_RECORD, "seen", None) is not None:
        m = x.numel() // weight.in_features
        op = weight.workload.split(":", 1)[0]
        _record(f"{op}:{m}x{weight.out_features}x{weight.in_features}")
    return torch.from_numpy(y)


@_linear_op.register_fake
def _(x, handle, bias):
    _, weight = _WEIGHTS[handle]
    return x.new_empty((*x.shape[:-1], weight.out_features))


@torch.library.custom_op("autokernel::attention", mutates_args=())
def _attention_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, handle: int, causal: bool, key_lengths: Optional[torch.Tensor] = None
) -> torch.Tensor:
    rt = _RUNTIMES[handle]
    o = rt.attention(q.contiguous(), k.contiguous(), v.contiguous(), causal, mask=key_lengths)
    b, h, s, d = q.shape
    _record(f"attention:{b}x{h}x{s}x{d}" + (":causal" if causal else ""))
    return torch.from_numpy(o)


@_attention_op.register_fake
def _(q, k, v, handle, causal, key_lengths=None):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


@torch.library.custom_op("autokernel::attention_qkv", mutates_args=())
def _attention_qkv_op(
    qkv: torch.Tensor, handle: int, heads: int, causal: bool, key_lengths: Optional[torch.Tensor] = None
) -> torch.Tensor:
    rt = _RUNTIMES[handle]
    o = rt.attention_qkv(qkv.contiguous(), heads, causal, mask=key_lengths)
    b, s, width = qkv.shape
    _record(f"attention:{b}x{heads}x{s}x{width // (3 * heads)}" + (":causal" if causal else ""))
    return torch.from_numpy(o)


@_attention_qkv_op.register_fake
def _(qkv, handle, heads, causal, key_lengths=None):
    return qkv.new_empty((*qkv.shape[:-1], qkv.shape[-1] // 3))


@torch.library.custom_op("autokernel::linear_add_layer_norm", mutates_args=())
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
    rt.add_layer_norm(y, residual.contiguous(), ln_weight, ln_bias, eps)
    return y


@_linear_add_layer_norm_op.register_fake
def _(x, handle, bias, residual, ln_weight, ln_bias, eps):
    _, weight = _WEIGHTS[handle]
    return x.new_empty((*x.shape[:-1], weight.out_features))


@torch.library.custom_op("autokernel::encoder_layer", mutates_args=())
def _encoder_layer_op(x: torch.Tensor, handle: int, key_lengths: Optional[torch.Tensor] = None) -> torch.Tensor:
    layer = _LAYERS[handle]
    y = layer(x.contiguous(), mask=key_lengths)
    if getattr(_RECORD, "seen", None) is not None:
        for w in layer.workloads(x.shape[0], x.shape[1]):
            _record(w)
    return torch.from_numpy(y)


@_encoder_layer_op.register_fake
def _(x, handle, key_lengths=None):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


# ---------------------------------------------------------------------------------------------
# Activations


def _classify_act(module: nn.Module) -> Optional[str]:
    """The runtime's name of an activation module ('relu', 'gelu_tanh', 'gelu_erf'), judged by
    what it computes on a probe (so any class that computes it is recognised), or None."""
    if not isinstance(module, nn.Module) or any(True for _ in module.parameters()):
        return None
    x = torch.linspace(-6.0, 6.0, 241, dtype=torch.float32)
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
    """An ``nn.Linear`` (optionally followed by a fused activation) served by the runtime, its
    weight packed once. Keeps the original parameters (shared, not copied) for ``state_dict``
    and for calls the runtime does not take (gradients, other dtypes or devices)."""

    def __init__(self, linear: nn.Linear, runtime: Runtime, act: Optional[str] = None, ms: Iterable[int] = (1,)):
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.act = act
        with torch.no_grad():
            packed = runtime.pack_weight(linear.weight.detach(), act=act, ms=list(ms), layout="nk")
        self.packed = packed
        self.handle = _register_weight(self, runtime, packed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _served(x) and not (torch.is_grad_enabled() and self.weight.requires_grad):
            bias = None if self.bias is None else self.bias.detach()
            return torch.ops.autokernel.linear(x, self.handle, bias)
        y = nn.functional.linear(x, self.weight, self.bias)
        if self.act == "relu":
            return torch.relu(y)
        if self.act == "gelu_tanh":
            return nn.functional.gelu(y, approximate="tanh")
        if self.act == "gelu_erf":
            return nn.functional.gelu(y)
        return y

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, act={self.act!r}, packed={self.packed.workload} ({self.packed.level})"
        )


def _served(x: torch.Tensor) -> bool:
    return x.dtype == torch.float32 and x.device.type == "cpu" and x.dim() >= 1


# ---------------------------------------------------------------------------------------------
# Hugging Face attention


def _key_lengths(mask: torch.Tensor, causal: bool) -> Optional[torch.Tensor]:
    """The per-sequence key lengths a Hugging Face 4-D attention mask encodes, or None when it
    is not a right-padding mask (with the causal triangle when ``causal``).

    ``mask`` is (B, 1 or H, Sq, Sk): boolean (True = attend) or additive float (0 = attend,
    a large negative number = masked). The mask is checked in full, never guessed from one row.
    """
    if mask.dim() != 4:
        return None
    allowed = mask if mask.dtype == torch.bool else mask == 0
    if mask.dtype != torch.bool and not bool(torch.all(allowed | (mask <= -1e4))):
        return None  # a soft bias, not a mask
    b, _, sq, sk = allowed.shape
    lengths = allowed[:, 0, -1, :].sum(-1)  # the last query row sees every unpadded key
    keys = torch.arange(sk, device=mask.device)
    want = keys[None, None, None, :] < lengths[:, None, None, None]
    if causal:
        want = want & (keys[None, :] <= torch.arange(sq, device=mask.device)[:, None] + (sk - sq))
    if not bool(torch.equal(allowed, want.expand_as(allowed))):
        return None
    return lengths.to(torch.int32)


def _hf_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """The ``autokernel`` attention implementation of transformers: the runtime's attention when
    it computes the same thing, PyTorch's SDPA otherwise."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    handle = getattr(module, "_autokernel_runtime", None)
    d = query.shape[-1]
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", False))
    plain = (
        handle is not None
        and dropout == 0.0
        and (scaling is None or math.isclose(scaling, d**-0.5, rel_tol=1e-6))
        and query.shape == key.shape == value.shape
        and all(_served(t) for t in (query, key, value))
        and not kwargs.get("softcap")
        and not (torch.is_grad_enabled() and query.requires_grad)
    )
    lengths = None
    if plain and attention_mask is not None:
        lengths = _key_lengths(attention_mask, causal)
        plain = lengths is not None
    if not plain:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    o = torch.ops.autokernel.attention(query, key, value, handle, causal, lengths)
    return o.transpose(1, 2).contiguous(), None


def _install_hf_attention(model: nn.Module, handle: int, report: list) -> int:
    """Routes a transformers model's attention through the runtime; returns the modules routed."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "_attn_implementation"):
        return 0
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError as e:
        report.append(("<attention>", f"transformers without AttentionInterface: {e}"))
        return 0
    AttentionInterface.register("autokernel", _hf_attention)
    AttentionMaskInterface.register("autokernel", sdpa_mask)
    routed = 0
    for _, m in model.named_modules():
        if hasattr(m, "config") and hasattr(m, "is_causal") and hasattr(m, "scaling"):
            m._autokernel_runtime = handle
            routed += 1
    if routed:
        if hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation("autokernel")
        else:
            config._attn_implementation = "autokernel"
    return routed


def _fusable_qkv(m: nn.Module) -> bool:
    """Whether ``m`` is a Hugging Face BERT-family self-attention block (``query``, ``key``,
    ``value`` Linear layers of one input, heads of ``attention_head_size``) whose three
    projections can be one GEMM."""
    lins = [getattr(m, n, None) for n in ("query", "key", "value")]
    return (
        all(type(x) is nn.Linear and _linear_ok(x) is None for x in lins)
        and len({(x.in_features, x.out_features, x.bias is None) for x in lins}) == 1
        and all(hasattr(m, a) for a in ("config", "attention_head_size", "all_head_size", "scaling"))
    )


def _fuse_qkv(m: nn.Module, rt: Runtime, ms: list) -> None:
    """Packs ``m``'s query, key and value weights as one (3·H × hidden) weight and serves the
    block's forward with one GEMM for the three projections (one quantisation of the input in
    int8), the runtime's attention after it. The three Linear layers stay (their parameters,
    for ``state_dict`` and for the calls the fused forward hands back to the original one)."""
    lins = [m.query, m.key, m.value]
    with torch.no_grad():
        w = torch.cat([x.weight.detach() for x in lins])
        packed = rt.pack_weight(w, ms=ms, layout="nk")
        m._autokernel_qkv_bias = None if lins[0].bias is None else torch.cat([x.bias.detach() for x in lins])
    m._autokernel_qkv = _register_weight(m, rt, packed)
    m._autokernel_forward = m.forward
    m.forward = types.MethodType(_fused_self_attention, m)


# Keyword arguments that mean a decoder cache or cross-attention: left to the original forward.
_NOT_FUSED_KWARGS = ("cache", "past_key_values", "past_key_value", "encoder_hidden_states")


def _fused_self_attention(self, hidden_states, attention_mask=None, *args, **kwargs):
    """A fused self-attention block's forward (see :func:`_fuse_qkv`); the original one for
    what it does not cover (a cache, cross-attention, training, gradients, another dtype,
    another attention implementation)."""
    if (
        args
        or any(kwargs.get(n) is not None for n in _NOT_FUSED_KWARGS)
        or self.training
        or not _served(hidden_states)
        or (torch.is_grad_enabled() and self.query.weight.requires_grad)
        or getattr(self.config, "_attn_implementation", None) != "autokernel"
    ):
        return self._autokernel_forward(hidden_states, attention_mask, *args, **kwargs)
    for n in _NOT_FUSED_KWARGS:
        kwargs.pop(n, None)
    h, d = self.all_head_size, self.attention_head_size
    qkv = torch.ops.autokernel.linear(hidden_states, self._autokernel_qkv, self._autokernel_qkv_bias)
    causal = bool(kwargs.get("is_causal", getattr(self, "is_causal", False)))
    lengths = None
    plain = (
        hidden_states.dim() == 3
        and math.isclose(self.scaling, d**-0.5, rel_tol=1e-6)
        and not kwargs.get("softcap")
        and not kwargs.get("output_attentions")
    )
    if plain and attention_mask is not None:
        lengths = _key_lengths(attention_mask, causal)
        plain = lengths is not None
    if plain:
        # Straight from the projection's rows: the runtime splits and merges the heads.
        heads = h // d
        return torch.ops.autokernel.attention_qkv(qkv, self._autokernel_runtime, heads, causal, lengths), None
    shape = (*hidden_states.shape[:-1], -1, d)
    q, k, v = (qkv[..., i * h : (i + 1) * h].view(shape).transpose(1, 2) for i in range(3))
    out, weights = _hf_attention(self, q, k, v, attention_mask, dropout=0.0, scaling=self.scaling, **kwargs)
    return out.reshape(*hidden_states.shape[:-1], -1).contiguous(), weights


def _fusable_output(m: nn.Module) -> bool:
    """Whether ``m`` looks like a Hugging Face BERT-family output block: ``forward(hidden_states,
    input_tensor)`` over a served ``dense`` (no activation), a ``dropout`` and an affine
    ``LayerNorm`` of the dense's width. :func:`_fuse_output` then checks what it computes."""
    import inspect

    dense, ln = getattr(m, "dense", None), getattr(m, "LayerNorm", None)
    if not (isinstance(dense, AutokernelLinear) and dense.act is None and isinstance(ln, nn.LayerNorm)):
        return False
    if not isinstance(getattr(m, "dropout", None), nn.Dropout) or ln.weight is None or ln.bias is None:
        return False
    if tuple(ln.normalized_shape) != (dense.out_features,):
        return False
    try:
        params = list(inspect.signature(type(m).forward).parameters)
    except (TypeError, ValueError):
        return False
    return params == ["self", "hidden_states", "input_tensor"]


def _fuse_output(m: nn.Module, rows: int) -> bool:
    """Serves output block ``m``'s ``LayerNorm(dropout(dense(x)) + input_tensor)`` as one call:
    the linear layer, then the residual add and LayerNorm in place on its output, in
    parallel (PyTorch's would run on its one thread). Done only if the fused forward
    computes what the block's own does on a probe of ``rows`` rows (the linear layer is
    the same call in both, so only LayerNorm's rounding differs)."""
    original = m.forward
    m._autokernel_forward = original
    m.forward = types.MethodType(_fused_output, m)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, rows, m.dense.in_features, generator=g)
    r = torch.randn(1, rows, m.dense.out_features, generator=g)
    try:
        with torch.no_grad():
            want, got = original(x, r), m(x, r)
        ok = isinstance(want, torch.Tensor) and want.shape == got.shape and torch.allclose(got, want, rtol=1e-4, atol=1e-4)
    except Exception:  # a forward that is not what it looked like
        ok = False
    if not ok:
        m.forward = original
        del m._autokernel_forward
    return ok


def _fused_output(self, hidden_states, input_tensor):
    """A fused output block's forward (see :func:`_fuse_output`); the original one for what
    it does not cover (training, gradients, another dtype or shape)."""
    ln = self.LayerNorm
    if (
        self.training
        or not (_served(hidden_states) and _served(input_tensor))
        or (torch.is_grad_enabled() and (self.dense.weight.requires_grad or ln.weight.requires_grad))
        or input_tensor.shape != (*hidden_states.shape[:-1], self.dense.out_features)
    ):
        return self._autokernel_forward(hidden_states, input_tensor)
    bias = None if self.dense.bias is None else self.dense.bias.detach()
    return torch.ops.autokernel.linear_add_layer_norm(
        hidden_states, self.dense.handle, bias, input_tensor, ln.weight.detach(), ln.bias.detach(), float(ln.eps)
    )


def _fusable_layer(m: nn.Module, qkv_fused: set, outputs_fused: set) -> bool:
    """Whether ``m`` is a BERT-family encoder layer (``attention.self``, ``attention.output``,
    ``intermediate``, ``output``) whose parts are all served by the runtime already: its
    projections fused (query/key/value; Linear + activation; the two residual LayerNorms)."""
    att, inter, out = (getattr(m, n, None) for n in ("attention", "intermediate", "output"))
    sa, so = getattr(att, "self", None), getattr(att, "output", None)
    if not (id(sa) in qkv_fused and id(so) in outputs_fused and id(out) in outputs_fused):
        return False
    dense = getattr(inter, "dense", None)
    if not (isinstance(dense, AutokernelLinear) and dense.act in _FUSABLE):
        return False
    if not isinstance(getattr(inter, "intermediate_act_fn", None), nn.Identity):
        return False
    if getattr(m, "chunk_size_feed_forward", 0) or getattr(m, "is_decoder", False) or hasattr(m, "crossattention"):
        return False
    d = sa.attention_head_size
    return (
        not getattr(sa, "is_causal", False)
        and math.isclose(sa.scaling, d**-0.5, rel_tol=1e-6)
        and so.LayerNorm.eps == out.LayerNorm.eps
        and sa.all_head_size == so.dense.out_features
    )


def _fuse_layer(m: nn.Module, rt: Runtime, rows: int) -> bool:
    """Serves encoder layer ``m`` as one runtime call (an :class:`autokernel.EncoderLayer`
    over the weights its parts already packed). Done only if that computes what the layer's
    own forward does on a probe of ``rows`` rows."""
    sa, so, inter, out = m.attention.self, m.attention.output, m.intermediate, m.output

    def bias(lin, n):
        return torch.zeros(n) if lin.bias is None else lin.bias.detach()

    def norm(ln):
        return (ln.weight.detach(), ln.bias.detach())

    _, qkv = _WEIGHTS[sa._autokernel_qkv]
    qkv_bias = sa._autokernel_qkv_bias
    with torch.no_grad():
        layer = rt.encoder_layer(
            qkv, torch.zeros(qkv.out_features) if qkv_bias is None else qkv_bias,
            so.dense.packed, bias(so.dense, so.dense.out_features), norm(so.LayerNorm),
            inter.dense.packed, bias(inter.dense, inter.dense.out_features),
            out.dense.packed, bias(out.dense, out.dense.out_features), norm(out.LayerNorm),
            heads=sa.all_head_size // sa.attention_head_size, eps=float(so.LayerNorm.eps),
        )
    handle = _register_owned(m, _LAYERS, layer)
    m._autokernel_layer = handle
    original = m.forward
    m._autokernel_forward = original
    m.forward = types.MethodType(_fused_layer, m)
    x = torch.randn(1, rows, layer.hidden, generator=torch.Generator().manual_seed(0))
    try:
        with torch.no_grad():
            want, got = original(x), m(x)
        ok = isinstance(want, torch.Tensor) and want.shape == got.shape and torch.allclose(got, want, rtol=1e-4, atol=1e-4)
    except Exception:  # a forward that is not what it looked like
        ok = False
    if not ok:
        m.forward = original
        del m._autokernel_forward, m._autokernel_layer
        _release(_LAYERS, handle)
    return ok


def _fused_layer(self, hidden_states, attention_mask=None, *args, **kwargs):
    """A fused encoder layer's forward (see :func:`_fuse_layer`); the original one for what it
    does not cover (cross-attention, a cache, training, gradients, another dtype, a mask
    that is not right padding)."""
    sa = self.attention.self
    if (
        any(a is not None for a in args)
        or any(kwargs.get(n) is not None for n in _NOT_FUSED_KWARGS + ("encoder_attention_mask",))
        or kwargs.get("output_attentions")
        or self.training
        or not _served(hidden_states)
        or hidden_states.dim() != 3
        or (torch.is_grad_enabled() and sa.query.weight.requires_grad)
        or getattr(sa.config, "_attn_implementation", None) != "autokernel"
    ):
        return self._autokernel_forward(hidden_states, attention_mask, *args, **kwargs)
    lengths = None
    if attention_mask is not None:
        lengths = _key_lengths(attention_mask, False)
        if lengths is None:
            return self._autokernel_forward(hidden_states, attention_mask, *args, **kwargs)
    return torch.ops.autokernel.encoder_layer(hidden_states, self._autokernel_layer, lengths)


# ---------------------------------------------------------------------------------------------
# optimize / workloads


def runtime_of(model: nn.Module) -> Optional[Runtime]:
    """The runtime an optimized model is served by, or None."""
    return getattr(model, "autokernel_runtime", None)


def _linear_ok(m: nn.Module) -> Optional[str]:
    """Why the runtime cannot serve Linear ``m`` (None when it can)."""
    if m.weight.dtype != torch.float32:
        return f"weight dtype {m.weight.dtype} (float32 only)"
    if m.weight.device.type != "cpu":
        return f"weight on {m.weight.device} (CPU only)"
    return None


def _limit_torch_threads(model: nn.Module, n: int) -> None:
    """Runs ``model``'s forward with PyTorch's intra-op threads set to ``n``, restored after.

    PyTorch's OpenMP workers spin for a while after each parallel op; between two runtime
    calls (a LayerNorm, a residual add) they wake, and then spin on the very cores the
    runtime's kernels are about to use. Measured on a 2-core Zen 3 VM, BERT-base batch 1:
    the optimized model took 358 ms with PyTorch on 2 threads, 242 ms with 1 (the runtime on
    2 threads either way), the same as with ``OMP_WAIT_POLICY=PASSIVE``.
    """
    prev = threading.local()

    def before(module, args):
        if not torch.compiler.is_compiling():
            prev.n = torch.get_num_threads()
            torch.set_num_threads(n)

    def after(module, args, out):
        if not torch.compiler.is_compiling() and hasattr(prev, "n"):
            torch.set_num_threads(prev.n)
            del prev.n

    model.register_forward_pre_hook(before)
    model.register_forward_hook(after, always_call=True)


def optimize(
    model: nn.Module,
    db: Optional[str] = None,
    precision: Optional[str] = None,
    threads: Optional[int] = None,
    runtime: Optional[Runtime] = None,
    ms: Iterable[int] = (1, 128),
    attention: bool = True,
    torch_threads: Optional[int] = 1,
) -> nn.Module:
    """Serves ``model``'s ``nn.Linear`` layers (fused with a following ReLU / GELU; a BERT-family
    block's query/key/value as one GEMM) and its Hugging Face attention through the autokernel
    runtime; returns the model, changed in place.

    db: the tuning database (None: kernel defaults). precision, threads: as for
    :class:`autokernel.Runtime` (or pass ``runtime``). ms: the row counts (batch × sequence) to
    plan the packed weights for; others are served too. ``model.autokernel_unsupported``
    lists the modules left to PyTorch, with why; ``model.autokernel_runtime`` is the runtime;
    ``model.autokernel_fused_qkv`` names the self-attention blocks whose projections are fused,
    ``model.autokernel_fused_layer_norm`` the output blocks whose residual LayerNorm is,
    ``model.autokernel_fused_layers`` the encoder layers served whole, in one runtime call.

    torch_threads: PyTorch's intra-op threads while ``model`` runs (restored after each
    forward): the ops left to PyTorch are light, and its spinning OpenMP workers would
    otherwise compete with the runtime's threads for the same cores (a third slower measured
    on BERT-base). None leaves PyTorch's setting alone (e.g. when much of the model stays
    PyTorch's); the setting is process-wide while the forward runs.
    """
    rt = runtime if runtime is not None else Runtime(db, threads=threads, precision=precision)
    ms = [int(m) for m in ms]
    report: list[tuple[str, str]] = []
    replaced: set[int] = set()

    def swap(parent: nn.Module, name: str, full: str, act: Optional[str]) -> bool:
        lin = getattr(parent, name)
        why = _linear_ok(lin)
        if why:
            report.append((full, why))
            return False
        setattr(parent, name, AutokernelLinear(lin, rt, act=act, ms=ms))
        replaced.add(id(getattr(parent, name)))
        return True

    for pname, parent in list(model.named_modules()):
        prefix = f"{pname}." if pname else ""
        # A Hugging Face feed-forward block: dense + intermediate_act_fn.
        dense, act_fn = getattr(parent, "dense", None), getattr(parent, "intermediate_act_fn", None)
        if type(dense) is nn.Linear and isinstance(act_fn, nn.Module):
            act = _classify_act(act_fn)
            if act in _FUSABLE and swap(parent, "dense", prefix + "dense", act):
                parent.intermediate_act_fn = nn.Identity()
        # nn.Sequential(..., Linear, act, ...).
        if isinstance(parent, nn.Sequential):
            items = list(parent._modules.items())
            for (n1, m1), (n2, m2) in zip(items, items[1:]):
                if type(m1) is nn.Linear:
                    act = _classify_act(m2)
                    if act in _FUSABLE and swap(parent, n1, prefix + n1, act):
                        parent._modules[n2] = nn.Identity()
    routed = _install_hf_attention(model, _register(_RUNTIMES, rt), report) if attention else 0
    fused: list[str] = []
    if routed:
        for pname, m in list(model.named_modules()):
            if _fusable_qkv(m):
                _fuse_qkv(m, rt, ms)
                replaced.update(id(x) for x in (m.query, m.key, m.value))
                fused.append(pname)
    for pname, parent in list(model.named_modules()):
        prefix = f"{pname}." if pname else ""
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and id(child) not in replaced:
                swap(parent, name, prefix + name, None)

    fused_outputs = [pname for pname, m in list(model.named_modules()) if _fusable_output(m) and _fuse_output(m, min(ms))]
    modules = dict(model.named_modules())
    qkv_ids = {id(modules[n]) for n in fused}
    out_ids = {id(modules[n]) for n in fused_outputs}
    fused_layers = [
        pname
        for pname, m in list(model.named_modules())
        if _fusable_layer(m, qkv_ids, out_ids) and _fuse_layer(m, rt, min(ms))
    ]
    if torch_threads is not None:
        _limit_torch_threads(model, int(torch_threads))
    for name, m in model.named_modules():
        own = list(m.parameters(recurse=False))
        in_fused = any(name.startswith(f + ".") and name.rsplit(".", 1)[-1] in ("query", "key", "value") for f in fused)
        in_fused = in_fused or any(name == f + ".LayerNorm" for f in fused_outputs)
        if own and not isinstance(m, AutokernelLinear) and not in_fused and not any(n == name for n, _ in report):
            report.append((name, f"{type(m).__name__}: no runtime kernel (left to PyTorch)"))
    model.autokernel_runtime = rt
    model.autokernel_unsupported = report
    model.autokernel_attention_modules = routed
    model.autokernel_fused_qkv = fused
    model.autokernel_fused_layer_norm = fused_outputs
    model.autokernel_fused_layers = fused_layers
    n = sum(isinstance(m, AutokernelLinear) for m in model.modules())
    log.info("autokernel: %d linear layers and %d attention modules served; %d modules left to PyTorch", n, routed, len(report))
    return model


def workloads(model: nn.Module, example_inputs: Any, db: Optional[str] = None, log_path: Optional[str] = None) -> list[str]:
    """The runtime workloads one forward pass of ``model`` on ``example_inputs`` (a tuple of
    positional arguments, or a dict of keyword arguments) calls, each once, in order: the list
    to tune (``autokernel.tune(workloads(...))`` or ``autokernel tune --workloads-from``).

    A model not yet optimized is optimized on a copy (with ``db``, or kernel defaults). Each
    workload the runtime would serve from a fallback level (not tuned for this machine) is
    logged, as the Rust runtime logs it; with ``log_path`` the runtime also appends those to
    that file in the ``--workloads-from`` format.
    """
    if runtime_of(model) is None:
        model = optimize(copy.deepcopy(model), db=db)
    rt = runtime_of(model)
    if log_path is not None:
        rt.log_fallbacks_to(log_path)
    _RECORD.seen = []
    try:
        with torch.no_grad():
            if isinstance(example_inputs, dict):
                model(**example_inputs)
            elif isinstance(example_inputs, (tuple, list)):
                model(*example_inputs)
            else:
                model(example_inputs)
        seen = list(dict.fromkeys(_RECORD.seen))
    finally:
        _RECORD.seen = None
    for w in seen:
        level = rt.lookup(w)["level"]
        if level != "exact":
            log.warning("autokernel: %s served by %s (not tuned for this machine)", w, level)
    return seen
