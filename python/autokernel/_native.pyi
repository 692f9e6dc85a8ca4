"""Type stubs of the extension module ``autokernel._native`` (re-exported by ``autokernel``)."""

from os import PathLike
from pathlib import Path
from typing import Any, Iterable, NoReturn, Optional, Sequence, TypeVar, Union, overload

import numpy as np
import numpy.typing as npt

__version__: str

# A float32, C-contiguous numpy array or CPU torch tensor (anything else with copy=True).
Operand = Any
F32Array = npt.NDArray[np.float32]
# An `out=` argument: an op writes into it and returns it (a torch tensor stays one).
_Out = TypeVar("_Out")

class AutokernelError(RuntimeError):
    """An error of the runtime, database or tuner (not of an argument's type or shape)."""

class PackedWeight:
    """A constant weight packed once by ``Runtime.pack_weight`` for ``Runtime.linear``."""

    def __copy__(self) -> PackedWeight: ...  # itself: shared, never copied
    def __deepcopy__(self, _memo: Any) -> PackedWeight: ...  # itself
    def __reduce__(self) -> NoReturn: ...  # TypeError: lives in native memory

    @property
    def in_features(self) -> int: ...
    @property
    def out_features(self) -> int: ...
    @property
    def act(self) -> str: ...
    @property
    def workload(self) -> str: ...
    @property
    def level(self) -> str: ...
    @property
    def config(self) -> str: ...
    @property
    def layouts(self) -> list[tuple[int, int]]: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def dtypes(self) -> list[str]: ...
    @property
    def copies(self) -> int: ...

class EncoderLayer:
    """A BERT-style encoder layer served in one call, made by ``Runtime.encoder_layer``."""

    def __copy__(self) -> EncoderLayer: ...  # itself: shared, never copied
    def __deepcopy__(self, _memo: Any) -> EncoderLayer: ...  # itself
    def __reduce__(self) -> NoReturn: ...  # TypeError: lives in native memory

    @overload
    def __call__(
        self, x: Operand, mask: Optional[Operand] = None, out: None = None, *, copy: bool = False
    ) -> F32Array: ...
    @overload
    def __call__(
        self, x: Operand, mask: Optional[Operand] = None, out: _Out = ..., *, copy: bool = False
    ) -> _Out: ...
    @property
    def hidden(self) -> int: ...
    @property
    def heads(self) -> int: ...
    @property
    def runtime(self) -> Runtime: ...
    def workloads(self, batch: int, seq: int) -> list[str]: ...

