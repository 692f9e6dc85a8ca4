"""Hugging Face models through the runtime: the ``autokernel`` attention implementation
(padded batches as key lengths) and the BERT-family fusions — query/key/value as one GEMM with
attention on its rows, an output block's residual LayerNorm in one call, and a whole encoder
layer in one call — each kept only if it computes what the module's own forward does."""

from __future__ import annotations

import math
import threading
import types
from typing import Optional

import torch
from torch import nn

from . import Runtime
from ._ops import (
    _FUSABLE,
    _LAYERS,
    _RUNTIMES,
    AutokernelLinear,
    FusedActivation,
    _attention_op,
    _attention_qkv_op,
    _encoder_layer_op,
    _encoder_op,
    _linear_add_layer_norm_op,
    _linear_op,
    _register,
    _release,
    call,
    _global_hooks,
    _hooked,
    _hooks_below,
    _linear_ok,
    _needs_grad,
    _Handle,
    _weight_handle,
    _served,
    _stamp,
    _walk,
    _training,
)
from . import _released


_MASKS = threading.local()


def _key_lengths(mask: torch.Tensor, causal: bool, batch: int, seq: int) -> Optional[torch.Tensor]:
    """The key lengths of each of ``batch`` sequences of ``seq`` tokens right-padding ``mask``
    encodes
    (:func:`_read_key_lengths`; a mask of batch 1 holds for every sequence, as PyTorch
    broadcasts it), or None: then the modules' own forwards serve that attention (PyTorch's
    SDPA).

    Always None while ``torch.compile`` or ``torch.export`` traces: the check reads the mask's
    values (data-dependent branching, which ``fullgraph=True`` and export cannot trace), so a
    traced call with a mask runs the layers' own forwards — the fused query/key/value GEMM,
    PyTorch's SDPA on the mask, the fused output blocks and feed-forward linear layers — not
    the runtime's attention nor the whole-layer and whole-encoder calls.

    Within one eager forward of an optimized model (:func:`_remember_masks`), read once per
    mask tensor: the model hands the same mask to every layer, unmodified, and checking it in
    full costs 0.1-0.9 ms a layer on a CPU."""
    if torch.compiler.is_compiling():
        return None
    if mask.dim() != 4 or mask.shape[-1] != seq or mask.shape[-2] not in (1, seq):
        # Not these sequences' mask: the module's own forward says so (PyTorch's SDPA raises
        # on a mask shorter or longer than the sequence; read as lengths it would pass).
        return None
    memo = getattr(_MASKS, "memo", None)
    if memo is None:
        return _for_batch(_read_key_lengths(mask, causal), batch)
    for seen, c, lengths in memo:
        if seen is mask and c == causal:
            return _for_batch(lengths, batch)
    lengths = _read_key_lengths(mask, causal)
    memo.append((mask, causal, lengths))
    return _for_batch(lengths, batch)


def _for_batch(lengths: Optional[torch.Tensor], batch: int) -> Optional[torch.Tensor]:
    """Key ``lengths`` for ``batch`` sequences: as they are, repeated from a mask of batch 1,
    or None when the mask's batch is another."""
    if lengths is None or lengths.shape[0] == batch:
        return lengths
    return lengths.expand(batch).contiguous() if lengths.shape[0] == 1 else None


def _remember_masks(model: nn.Module) -> None:
    """Hooks under which each forward of ``model`` reads a mask's key lengths once
    (:func:`_key_lengths`); forgotten when the forward ends, however it ends. (Module-level
    functions, not closures, which ``pickle`` refuses with a message about a local object:
    pickling the model reaches the clear refusal of the runtime's objects instead.)"""
    model.register_forward_pre_hook(_start_mask_memo)
    model.register_forward_hook(_end_mask_memo, always_call=True)


def _start_mask_memo(module: nn.Module, args) -> None:
    """Forward pre-hook: an empty memo of masks read (:func:`_key_lengths`)."""
    _MASKS.memo = []


def _end_mask_memo(module: nn.Module, args, out) -> None:
    """Forward hook: forgets the masks read."""
    _MASKS.memo = None


def _read_key_lengths(mask: torch.Tensor, causal: bool) -> Optional[torch.Tensor]:
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
    empty = lengths == 0
    if mask.dtype != torch.bool and bool(empty.any()) and bool(torch.isfinite(mask[empty]).any()):
        # A sequence with no key left, masked by finite numbers: softmax spreads its weights
        # evenly over every key, where no key at all gives zeros.
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
        and not (torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)))
    )
    lengths = None
    if plain and attention_mask is not None:
        lengths = _key_lengths(attention_mask, causal, query.shape[0], query.shape[-2])
        plain = lengths is not None
    if not plain:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    o = call(_attention_op, query, key, value, handle, causal, lengths)
    return o.transpose(1, 2).contiguous(), None


