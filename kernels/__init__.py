"""surecall.kernels: grammar-masked sampling (mask, sample, logprob, advance) on Triton, with torch references.

`DeviceTable.from_table` puts a TokenTable on a device; `apply_token_mask_inplace`, `sample`
and `advance` are the three per-step operations. CUDA tensors run the Triton kernels, CPU
tensors the torch references (or the Triton interpreter with backend="triton" under
TRITON_INTERPRET=1). Triton is optional at import time.
"""

from surecall.kernels.advance import DEAD_STATE, advance
from surecall.kernels.mask import apply_token_mask_inplace
from surecall.kernels.sample import SampleOutput, SamplingTensors, sample
from surecall.kernels.table import DeviceTable

__all__ = [
    "DEAD_STATE",
    "DeviceTable",
    "SampleOutput",
    "SamplingTensors",
    "advance",
    "apply_token_mask_inplace",
    "sample",
]
