"""PyTorch drop-in: serve a model's linear layers and attention through the autokernel runtime.

    import autokernel.torch
    model = autokernel.torch.optimize(model, db="tuning.db")   # in place; returns the model
    model.autokernel_unsupported                                # [(module name, why)]
    autokernel.torch.workloads(model, (input_ids,))             # what a forward pass calls
    autokernel.torch.refresh(model)                             # after .data ops, fused optimizers
    autokernel.torch.optimize(model, keep_weights=False)        # inference only: f32 weights released

``optimize`` replaces every float32 ``nn.Linear`` by an :class:`AutokernelLinear` whose weight
is packed once; a Linear followed by its activation (a Hugging Face feed-forward block's
``dense`` + ``intermediate_act_fn``, DistilBERT's ``lin1`` + ``activation`` or ALBERT's ``ffn`` +
``activation``, checked on a probe, or ``nn.Sequential(Linear, act)``) becomes one fused
``gemm_bias_<act>`` call (ReLU, tanh GELU, exact-erf GELU). Hugging Face models'
scaled-dot-product attention is served by the runtime through the ``autokernel`` attention
implementation, padded batches included (a right-padding mask becomes per-sequence key
lengths); calls it cannot serve (another mask pattern, dropout, another scale) run PyTorch's
own. A BERT-family self-attention block's query, key and value projections (BERT's and
RoBERTa's ``query``/``key``/``value``, DistilBERT's ``q_lin``/``k_lin``/``v_lin``) become one GEMM
(one packed 3·H × hidden weight: in int8, one quantisation of the input instead of three),
and its attention reads that GEMM's output rows directly (no head split or merge copies in
PyTorch). An output block's ``LayerNorm(dense(x) + input_tensor)`` is one call too (the
residual add and LayerNorm in place, in parallel), and so are a whole encoder layer (BERT's,
RoBERTa's, DistilBERT's) and a whole encoder. The ops are ``torch.library`` custom ops
with fake implementations, so
``torch.compile`` (``fullgraph=True`` too) and ``torch.export`` trace through them. A traced
call cannot read a mask's values: with a mask it runs the layers' own forwards (the fused
projections, PyTorch's SDPA on the mask), not the runtime's attention or whole-layer calls.

Packed weights follow the parameters they were packed from through PyTorch's version
counters: a new Parameter, ``.data =``, ``load_state_dict``, an in-place op on a parameter
(a plain optimizer step) are seen at the next call. Changes PyTorch does not version
(``.data`` ops such as ``p.data.mul_(2)``, fused optimizers such as ``Adam(fused=True)``,
writes through ``p.detach().numpy()``) are not seen: call :func:`refresh` after them.
"""

from __future__ import annotations

import copy
import ctypes
import functools
import gc
import numbers
import threading
import warnings
from collections.abc import Iterable
from typing import Any, Optional

import torch
from torch import nn

from . import Runtime, _released
from ._hf import (_fusable_encoder, _layer_unfusable, _fusable_output, _fusable_qkv, _fuse_encoder, _fuse_layer, _fuse_output, _fuse_qkv,
                  _install_hf_attention, _chunk_size, _whole_chunks, _layer_parts, _qkv_key, _qkv_linears, _release_weights, _remember_masks, _repack)
from ._ops import (_RECORD, _RUNTIMES, AutokernelLinear, FusedActivation, _classify_act, _features, _FUSABLE,
                   _linear_like, _linear_ok, _register, log)

__all__ = ["AutokernelLinear", "FusedActivation", "optimize", "refresh", "workloads", "runtime_of"]


# ---------------------------------------------------------------------------------------------
# optimize / workloads


# Blocks whose Linear feeds its activation: (Linear's name, activation's name, the method that
# runs them) — BERT's, DistilBERT's and ALBERT's feed-forward, the masked-LM heads'
# transforms (BERT's `transform`, ALBERT's `predictions`) and GPT-2's MLP (a Conv1D).
_LINEAR_ACT_PAIRS = (("dense", "intermediate_act_fn", "forward"), ("lin1", "activation", "forward"),
                     ("ffn", "activation", "ff_chunk"), ("dense", "transform_act_fn", "forward"),
                     ("dense", "activation", "forward"), ("c_fc", "act", "forward"))