def _install_hf_attention(model: nn.Module, handle: int, report: list) -> int:
    """Routes a transformers model's attention through the runtime; returns the modules routed."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "_attn_implementation"):
        return 0
    chosen = config._attn_implementation
    if chosen not in (None, "sdpa"):
        # Chosen on purpose (eager returns attention weights; the runtime's attention, as
        # SDPA, does not): kept, and with it the blocks' own forwards.
        report.append(("<attention>", f"attn_implementation '{chosen}' kept (the runtime serves in place of 'sdpa')"))
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


# The fewest rows a probe of a block with attention has (with one, attention is the value
# projection whatever its scaling).
_PROBE_ROWS = 7
# The most: more rows check nothing more (both sides of a probe are f32), and cost time.
_PROBE_MAX_ROWS = 32


def _attention_probes(rows: int, hidden: int, chunk: int = 0) -> list:
    """The probes of a block with attention (argument tuples): one sequence of ``rows`` rows
    (within :data:`_PROBE_ROWS` and :data:`_PROBE_MAX_ROWS`, rounded up to a multiple of a
    feed-forward ``chunk`` size, which transformers requires), no mask; and two such
    sequences, the second right-padded to half, with the 4-D mask a model hands its layers
    (boolean, True = attend): a block that treats the mask its own way is not fused."""
    rows = min(max(rows, _PROBE_ROWS), _PROBE_MAX_ROWS)
    rows = _whole_chunks(rows, chunk)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, rows, hidden, generator=g)
    pair = torch.randn(2, rows, hidden, generator=g)
    keys = torch.arange(rows)
    lengths = torch.tensor([rows, rows // 2 + 1])
    mask = (keys[None, :] < lengths[:, None])[:, None, None, :].expand(2, 1, rows, rows)
    return [(x,), (pair, mask)]


def _whole_chunks(rows: int, chunk: int) -> int:
    """``rows`` rounded up to a multiple of ``chunk`` (a ``chunk_size_feed_forward``; 0: none)."""
    return -(-rows // chunk) * chunk if chunk and chunk > 0 else rows


def _chunk_size(m: nn.Module) -> int:
    """The feed-forward chunk size (``chunk_size_feed_forward``) of the layers under ``m``,
    its own included; 0 without one. Chunking splits the rows of a feed-forward that treats
    each row alone: one runtime call over all of them computes the same (the probes check it,
    with row counts it divides)."""
    return max((getattr(c, "chunk_size_feed_forward", 0) or 0 for c in m.modules()), default=0)


# The self-attention blocks whose projections are fused: the names of their query, key and
# value Linear layers, and what their forward applies after attention (its tail): nothing
# (BERT's returns attention's output), an output projection (DistilBERT's ``out_lin``), or an
# output projection and a LayerNorm of the block's input plus its output (ALBERT's ``dense``
# and ``LayerNorm``). ALBERT's is listed first: BERT's rule alone would match it too.
_QKV_NAMES = (
    (("query", "key", "value"), ("dense", "LayerNorm")),
    (("query", "key", "value"), ()),
    (("q_lin", "k_lin", "v_lin"), ("out_lin",)),
)


def _fusable_qkv(m: nn.Module) -> Optional[tuple]:
    """The :data:`_QKV_NAMES` entry of ``m`` if it is a Hugging Face BERT-family self-attention
    block (query, key and value Linear layers of one input, heads of ``attention_head_size``;
    BERT's, RoBERTa's, DistilBERT's, ALBERT's) whose three projections can be one GEMM; else
    None."""
    if _hooks_below(m) or not all(hasattr(m, a) for a in ("config", "attention_head_size", "scaling")):
        return None
    for names, tail in _QKV_NAMES:
        lins = [getattr(m, n, None) for n in names]
        if (
            all(type(x) is nn.Linear and _linear_ok(x) is None for x in lins)
            and len({(x.in_features, x.out_features, x.bias is None) for x in lins}) == 1
            and _tail_fits(m, tail, lins[0].in_features)
        ):
            return names, tail
    return None


def _tail_fits(m: nn.Module, tail: tuple, hidden: int) -> bool:
    """Whether block ``m`` has the modules its :data:`_QKV_NAMES` ``tail`` names: an output
    projection ``nn.Linear`` and, after it, an affine ``nn.LayerNorm`` of the block's width."""
    if not tail:
        return True
    if type(getattr(m, tail[0], None)) is not nn.Linear:
        return False
    if len(tail) == 1:
        return True
    ln = getattr(m, tail[1], None)
    return (
        isinstance(ln, nn.LayerNorm)
        and ln.weight is not None
        and ln.bias is not None
        and tuple(ln.normalized_shape) == (hidden,)
    )


