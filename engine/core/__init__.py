"""surecall.core: the living engine. Requests join and leave a running batch at step boundaries.

`blocks` (KV blocks with hash-chained prefix caching), `kv_cache` (the paged K/V pools and the
one object transformers sees), `scheduler` (FCFS continuous batching, chunked prefill,
preemption by recompute), `engine` (`EngineCore.step`: schedule -> forward -> mask + sample ->
advance -> finish). `surecall.AsyncLLM` serves requests on it.
"""

from surecall.core.engine import EngineCore, RequestState, StepOutput

__all__ = ["EngineCore", "RequestState", "StepOutput"]