def _same_when_fused(block: nn.Module, names: tuple, act: str, f32: Runtime, rows: int,
                     method: str = "forward") -> bool:
    """Whether feed-forward ``block`` computes the same with its Linear and activation
    (``names``) as one fused ``act`` call, on a probe of two sequences of ``rows`` rows in f32
    (``f32``, a defaults-only runtime: the model's own precision may round differently),
    through its ``method`` (``forward``, or ALBERT's layer's ``ff_chunk``: the feed-forward
    part of a forward that also attends). A block whose method takes something else than one
    tensor is not fused (what its other arguments do to the activation's input cannot be
    probed)."""
    import inspect

    try:
        params = list(inspect.signature(getattr(type(block), method)).parameters)
    except (AttributeError, TypeError, ValueError):
        return False
    if len(params) != 2:
        return False
    lin, act_fn = (getattr(block, n) for n in names)
    x = torch.randn(2, _whole_chunks(max(rows, 2), _chunk_size(block)), _features(lin)[0],
                    generator=torch.Generator().manual_seed(0))
    probe = AutokernelLinear(lin, f32, act=act, ms=[x.shape[1]])
    try:
        with torch.no_grad():
            want = getattr(block, method)(x)
            setattr(block, names[0], probe)
            setattr(block, names[1], nn.Identity())
            got = getattr(block, method)(x)
    except Exception:  # a forward that is not what it looked like
        return False
    finally:
        setattr(block, names[0], lin)
        setattr(block, names[1], act_fn)
        probe.handle.release()
    return isinstance(got, torch.Tensor) and got.shape == want.shape and torch.allclose(got, want, rtol=1e-4, atol=1e-4)


def runtime_of(model: nn.Module) -> Optional[Runtime]:
    """The runtime an optimized model is served by, or None."""
    return getattr(model, "autokernel_runtime", None)


def refresh(model: nn.Module) -> None:
    """Packs every packed weight and fused block of optimized ``model`` again, now, from its
    parameters as they are (whether or not they look changed).

    An optimized model packs a weight again by itself when PyTorch's version counter or the
    tensor behind it changes (``load_state_dict``, a plain optimizer step, a new Parameter,
    ``.data =``). Changes PyTorch does not version are not seen, and the model keeps serving
    the weights it packed before: ``.data`` ops (``p.data.mul_(2)``, ``p.data.copy_(w)``),
    fused optimizers (``torch.optim.Adam(..., fused=True)``), writes through
    ``p.detach().numpy()``. Call ``refresh(model)`` after them. That covers every parameter
    a fused call copies: linear weights, the joined query/key/value weight and bias, and an
    encoder layer's biases and LayerNorm weights (a fused output block alone reads its
    LayerNorm's parameters at each call). Weights released by ``optimize(...,
    keep_weights=False)`` have nothing to re-read: their packed copies stay.
    """
    if runtime_of(model) is None:
        raise ValueError("refresh(model): the model was not optimized by autokernel.torch.optimize")
    _repack(model)


def _limit_torch_threads(model: nn.Module, n: int) -> None:
    """Runs ``model``'s forward with PyTorch's intra-op threads set to ``n``, restored after.

    PyTorch's OpenMP workers spin for a while after each parallel op; between two runtime
    calls (a LayerNorm, a residual add) they wake, and then spin on the very cores the
    runtime's kernels are about to use. Measured on a 2-core Zen 3 VM, BERT-base batch 1:
    the optimized model took 358 ms with PyTorch on 2 threads, 242 ms with 1 (the runtime on
    2 threads either way), the same as with ``OMP_WAIT_POLICY=PASSIVE``.
    """
    model.register_forward_pre_hook(functools.partial(_set_torch_threads, n))
    model.register_forward_hook(_restore_torch_threads, always_call=True)