def _qkv_tail(m: nn.Module, ctx: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """What fused block ``m``'s forward applies to attention's output ``ctx`` (its
    :data:`_QKV_NAMES` tail; ``x`` the block's input): nothing, its output projection, or
    ``LayerNorm(x + projection(ctx))`` — one runtime call (the linear layer, then the residual
    add and LayerNorm in place) once the projection is served by the runtime."""
    tail = m._autokernel_qkv_names[1]
    if not tail:
        return ctx
    proj = getattr(m, tail[0])
    if len(tail) == 1:
        return proj(ctx)
    ln = getattr(m, tail[1])
    if isinstance(proj, AutokernelLinear) and proj.act is None and x.shape == ctx.shape:
        proj.refresh()
        bias = None if proj.bias is None else proj.bias.detach()
        return call(
            _linear_add_layer_norm_op, ctx, proj.handle.id, bias, x, ln.weight.detach(), ln.bias.detach(), float(ln.eps)
        )
    return ln(x + proj(ctx))


def _qkv_linears(m: nn.Module) -> list:
    """Fused block ``m``'s query, key and value Linear layers."""
    return [getattr(m, n) for n in m._autokernel_qkv_names[0]]


def _fuse_qkv(m: nn.Module, names: tuple, rt: Runtime, f32: Runtime, ms: list) -> bool:
    """Packs ``m``'s query, key and value weights as one (3·H × hidden) weight and serves the
    block's forward with one GEMM for the three projections (one quantisation of the input in
    int8), the runtime's attention after it. The three Linear layers stay (their parameters,
    for ``state_dict`` and for the calls the fused forward hands back to the original one).
    Done only if that computes what the block's own forward does on a probe of ``min(ms)``
    rows (at least :data:`_PROBE_ROWS`): a block that looks like BERT's but does more (ESM's
    scales the query first and may rotate it; one that applies its tail modules otherwise
    than :func:`_qkv_tail`) or takes other arguments (cross-attention) is left as it is. ``names`` is its :data:`_QKV_NAMES` entry; ``f32``
    the defaults-only runtime of ``rt``'s threads the probe runs on."""
    m._autokernel_qkv_names = names
    m._autokernel_qkv_key = _qkv_key(m)
    m._autokernel_qkv = _weight_handle(rt, None)
    # The probe compares with the block's own forward, whose projections are PyTorch's f32
    # ones: so the fused projection and both sides' attention are probed in f32 (a runtime of
    # the same threads, defaults only), then packed for `rt` (whose precision may be int8 or
    # bf16: two bf16 attentions of inputs a rounding apart differ by more than the probe's
    # tolerance).
    m._autokernel_qkv_packing = (f32, list(ms))
    _refresh_qkv(m)
    served_by = m.__dict__.get("_autokernel_runtime")
    m._autokernel_runtime = _register(_RUNTIMES, f32)
    probes = _attention_probes(min(ms), _qkv_linears(m)[0].in_features)
    try:
        ok = _swap_forward_if_same(m, _fused_self_attention, probes, result=lambda y: y[0] if isinstance(y, tuple) else y)
    finally:
        _release(_RUNTIMES, m._autokernel_runtime)
        if served_by is None:
            del m._autokernel_runtime
        else:
            m._autokernel_runtime = served_by
    m._autokernel_qkv_packing, m._autokernel_qkv_stamp = (rt, list(ms)), None
    if ok:
        _refresh_qkv(m)
    else:
        m._autokernel_qkv.release()
        for attr in ("_autokernel_qkv", "_autokernel_qkv_packing", "_autokernel_qkv_bias", "_autokernel_qkv_stamp",
                     "_autokernel_qkv_names", "_autokernel_qkv_key"):
            m.__dict__.pop(attr, None)
    return ok


def _qkv_key(m: nn.Module) -> tuple:
    """What fused block ``m``'s calls are made of besides parameter values: its query, key and
    value layers and tail modules (the objects themselves: ``copy.deepcopy`` maps a key to
    the copy's) and its tail LayerNorm's epsilon. A block whose
    key changed after ``optimize`` (a module replaced, by an adapter library say) runs its
    own forward from then on."""
    names, tail = m._autokernel_qkv_names
    mods = tuple(getattr(m, n, None) for n in (*names, *tail))
    return mods, getattr(mods[-1], "eps", None)


def _refresh_qkv(m: nn.Module) -> None:
    """Packs fused block ``m``'s three projections (and joins their biases) again if any of
    them changed since they were packed (a no-op otherwise)."""
    stamp = _qkv_stamp(m)
    if stamp is None or getattr(m, "_autokernel_qkv_stamp", None) == stamp:
        return
    _pack_qkv(m, stamp)


def _qkv_stamp(m: nn.Module) -> Optional[tuple]:
    """The :func:`_stamp` of fused block ``m``'s query, key and value parameters."""
    return _stamp(t for x in _qkv_linears(m) for t in (x.weight, x.bias))


def _pack_qkv(m: nn.Module, stamp: Optional[tuple]) -> None:
    """Packs fused block ``m``'s three projections as they are now (and joins their biases),
    recording ``stamp`` as packed."""
    lins = _qkv_linears(m)
    rt, ms = m._autokernel_qkv_packing
    weights = [x.weight for x in lins]
    with torch.no_grad():
        if any(_released.is_released(w) for w in weights):
            # One of the three replaced alone cannot be packed: they are packed as one.
            replaced = sum(not _released.is_released(w) for w in weights)
            if replaced:
                raise _released.partly_replaced(_released.name_of(m), replaced)
            packed = _released.packed_copy(m, weights, _released.name_of(m), "its query/key/value weight")
        else:
            packed = rt.pack_weight(torch.cat([w.detach() for w in weights]), ms=ms, layout="nk")
        bias = None if lins[0].bias is None else torch.cat([x.bias.detach() for x in lins])
    m._autokernel_qkv.set((rt, packed))
    m._autokernel_qkv_bias = bias
    m._autokernel_qkv_stamp = stamp


# Keyword arguments that mean a decoder cache or cross-attention: left to the original forward.
_NOT_FUSED_KWARGS = ("cache", "past_key_values", "past_key_value", "encoder_hidden_states")


def _why_own_forward(m: nn.Module, hidden_states: torch.Tensor, args: tuple, kwargs: dict) -> Optional[str]:
    """Why fused self-attention block ``m`` must run its own forward for this call, or None."""
    if args:
        return "positional arguments past the mask"
    given = next((n for n in _NOT_FUSED_KWARGS if kwargs.get(n) is not None), None)
    if given is not None:
        return f"a {given} argument"
    if _training(m):
        return "training mode"
    if _qkv_key(m) != m._autokernel_qkv_key:
        return "a module of the block replaced after optimize"
    if _hooks_below(m):
        return "hooks on a module inside it, or global module hooks"
    if not _served(hidden_states):
        return f"a {hidden_states.dtype} input on {hidden_states.device.type}"
    if _needs_grad(hidden_states, m.parameters()):
        return _released.grad_reason(hidden_states)
    implementation = getattr(m.config, "_attn_implementation", None)
    if implementation != "autokernel":
        return f"the {implementation!r} attention implementation"
    return None


def _fused_self_attention(self, hidden_states, attention_mask=None, *args, **kwargs):
    """A fused self-attention block's forward (see :func:`_fuse_qkv`); the original one for
    what it does not cover (a cache, cross-attention, training, gradients, another dtype,
    another attention implementation)."""
    why = _why_own_forward(self, hidden_states, args, kwargs)
    if why is not None:
        if any(_released.is_released(x.weight) for x in _qkv_linears(self)):
            raise _released.error(_released.name_of(self), why)
        return self._autokernel_forward(hidden_states, attention_mask, *args, **kwargs)
    _refresh_qkv(self)
    for n in _NOT_FUSED_KWARGS:
        kwargs.pop(n, None)
    h, d = _qkv_linears(self)[0].out_features, self.attention_head_size
    qkv = call(_linear_op, hidden_states, self._autokernel_qkv.id, self._autokernel_qkv_bias)
    causal = bool(kwargs.get("is_causal", getattr(self, "is_causal", False)))
    lengths = None
    plain = (
        hidden_states.dim() == 3
        and math.isclose(self.scaling, d**-0.5, rel_tol=1e-6)
        and not kwargs.get("softcap")
        and not kwargs.get("output_attentions")
    )
    if plain and attention_mask is not None:
        lengths = _key_lengths(attention_mask, causal, hidden_states.shape[0], hidden_states.shape[1])
        plain = lengths is not None
    if plain:
        # Straight from the projection's rows, read in place by the tuned attention.
        heads = h // d
        ctx = call(_attention_qkv_op, qkv, self._autokernel_runtime, heads, causal, lengths)
        return _qkv_tail(self, ctx, hidden_states), None
    shape = (*hidden_states.shape[:-1], -1, d)
    q, k, v = (qkv[..., i * h : (i + 1) * h].view(shape).transpose(1, 2) for i in range(3))
    out, weights = _hf_attention(self, q, k, v, attention_mask, dropout=0.0, scaling=self.scaling, **kwargs)
    return _qkv_tail(self, out.reshape(*hidden_states.shape[:-1], -1).contiguous(), hidden_states), weights


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
    if _hooks_below(m):
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
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, rows, m.dense.in_features, generator=g)
    r = torch.randn(1, rows, m.dense.out_features, generator=g)
    return _swap_forward_if_same(m, _fused_output, [(x, r)])


