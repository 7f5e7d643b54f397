"""surecall.core: the living engine. Requests join and leave a running batch at step boundaries.

`blocks` (KV blocks with hash-chained prefix caching), `kv_cache` (the paged K/V pools and the
one object transformers sees), `scheduler` (FCFS continuous batching, chunked prefill,
preemption by recompute), `engine` (`EngineCore.step`: schedule -> forward -> mask + sample ->
advance -> finish). `surecall.AsyncLLM` serves requests on it.

Why this design. nano-vllm's block manager and scheduler (blocks, chained hashes, ref counts,
FCFS with preemption) carry over as they are; its model runner does not, because it rewrites each
model around a flash-attention paged kernel. transformers' own continuous batching
(`PagedAttentionCache`, what `transformers serve` uses) ties the cache to attention kernels
registered for it. We keep the stock Hugging Face modules (any Llama/Qwen/Mistral checkpoint, sdpa or
eager attention) and hand them a duck-typed cache whose `update` writes the step's K/V into block
slots and returns each row's K/V gathered by its block table, with a 4D mask per row. The price is a
gather per layer, paid once per change of the decode batch: decode steps read a dense view the
cache keeps and extends by one column a step (rows that leave are dropped by moving one row). On a
GPU a paged-attention kernel would remove it. `LLM.generate` and `AsyncLLM` both run on this core
(the one decode path). Decode-only steps can run `graph_step` (static buffers, one CUDA graph per
batch bucket; on by default on CUDA, unverified until a GPU run); `masks` builds the 4D masks
(causal, the model's sliding window).
"""

from surecall.core.engine import EngineCore, RequestState, StepOutput

__all__ = ["EngineCore", "RequestState", "StepOutput"]