# Per thread: PyTorch's thread counts before each optimized forward still running (nested
# forwards, a model inside another, stack up).
_PREV_THREADS = threading.local()


def _set_torch_threads(n: int, module: nn.Module, args) -> None:
    """Forward pre-hook (bound to ``n`` by ``functools.partial``, which pickles, unlike a
    closure): sets PyTorch's intra-op threads to ``n``, the count before pushed."""
    if not torch.compiler.is_compiling():
        stack = _PREV_THREADS.__dict__.setdefault("stack", [])
        stack.append(torch.get_num_threads())
        torch.set_num_threads(n)


def _restore_torch_threads(module: nn.Module, args, out) -> None:
    """Forward hook: restores the thread count :func:`_set_torch_threads` pushed last."""
    stack = getattr(_PREV_THREADS, "stack", None)
    if not torch.compiler.is_compiling() and stack:
        torch.set_num_threads(stack.pop())


def _row_counts(ms: Iterable[int]) -> list[int]:
    """Argument ``ms`` of :func:`optimize` as a list of row counts: integers (numpy's too) of
    at least 1; a str, a bool or a float (which ``int`` would truncate) is a ``TypeError``."""
    if isinstance(ms, (str, bytes)) or not isinstance(ms, Iterable):
        raise TypeError(f"ms={ms!r}: expected a list of row counts, such as [1, 128]")
    counts = []
    for m in ms:
        if isinstance(m, bool) or not isinstance(m, numbers.Integral):
            raise TypeError(f"ms={ms!r} holds {m!r}: expected integer row counts")
        if m < 1:
            raise ValueError(f"ms={ms!r} holds {m!r}: expected row counts of at least 1")
        counts.append(int(m))
    if not counts:
        raise ValueError("ms=[]: give at least one row count")
    return counts