def _swap_forward_if_same(m: nn.Module, fused, probes: list, result=lambda y: y, in_pytorch: bool = False) -> bool:
    """Makes ``fused`` ``m``'s forward (the original kept as ``m._autokernel_forward``, the type
    it returned on the probe as ``m._autokernel_output``) if it returns what the original does
    on each of the ``probes`` (argument tuples): an object of the same type whose ``result``
    tensor is the same within 1e-4; else leaves ``m`` as it was. With ``in_pytorch``, the
    original is run as PyTorch alone computes it: with the probe's first argument requiring a
    gradient, every part the runtime serves hands the call to its module's own f32 forward."""
    original = m.forward

    def reference(probe):
        if not in_pytorch:
            with torch.no_grad():
                return original(*probe)
        with torch.enable_grad():
            return original(probe[0].detach().requires_grad_(), *probe[1:])

    try:
        wants = [reference(p) for p in probes]
        m._autokernel_forward, m._autokernel_output = original, type(wants[0])
        m.forward = types.MethodType(fused, m)
        def same(probe, want) -> bool:
            with torch.no_grad():
                got = m(*probe)
            a, b = result(want), result(got)
            return (
                type(got) is type(want)
                and isinstance(a, torch.Tensor)
                and a.shape == b.shape
                and torch.allclose(b, a, rtol=1e-4, atol=1e-4)
            )

        ok = all(same(p, w) for p, w in zip(probes, wants))
    except Exception:  # a forward that is not what it looked like
        ok = False
    if not ok:
        m.forward = original
        for attr in ("_autokernel_forward", "_autokernel_output"):
            m.__dict__.pop(attr, None)
    return ok


def _fused_output(self, hidden_states, input_tensor):
    """A fused output block's forward (see :func:`_fuse_output`); the original one for what
    it does not cover (training, gradients, another dtype or shape)."""
    ln = self.LayerNorm
    if (
        _training(self)
        or not (isinstance(self.dense, AutokernelLinear) and self.dense.act is None)
        or not isinstance(ln, nn.LayerNorm)
        or _hooks_below(self)
        or not (_served(hidden_states) and _served(input_tensor))
        or _needs_grad(hidden_states, self.parameters())
        or _needs_grad(input_tensor, self.parameters())
        or input_tensor.shape != (*hidden_states.shape[:-1], self.dense.out_features)
    ):
        return self._autokernel_forward(hidden_states, input_tensor)
    self.dense.refresh()
    bias = None if self.dense.bias is None else self.dense.bias.detach()
    return call(
        _linear_add_layer_norm_op,
        hidden_states, self.dense.handle.id, bias, input_tensor, ln.weight.detach(), ln.bias.detach(), float(ln.eps)
    )