class Runtime:
    """Dispatches GEMM, fused linear layers and attention to the best tuned kernel variant."""

    def __copy__(self) -> Runtime: ...  # itself: shared, never copied
    def __deepcopy__(self, _memo: Any) -> Runtime: ...  # itself
    def __reduce__(self) -> NoReturn: ...  # TypeError: lives in native memory

    def __init__(
        self,
        db_path: Union[str, bytes, PathLike, None] = None,
        threads: Optional[int] = None,
        precision: Optional[str] = None,
        max_rel_err: Optional[float] = None,
    ) -> None: ...
    def set_precision(self, precision: str, max_rel_err: Optional[float] = None) -> None: ...
    @property
    def db_path(self) -> Optional[Path]: ...
    @property
    def threads(self) -> int: ...
    @property
    def precision(self) -> str: ...
    @property
    def fingerprint(self) -> str: ...
    @property
    def load_error(self) -> Optional[str]: ...
    @property
    def settings_error(self) -> Optional[str]: ...
    @overload
    def gemm(self, a: Operand, b: Operand, out: None = None, *, copy: bool = False) -> F32Array: ...
    @overload
    def gemm(self, a: Operand, b: Operand, out: _Out = ..., *, copy: bool = False) -> _Out: ...
    @overload
    def linear(
        self,
        x: Operand,
        weight: PackedWeight,
        bias: Optional[Operand] = None,
        act: Optional[str] = None,
        out: None = None,
        *,
        copy: bool = False,
    ) -> F32Array: ...
    @overload
    def linear(
        self,
        x: Operand,
        weight: PackedWeight,
        bias: Optional[Operand] = None,
        act: Optional[str] = None,
        out: _Out = ...,
        *,
        copy: bool = False,
    ) -> _Out: ...
    def pack_weight(
        self,
        w: Operand,
        act: Optional[str] = None,
        ms: Optional[Iterable[int]] = None,
        layout: str = "kn",
        *,
        copy: bool = False,
    ) -> PackedWeight: ...
    @overload
    def attention(
        self,
        q: Operand,
        k: Operand,
        v: Operand,
        causal: bool = False,
        mask: Optional[Operand] = None,
        out: None = None,
        *,
        copy: bool = False,
    ) -> F32Array: ...
    @overload
    def attention(
        self,
        q: Operand,
        k: Operand,
        v: Operand,
        causal: bool = False,
        mask: Optional[Operand] = None,
        out: _Out = ...,
        *,
        copy: bool = False,
    ) -> _Out: ...
    @overload
    def attention_qkv(
        self,
        qkv: Operand,
        heads: int,
        causal: bool = False,
        mask: Optional[Operand] = None,
        out: None = None,
        *,
        copy: bool = False,
    ) -> F32Array: ...
    @overload
    def attention_qkv(
        self,
        qkv: Operand,
        heads: int,
        causal: bool = False,
        mask: Optional[Operand] = None,
        out: _Out = ...,
        *,
        copy: bool = False,
    ) -> _Out: ...
    def add_layer_norm(
        self,
        x: Operand,
        residual: Optional[Operand],
        weight: Operand,
        bias: Operand,
        eps: float = 1e-12,
        *,
        copy: bool = False,
    ) -> Operand: ...
    def encoder_layer(
        self,
        qkv: PackedWeight,
        qkv_bias: Operand,
        out: PackedWeight,
        out_bias: Operand,
        ln1: tuple[Operand, Operand] | list[Operand],
        ffn_up: PackedWeight,
        ffn_up_bias: Operand,
        ffn_down: PackedWeight,
        ffn_down_bias: Operand,
        ln2: tuple[Operand, Operand] | list[Operand],
        heads: int,
        eps: float = 1e-12,
    ) -> EncoderLayer: ...
    @overload
    def encoder(
        self,
        layers: Sequence[EncoderLayer],
        x: Operand,
        mask: Optional[Operand] = None,
        out: None = None,
        *,
        copy: bool = False,
    ) -> F32Array: ...
    @overload
    def encoder(
        self,
        layers: Sequence[EncoderLayer],
        x: Operand,
        mask: Optional[Operand] = None,
        out: _Out = ...,
        *,
        copy: bool = False,
    ) -> _Out: ...
    def lookup(self, workload: str) -> dict[str, Any]: ...
    def reload(self) -> dict[str, Any]: ...
    def info(self) -> dict[str, Any]: ...
    def lookups(self) -> dict[str, Any]: ...
    def skipped(self) -> list[tuple[str, str]]: ...
    def log_fallbacks_to(self, path: Union[str, bytes, PathLike]) -> None: ...
    def set_fallback_check(self, on: bool) -> None: ...

def tune(
    workloads: Union[str, Iterable[str]],
    db: Union[str, bytes, PathLike] = "tuning.db",
    budget: int = 32,
    threads: Optional[int] = None,
    precision: Optional[str] = None,
    strategy: str = "model",
    seed: int = 0,
    isolation: str = "process",
    finalists: int = 3,
    timeout_s: Optional[float] = None,
    progress: bool = True,
    retry_failed: bool = False,
) -> list[dict[str, Any]]: ...
def fingerprint(threads: Optional[int] = None) -> str: ...
def _serve_worker(threads: int) -> None: ...
def _row_blocks(m: int, n: int, k: int) -> list[int]: ...
def _sequence_blocks(batch: int, heads: int, seq: int, d: int) -> list[int]: ...