def optimize(
    model: nn.Module,
    db: Optional[str] = None,
    precision: Optional[str] = None,
    threads: Optional[int] = None,
    runtime: Optional[Runtime] = None,
    ms: Iterable[int] = (1, 128),
    attention: bool = True,
    torch_threads: Optional[int] = 1,
    keep_weights: bool = True,
) -> nn.Module:
    """Serves ``model``'s ``nn.Linear`` layers and transformers' ``Conv1D`` ones (GPT-2's),
    fused with a following ReLU / GELU (a BERT-family block's query/key/value as one GEMM), and
    its Hugging Face attention through the autokernel runtime; returns the model, changed in
    place.

    db: the tuning database (None: kernel defaults). precision, threads: as for
    :class:`autokernel.Runtime` (or pass ``runtime`` instead of all three: with it, any of them
    is a ``ValueError``). ms: the row counts (batch × sequence; integers ≥ 1) to plan the packed
    weights for; others are served too. ``model.autokernel_unsupported``
    lists the modules left to PyTorch, with why; ``model.autokernel_runtime`` is the runtime;
    ``model.autokernel_fused_qkv`` names the self-attention blocks whose projections are fused,
    ``model.autokernel_fused_layer_norm`` the output blocks whose residual LayerNorm is,
    ``model.autokernel_fused_layers`` the encoder layers served whole, in one runtime call
    (``model.autokernel_unfused_layers``: ``(name, why)`` of the BERT-family layers that are not),
    ``model.autokernel_fused_encoders`` the encoders whose whole stack of layers is.

    torch_threads: PyTorch's intra-op threads while ``model`` runs (restored after each
    forward): the ops left to PyTorch are light, and its spinning OpenMP workers would
    otherwise compete with the runtime's threads for the same cores (a third slower measured
    on BERT-base). None leaves PyTorch's setting alone (e.g. when much of the model stays
    PyTorch's); the setting is process-wide while the forward runs.

    keep_weights: False releases the float32 weights the runtime serves from its own packed
    copies (the served linear layers' and the fused query/key/value projections'), for
    inference-only use: each becomes a Parameter on the ``meta`` device (its shape, no values),
    the model's parameters stop requiring gradients, and ``model.autokernel_released_weights``
    names them; freed heap pages are handed back to the OS (``gc.collect`` and glibc's
    ``malloc_trim``). Measured on BERT-base: ~360 MB less (README). The
    calls the runtime serves are unchanged; a call that would run such a layer's own PyTorch
    forward (an input that needs gradients or of another dtype or device, a hook inside a fused
    block, training mode, a direct call of a fused projection) raises a ``RuntimeError`` naming
    the layer and why. ``.to()`` and dtype conversions leave released weights as they are. The
    ``state_dict`` holds ``meta`` tensors for them: save the weights before optimizing. Kept: a
    weight shared with a module the runtime does not serve (a decoder tied to the embeddings),
    and a decoder's query/key/value projections (its cache calls run the block's own forward).

    ``copy.deepcopy`` of the optimized model works (the copy shares the runtime, and packs
    its own weights again once they change); pickling it (``torch.save(model)``) raises a
    ``TypeError``: save its ``state_dict`` and optimize the loaded model again.
    """
    if hasattr(model, "autokernel_runtime"):
        raise ValueError(
            "this model was already optimized by autokernel.torch.optimize; optimize the original "
            "model (a second pass would pack its weights twice and stack its thread hooks)"
        )
    if _linear_like(model):
        raise ValueError(
            f"the model is itself a {type(model).__name__}: optimize replaces the layers inside a "
            "model, in place; serve a lone layer as autokernel.torch.AutokernelLinear(layer, "
            "autokernel.Runtime(...)), or optimize a module that holds it"
        )
    if torch_threads is not None and (
        isinstance(torch_threads, bool) or not isinstance(torch_threads, numbers.Integral) or torch_threads < 1
    ):
        raise ValueError(f"torch_threads={torch_threads!r}: expected a whole number ≥ 1, or None")
    ms = _row_counts(ms)
    if not isinstance(keep_weights, bool):
        raise TypeError(f"keep_weights={keep_weights!r}: expected True or False")
    if runtime is not None:
        given = [f"{k}={v!r}" for k, v in (("db", db), ("precision", precision), ("threads", threads)) if v is not None]
        if given:
            raise ValueError(
                f"{', '.join(given)} with runtime=: the runtime has its own database, precision and "
                "threads (give them to autokernel.Runtime, or leave runtime out)"
            )
    rt = runtime if runtime is not None else Runtime(db, threads=threads, precision=precision)
    # Every fusion's probe runs in f32 on both sides, on this one runtime of rt's threads
    # (an invalid AUTOKERNEL_* setting was warned about once already, by rt).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        f32 = Runtime(threads=rt.threads)
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
        # A Hugging Face feed-forward block: BERT's dense + intermediate_act_fn, DistilBERT's
        # lin1 + activation, ALBERT's ffn + activation (checked on a probe: kept only if the
        # block computes the same).
        for lin_name, act_name, method in _LINEAR_ACT_PAIRS:
            lin, act_fn = getattr(parent, lin_name, None), getattr(parent, act_name, None)
            if _linear_like(lin) and isinstance(act_fn, nn.Module):
                act = _classify_act(act_fn)
                if (
                    act in _FUSABLE
                    and _linear_ok(lin) is None
                    and _same_when_fused(parent, (lin_name, act_name), act, f32, min(ms), method)
                    and swap(parent, lin_name, prefix + lin_name, act)
                ):
                    setattr(parent, act_name, FusedActivation(act_fn, getattr(parent, lin_name), parent, lin_name))
        # nn.Sequential(..., Linear, act, ...).
        if isinstance(parent, nn.Sequential):
            items = list(parent._modules.items())
            for (n1, m1), (n2, m2) in zip(items, items[1:]):
                if type(m1) is nn.Linear:
                    act = _classify_act(m2)
                    if act in _FUSABLE and swap(parent, n1, prefix + n1, act):
                        parent._modules[n2] = FusedActivation(m2, parent._modules[n1], parent, n1)
    routed = _install_hf_attention(model, _register(_RUNTIMES, rt), report) if attention else 0
    if routed:
        _remember_masks(model)
    fused: list[str] = []
    if routed:
        for pname, m in list(model.named_modules()):
            names = _fusable_qkv(m)
            if names is not None and _fuse_qkv(m, names, rt, f32, ms):
                replaced.update(id(getattr(m, n)) for n in names[0])
                fused.append(pname)
    for pname, parent in list(model.named_modules()):
        prefix = f"{pname}." if pname else ""
        for name, child in list(parent.named_children()):
            if _linear_like(child) and id(child) not in replaced:
                swap(parent, name, prefix + name, None)

    modules = dict(model.named_modules())
    for pname in fused:  # what each fused block is made of now that its output projection is served
        modules[pname]._autokernel_qkv_key = _qkv_key(modules[pname])
    fused_outputs = [pname for pname, m in list(model.named_modules()) if _fusable_output(m) and _fuse_output(m, min(ms))]
    qkv_ids = {id(modules[n]) for n in fused}
    out_ids = {id(modules[n]) for n in fused_outputs}
    fused_layers, unfused_layers = [], []
    for pname, m in list(model.named_modules()):
        why = _layer_unfusable(m, qkv_ids, out_ids)
        if why == "" and _fuse_layer(m, rt, f32, min(ms)):
            fused_layers.append(pname)
        elif why is not None:
            unfused_layers.append((pname, why or "one runtime call computes something else than its forward on a probe"))
    layer_ids = {id(modules[n]) for n in fused_layers}
    fused_encoders = [
        pname for pname, m in list(model.named_modules()) if _fusable_encoder(m, layer_ids) and _fuse_encoder(m, min(ms))
    ]
    if torch_threads is not None:
        _limit_torch_threads(model, int(torch_threads))
    # Served inside fused calls: the joined projections, and the LayerNorms of fused blocks.
    inside = {id(x) for n in fused for x in _qkv_linears(modules[n])}
    inside |= {id(getattr(modules[n], t)) for n in fused for t in modules[n]._autokernel_qkv_names[1][1:]}
    inside |= {id(modules[n].LayerNorm) for n in fused_outputs}
    inside |= {id(x) for n in fused_layers for x in _layer_parts(modules[n])[2::3]}
    # Parameters the runtime serves: a container whose own parameters are all tied to them (a
    # masked-LM head's bias, its decoder's) computes nothing itself; an embedding table tied
    # to a served decoder is still looked up by PyTorch.
    served = {id(p) for m in model.modules() if isinstance(m, AutokernelLinear) for p in (m.weight, m.bias)}
    for name, m in model.named_modules():
        own = list(m.parameters(recurse=False))
        if m._modules and all(id(p) in served for p in own):
            own = []
        in_fused = id(m) in inside
        if own and not isinstance(m, AutokernelLinear) and not in_fused and not any(n == name for n, _ in report):
            report.append((name, f"{type(m).__name__}: no runtime kernel (left to PyTorch)"))
    released = [] if keep_weights else _release_weights(model)
    if released:
        model.requires_grad_(False)  # inference only: no forward needs its own weights' gradients
        model.register_load_state_dict_post_hook(_released.forget_replaced)
        _return_freed_memory()
    model.autokernel_runtime = rt
    model.autokernel_unsupported = report
    model.autokernel_released_weights = released
    model.autokernel_attention_modules = routed
    model.autokernel_fused_qkv = fused
    model.autokernel_fused_layer_norm = fused_outputs
    model.autokernel_fused_layers = fused_layers
    model.autokernel_unfused_layers = unfused_layers
    model.autokernel_fused_encoders = fused_encoders
    n = sum(isinstance(m, AutokernelLinear) for m in model.modules())
    log.info("autokernel: %d linear layers and %d attention modules served; %d modules left to PyTorch", n, routed, len(report))
    if released:
        log.info("autokernel: released %d float32 weights served from packed copies", len(released))
    return model


def _return_freed_memory() -> None:
    """Collects what was freed and asks glibc to hand freed heap pages back to the OS: its
    dynamic mmap threshold keeps mid-sized tensors (a released weight) in the heap, whose freed
    pages stay resident until trimmed. A no-op where there is no glibc."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


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