def _layer_parts(m: nn.Module) -> Optional[tuple]:
    """The parts of a BERT-family encoder layer ``m``, by name: ``(self-attention block,
    attention output Linear, its LayerNorm, feed-forward up Linear, down Linear, their
    LayerNorm)`` — BERT's and RoBERTa's (``attention.self``, ``attention.output``,
    ``intermediate``, ``output``), DistilBERT's (``attention``, ``sa_layer_norm``, ``ffn``,
    ``output_layer_norm``) or ALBERT's (``attention`` with its ``dense`` and ``LayerNorm``,
    ``ffn``, ``ffn_output``, ``full_layer_layer_norm``); None for another module. What they
    compute is checked apart."""
    att = getattr(m, "attention", None)
    sa, so = getattr(att, "self", None), getattr(att, "output", None)
    inter, out = getattr(m, "intermediate", None), getattr(m, "output", None)
    if sa is not None and so is not None and inter is not None and out is not None:
        parts = (sa, getattr(so, "dense", None), getattr(so, "LayerNorm", None), getattr(inter, "dense", None),
                 getattr(out, "dense", None), getattr(out, "LayerNorm", None))
    elif hasattr(m, "full_layer_layer_norm"):
        parts = (att, getattr(att, "dense", None), getattr(att, "LayerNorm", None), getattr(m, "ffn", None),
                 getattr(m, "ffn_output", None), m.full_layer_layer_norm)
    else:
        ffn = getattr(m, "ffn", None)
        parts = (att, getattr(att, "out_lin", None), getattr(m, "sa_layer_norm", None), getattr(ffn, "lin1", None),
                 getattr(ffn, "lin2", None), getattr(m, "output_layer_norm", None))
    return None if any(x is None for x in parts) else parts


def _layer_unfusable(m: nn.Module, qkv_fused: set, outputs_fused: set) -> Optional[str]:
    """Why ``m``, a BERT-family encoder layer (:func:`_layer_parts`), cannot be served as one
    runtime call; ``""`` when it can — its parts all served by the runtime already: its
    query/key/value fused, its feed-forward Linear with its activation, and — BERT's — its
    two output blocks (residual add and LayerNorm) fused; or — DistilBERT's, ALBERT's — its
    two residual LayerNorms affine ones of the hidden width. None when ``m`` is no such layer."""
    parts = _layer_parts(m)
    if parts is None:
        return None
    if _hooks_below(m):
        return "hooks on a module inside it"
    sa, out_dense, ln1, up, down, ln2 = parts
    if _training(m):
        return "in training mode when optimized (its dropout on, the fusions' probes differ): call model.eval() before optimize"
    if id(sa) not in qkv_fused:
        return "its query/key/value projections are not fused (model.autokernel_fused_qkv)"
    if not (isinstance(up, AutokernelLinear) and up.act in _FUSABLE):
        return "its feed-forward activation is not fused into its Linear"
    if not all(isinstance(x, AutokernelLinear) and x.act is None for x in (out_dense, down)):
        return "an output projection is not served by the runtime"
    if getattr(m, "is_decoder", False) or hasattr(m, "crossattention"):
        return "a decoder layer"
    inter = getattr(m, "intermediate", None)
    if inter is not None:  # BERT's
        if not (id(m.attention.output) in outputs_fused and id(m.output) in outputs_fused):
            return "an output block's residual LayerNorm is not fused (model.autokernel_fused_layer_norm)"
        if not isinstance(_layer_activation(m), FusedActivation):
            return "its feed-forward activation is not fused into its Linear"
    else:  # DistilBERT's (its activation in ``ffn``) or ALBERT's (in the layer)
        if not isinstance(_layer_activation(m), FusedActivation):
            return "its feed-forward activation is not fused into its Linear"
        norms = (ln1, ln2)
        if not all(isinstance(x, nn.LayerNorm) and x.weight is not None and x.bias is not None for x in norms):
            return "a residual LayerNorm without weight and bias"
        if any(tuple(x.normalized_shape) != (out_dense.out_features,) for x in norms):
            return "a residual LayerNorm of another width"
    d = sa.attention_head_size
    if getattr(sa, "is_causal", False):
        return "causal attention"
    if not math.isclose(sa.scaling, d**-0.5, rel_tol=1e-6):
        return f"attention scaled by {sa.scaling}, not 1/sqrt({d})"
    if ln1.eps != ln2.eps:
        return f"its two LayerNorms' epsilons differ ({ln1.eps}, {ln2.eps})"
    if _qkv_linears(sa)[0].out_features != out_dense.in_features:
        return "its attention's width is not its output projection's input"
    return ""


def _fuse_layer(m: nn.Module, rt: Runtime, f32: Runtime, rows: int) -> bool:
    """Serves encoder layer ``m`` as one runtime call (an :class:`autokernel.EncoderLayer`
    over the weights its parts already packed). Done only if that computes what the layer's
    own forward does in PyTorch on a probe of ``rows`` rows — both in f32 (the layer probed
    packed by ``f32``, a defaults-only runtime of ``rt``'s threads, then made for ``rt``): in int8 or
    bf16, rounding a LayerNorm's output a little differently moves the next GEMM's result by
    more than the probe's tolerance."""
    # The stamp before the packing: a change made meanwhile is seen at the next call.
    m._autokernel_layer_packing = (rt, _stamp(_walk(m)[1]))
    m._autokernel_layer_key = _layer_key(m)
    probes = _attention_probes(rows, _layer_parts(m)[1].out_features, _chunk_size(m))
    m._autokernel_layer = _Handle(_LAYERS, _f32_layer(m, f32, probes[0][0].shape[1]))
    ok = _swap_forward_if_same(m, _fused_layer, probes, in_pytorch=True)
    if ok:
        m._autokernel_layer.set(_encoder_layer(m, rt))
    else:
        m._autokernel_layer.release()
        del m._autokernel_layer, m._autokernel_layer_packing, m._autokernel_layer_key
    return ok


