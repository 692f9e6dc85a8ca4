from ._native import AutokernelError as AutokernelError
from ._native import EncoderLayer as EncoderLayer
from ._native import PackedWeight as PackedWeight
from ._native import Runtime as Runtime
from ._native import __version__ as __version__
from ._native import fingerprint as fingerprint
from ._native import tune as tune