def _layer_activation(m: nn.Module) -> Optional[nn.Module]:
    """The module standing where encoder layer ``m``'s feed-forward activation was: BERT's
    ``intermediate.intermediate_act_fn``, DistilBERT's ``ffn.activation``, ALBERT's
    ``activation``."""
    inter = getattr(m, "intermediate", None)
    if inter is not None:
        return getattr(inter, "intermediate_act_fn", None)
    return getattr(m if hasattr(m, "full_layer_layer_norm") else getattr(m, "ffn", None), "activation", None)


def _layer_key(m: nn.Module) -> Optional[tuple]:
    """What fused encoder layer ``m``'s runtime call is made of besides parameter values: its
    parts, its query/key/value layers and its activation (the objects themselves, which
    ``copy.deepcopy`` maps to the copy's), the activation fused
    into its up projection, its LayerNorms' epsilons. A layer whose key changed after
    ``optimize`` (a module replaced — by an adapter library, say — or an epsilon set) runs its
    own forward from then on."""
    parts = _layer_parts(m)
    if parts is None:
        return None
    sa, _, ln1, up, _, ln2 = parts
    qkv = getattr(sa, "_autokernel_qkv_names", ((), ()))[0]
    mods = (*parts, *(getattr(sa, n, None) for n in qkv), _layer_activation(m))
    return mods, getattr(up, "act", None), getattr(ln1, "eps", None), getattr(ln2, "eps", None)


def _f32_layer(m: nn.Module, f32: Runtime, rows: int):
    """Encoder layer ``m`` as an :class:`autokernel.EncoderLayer` of runtime ``f32``, packed
    from its parameters for ``rows`` rows (the probe of :func:`_fuse_layer`)."""
    sa, out_dense, _, up, down, _ = _layer_parts(m)
    lins = _qkv_linears(sa)

    def pack(w, act=None):
        return f32.pack_weight(w.detach(), act=act, ms=[rows], layout="nk")

    with torch.no_grad():
        qkv = pack(torch.cat([x.weight for x in lins]))
        qkv_bias = torch.cat([_bias(x) for x in lins])
        weights = (pack(out_dense.weight), pack(up.weight, up.act), pack(down.weight))
    return _layer_of(m, f32, qkv, qkv_bias, weights)


def _encoder_layer(m: nn.Module, rt: Runtime):
    """Encoder layer ``m`` as an :class:`autokernel.EncoderLayer`, from the weights its parts
    packed (packed again first where they changed)."""
    sa, out_dense, _, up, down, _ = _layer_parts(m)
    _refresh_qkv(sa)
    for lin in (out_dense, up, down):
        lin.refresh()
    _, qkv = sa._autokernel_qkv.get()
    qkv_bias = sa._autokernel_qkv_bias
    qkv_bias = torch.zeros(qkv.out_features) if qkv_bias is None else qkv_bias
    return _layer_of(m, rt, qkv, qkv_bias, (out_dense.packed, up.packed, down.packed))


def _layer_of(m: nn.Module, rt: Runtime, qkv, qkv_bias: torch.Tensor, weights: tuple):
    """Encoder layer ``m`` as an :class:`autokernel.EncoderLayer` of ``rt`` over the packed
    ``qkv`` weight (with ``qkv_bias``) and ``weights``: its attention output, feed-forward up
    and down weights, packed by ``rt``; its biases and LayerNorms from its parameters."""
    sa, out_dense, ln1, up, down, ln2 = _layer_parts(m)
    out_w, up_w, down_w = weights

    def norm(ln):
        return (ln.weight.detach(), ln.bias.detach())

    with torch.no_grad():
        return rt.encoder_layer(
            qkv, qkv_bias,
            out_w, _bias(out_dense), norm(ln1),
            up_w, _bias(up),
            down_w, _bias(down), norm(ln2),
            heads=out_dense.in_features // sa.attention_head_size, eps=float(ln1.eps),
        )


def _bias(lin: nn.Module) -> torch.Tensor:
    """Linear ``lin``'s bias, or zeros where it has none."""
    return torch.zeros(lin.out_features) if lin.bias is None else lin.bias.detach()


def _fused_layer(self, hidden_states, attention_mask=None, *args, **kwargs):
    """A fused encoder layer's forward (see :func:`_fuse_layer`); the original one for what it
    does not cover (cross-attention, a cache, training, gradients, another dtype, a mask
    that is not right padding)."""
    plain = not any(a is not None for a in args) and _plain_layer_call(kwargs)
    handle = _layer_handle(self, hidden_states) if plain else None
    lengths = None
    if handle is not None and attention_mask is not None:
        lengths = _key_lengths(attention_mask, False, hidden_states.shape[0], hidden_states.shape[1])
        handle = None if lengths is None else handle
    if handle is None:
        return self._autokernel_forward(hidden_states, attention_mask, *args, **kwargs)
    return call(_encoder_layer_op, hidden_states, handle, lengths)


def _plain_layer_call(kwargs: dict) -> bool:
    """Whether an encoder layer (or encoder) call with keyword arguments ``kwargs`` is one the
    fused forwards serve: no cross-attention, cache or attention weights asked for."""
    return not (
        any(kwargs.get(n) is not None for n in _NOT_FUSED_KWARGS + ("encoder_attention_mask",))
        or kwargs.get("output_attentions")
    )


def _layer_handle(layer: nn.Module, hidden_states: torch.Tensor) -> Optional[int]:
    """The runtime handle of fused encoder ``layer`` for a call on ``hidden_states`` (its
    packing refreshed first if its parameters changed), or None when the runtime cannot serve
    that call (training, a module in training mode, gradients, another dtype or shape,
    another attention implementation, a part replaced after ``optimize``)."""
    if not _served(hidden_states) or hidden_states.dim() != 3:
        return None
    if _layer_key(layer) != layer._autokernel_layer_key:
        return None
    # The parameters as they are now: one replaced by a new Parameter is seen too.
    own_forward, params = _walk(layer)
    if (
        own_forward
        or _needs_grad(hidden_states, params)
        or getattr(_layer_parts(layer)[0].config, "_attn_implementation", None) != "autokernel"
    ):
        return None
    stamp = _stamp(params)
    if stamp not in (None, layer._autokernel_layer_packing[1]):
        _pack_layer(layer, stamp)
    return layer._autokernel_layer.id


def _pack_layer(layer: nn.Module, stamp: Optional[tuple]) -> None:
    """Makes fused encoder ``layer``'s runtime layer again from its parameters as they are now
    (its parts packed again first where their stamps changed), recording ``stamp`` (of
    ``_walk(layer)[1]``, taken before) as packed."""
    rt, _ = layer._autokernel_layer_packing
    fresh = _encoder_layer(layer, rt)
    layer._autokernel_layer.set(fresh)
    layer._autokernel_layer_packing = (rt, stamp)


def _repack(model: nn.Module) -> None:
    """Packs every packed weight and fused block of optimized ``model`` again from its
    parameters as they are now, whatever their stamps say (see ``autokernel.torch.refresh``):
    linear layers and fused projections first, then the encoder layers made from them."""
    modules = list(model.modules())
    for m in modules:
        if isinstance(m, AutokernelLinear) and not _released.is_released(m.weight):
            m._pack(_stamp((m.weight, m.bias)))
        if hasattr(m, "_autokernel_qkv_packing") and not any(_released.is_released(x.weight) for x in _qkv_linears(m)):
            _pack_qkv(m, _qkv_stamp(m))
    for m in modules:
        if hasattr(m, "_autokernel_layer"):
            _pack_layer(m, _stamp(_walk(m)[1]))


def _release_weights(model: nn.Module) -> list[str]:
    """Releases the float32 weights of optimized ``model`` that the runtime serves from packed
    copies alone — its :class:`AutokernelLinear` layers' and its fused query/key/value
    projections' (a decoder's excepted: its cache calls run the block's own forward) —
    replacing each by a Parameter on the ``meta`` device (its shape, no values) and recording a
    :class:`autokernel._released.Release` on the module serving it. A weight shared with a
    module the runtime does not serve (a decoder tied to the embeddings) is kept. Returns the
    names of the parameters released."""
    slots: dict[int, list] = {}  # each parameter's places: (module, attribute name)
    names: dict[int, str] = {}
    for path, m in model.named_modules(remove_duplicate=False):
        names.setdefault(id(m), path)
        for attr, p in m._parameters.items():
            if p is not None:
                slots.setdefault(id(p), []).append((m, attr))
    groups = []  # (serving module, its weights' modules, packed copy)
    for m in model.modules():
        if isinstance(m, AutokernelLinear):
            groups.append((m, [m], m.packed))
        elif hasattr(m, "_autokernel_qkv_packing") and not _decoder(m):
            groups.append((m, _qkv_linears(m), m._autokernel_qkv.get()[1]))
    serving = {(id(x), "weight") for _, parts, _ in groups for x in parts}
    metas: dict[int, nn.Parameter] = {}
    released = []
    for m, parts, packed in groups:
        weights = [x.weight for x in parts]
        if not all(all((id(o), a) in serving for o, a in slots[id(w)]) for w in weights):
            continue
        for w in weights:
            if id(w) not in metas:
                metas[id(w)] = nn.Parameter(torch.empty_like(w, device="meta"), requires_grad=False)
                released.append(f"{names[id(slots[id(w)][0][0])]}.{slots[id(w)][0][1]}".lstrip("."))
                for o, a in slots[id(w)]:
                    setattr(o, a, metas[id(w)])
        _released.mark(m, _released.Release(names[id(m)], parts, packed))
        for x in parts:
            if x is not m:
                _released.mark(x, _released.Release(names[id(x)], [x], None))
                _released.refuse_calls(x)
    for m in model.modules():  # nothing to pack again: the stamps as they are now
        if isinstance(m, AutokernelLinear):
            m._stamp = _stamp((m.weight, m.bias))
        if hasattr(m, "_autokernel_qkv_packing"):
            m._autokernel_qkv_stamp = _qkv_stamp(m)
        if hasattr(m, "_autokernel_layer"):
            m._autokernel_layer_packing = (m._autokernel_layer_packing[0], _stamp(_walk(m)[1]))
    return released


def _decoder(m: nn.Module) -> bool:
    """Whether self-attention block ``m`` belongs to a decoder (whose calls with a cache run its
    own forward)."""
    return bool(getattr(m, "is_decoder", False) or getattr(getattr(m, "config", None), "is_decoder", False))


def _encoder_steps(m: nn.Module) -> Optional[list]:
    """The layers encoder ``m`` runs, in order, if it is a BERT-family encoder: its only child
    a ``layer`` list (BERT's, RoBERTa's, ELECTRA's, DistilBERT's), or ALBERT's
    ``embedding_hidden_mapping_in`` and ``albert_layer_groups`` — ``num_hidden_layers`` steps,
    step ``i`` running the layers of group ``int(i / (num_hidden_layers / num_hidden_groups))``
    as transformers does (the probe of :func:`_fuse_encoder` checks it). None for another
    module."""
    layers = getattr(m, "layer", None)
    if isinstance(layers, nn.ModuleList) and set(m._modules) == {"layer"}:
        return list(layers)
    groups, config = getattr(m, "albert_layer_groups", None), getattr(m, "config", None)
    if not (
        isinstance(groups, nn.ModuleList)
        and len(groups) > 0
        and set(m._modules) == {"embedding_hidden_mapping_in", "albert_layer_groups"}
        and all(set(g._modules) == {"albert_layers"} for g in groups)
        and isinstance(getattr(config, "num_hidden_layers", None), int)
        and getattr(config, "num_hidden_groups", None) == len(groups)
    ):
        return None
    n, g = config.num_hidden_layers, len(groups)
    return [x for i in range(n) for x in groups[int(i / (n / g))].albert_layers]


def _encoder_input(m: nn.Module) -> Optional[nn.Module]:
    """What encoder ``m`` applies to its input before its layers: ALBERT's projection of the
    embeddings (``embedding_hidden_mapping_in``), or None."""
    return getattr(m, "embedding_hidden_mapping_in", None)


def _fusable_encoder(m: nn.Module, layers_fused: set) -> bool:
    """Whether ``m`` is a BERT-family encoder (:func:`_encoder_steps`) whose layers are all
    served whole (:func:`_fuse_layer`), and its input projection (ALBERT's), if any, served
    by the runtime."""
    steps = _encoder_steps(m)
    before = _encoder_input(m)
    return (
        bool(steps)
        and all(id(x) in layers_fused for x in steps)
        and (before is None or (isinstance(before, AutokernelLinear) and before.act is None))
    )


def _fuse_encoder(m: nn.Module, rows: int) -> bool:
    """Serves encoder ``m``'s whole stack of fused layers as one runtime call
    (``Runtime.encoder``: one release of the GIL, one entry into the runtime's threads, and no
    Python between the layers), after its input projection (ALBERT's). Done only if the fused
    forward returns what the encoder's own does on a probe of ``rows`` rows: the same output
    type, the same ``last_hidden_state``."""
    before = _encoder_input(m)
    width = before.in_features if before is not None else _layer_parts(_encoder_steps(m)[0])[1].out_features
    probes = _attention_probes(rows, width, _chunk_size(m))
    return _swap_forward_if_same(m, _fused_encoder, probes, result=lambda y: getattr(y, "last_hidden_state", None))


def _around_layers(m: nn.Module, layers: set):
    """The modules below encoder ``m`` that are not inside one of its ``layers`` (ids): the
    layers themselves (their own hooks run around their forward, which a fused encoder
    skips), the lists and groups holding them, ALBERT's projection. The hooks inside a layer
    are checked with its handle (:func:`_layer_handle`)."""
    for c in m.children():
        yield c
        if id(c) not in layers:
            yield from _around_layers(c, layers)


def _fused_encoder(self, hidden_states, attention_mask=None, *args, **kwargs):
    """A fused encoder's forward (see :func:`_fuse_encoder`); the original one for what it does
    not cover: what a fused layer leaves to its original forward, hidden states or attention
    weights asked for, a tuple instead of the output object, hooks on a module below it (a
    layer or group would no longer be called), ALBERT's projection left to PyTorch."""
    steps = _encoder_steps(self)
    before = _encoder_input(self)
    plain = (
        steps is not None
        and not any(a is not None for a in args)
        and _plain_layer_call(kwargs)
        and not (kwargs.get("use_cache") and getattr(getattr(self, "config", None), "is_decoder", True))
        and not kwargs.get("output_hidden_states")
        and kwargs.get("return_dict", True) is not False
        and not _global_hooks()
        and not any(_hooked(c) for c in _around_layers(self, {id(x) for x in steps}))
        and all(getattr(x.forward, "__func__", None) is _fused_layer for x in steps)
        and (
            before is None
            or (
                isinstance(before, AutokernelLinear)
                and before.act is None
                and not _needs_grad(hidden_states, before.parameters())
            )
        )
    )
    if plain:
        # Once per layer module (ALBERT's steps share theirs): it checks the hooks inside it.
        handle = {id(layer): _layer_handle(layer, hidden_states) for layer in steps}
        handles = [handle[id(layer)] for layer in steps]
    else:
        handles = [None]
    lengths = None
    if None not in handles and attention_mask is not None:
        lengths = _key_lengths(attention_mask, False, hidden_states.shape[0], hidden_states.shape[1])
        handles = handles if lengths is not None else [None]
    if None in handles:
        return self._autokernel_forward(hidden_states, attention_mask, *args, **kwargs)
    x = hidden_states if before is None else before(hidden_states)
    y = call(_encoder_op, x, handles, lengths)
    return self._autokernel_output(last_hidden_state=y)
