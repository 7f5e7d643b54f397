"""Server metrics in the Prometheus text format (version 0.0.4), without a client library.

Counters and histograms are updated by the request handlers on the event loop (one thread, so
no locks); gauges (queue depth, running rows, free KV blocks, prefix-cache hit rate, grammar
compiles) are read from the engine when `/metrics` is scraped. Tokens per second is the rate
over a sliding window of the last `window_s` seconds. It does not push anywhere or keep labels
beyond endpoint and status.
"""

from __future__ import annotations

import bisect
import time
from collections import deque

TTFT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last slot is +Inf
        self.total = 0.0
        self.num = 0

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += times
        self.total += value * times
        self.num += times

    def lines(self, name: str) -> list[str]:
        out, running = [], 0
        for bound, count in zip(self.buckets, self.counts, strict=False):
            running += count
            out.append(f'{name}_bucket{{le="{bound}"}} {running}')
        out.append(f'{name}_bucket{{le="+Inf"}} {self.num}')
        out += [f"{name}_sum {self.total:.6f}", f"{name}_count {self.num}"]
        return out


class Metrics:
    def __init__(self, window_s: float = 10.0):
        self.requests: dict[tuple[str, int], int] = {}
        self.ttft = Histogram(TTFT_BUCKETS_S)
        self.itl = Histogram(ITL_BUCKETS_S)
        self.num_prompt_tokens = 0
        self.num_generated_tokens = 0
        self.num_aborted = 0
        self.window_s = window_s
        self._recent: deque[tuple[float, int]] = deque()  # (time, tokens) within the window

    def count_request(self, endpoint: str, status: int) -> None:
        self.requests[(endpoint, status)] = self.requests.get((endpoint, status), 0) + 1

    def count_tokens(self, num_new: int) -> None:
        now = time.monotonic()
        self.num_generated_tokens += num_new
        self._recent.append((now, num_new))
        self._trim(now)

    def tokens_per_s(self) -> float:
        now = time.monotonic()
        self._trim(now)
        return sum(n for _, n in self._recent) / self.window_s

    def _trim(self, now: float) -> None:
        while self._recent and self._recent[0][0] < now - self.window_s:
            self._recent.popleft()

    def render(self, engine_stats: dict, grammar: dict, active: int) -> str:
        """The exposition text: this object's counters plus the engine's gauges at scrape time."""
        lines = ["# TYPE surecall_requests_total counter"]
        for (endpoint, status), n in sorted(self.requests.items()):
            lines.append(f'surecall_requests_total{{endpoint="{endpoint}",status="{status}"}} {n}')
        gauges = {
            "surecall_requests_in_flight": active,
            "surecall_queue_depth": engine_stats.get("num_waiting", 0),
            "surecall_running_rows": engine_stats.get("num_running", 0),
            "surecall_kv_free_blocks": engine_stats.get("free_blocks", 0),
            "surecall_kv_total_blocks": engine_stats.get("num_blocks", 0),
            "surecall_prefix_cache_hit_rate": round(float(engine_stats.get("prefix_hit_rate", 0.0)), 6),
            "surecall_tokens_per_second": round(self.tokens_per_s(), 3),
        }
        counters = {
            "surecall_prompt_tokens_total": self.num_prompt_tokens,
            "surecall_generation_tokens_total": self.num_generated_tokens,
            "surecall_prefix_cache_hit_tokens_total": engine_stats.get("prefix_hit_tokens", 0),
            "surecall_prefix_cache_queried_tokens_total": engine_stats.get("prefix_queried_tokens", 0),
            "surecall_aborted_requests_total": self.num_aborted,
            "surecall_preemptions_total": engine_stats.get("num_preemptions", 0),
            "surecall_grammar_compiles_total": grammar.get("compiles", 0),
            "surecall_grammar_cache_hits_total": grammar.get("hits", 0),
            "surecall_grammar_compile_seconds_total": round(float(grammar.get("compile_s", 0.0)), 6),
        }
        for name, value in gauges.items():
            lines += [f"# TYPE {name} gauge", f"{name} {value}"]
        for name, value in counters.items():
            lines += [f"# TYPE {name} counter", f"{name} {value}"]
        lines += ["# TYPE surecall_time_to_first_token_seconds histogram",
                  *self.ttft.lines("surecall_time_to_first_token_seconds"),
                  "# TYPE surecall_inter_token_latency_seconds histogram",
                  *self.itl.lines("surecall_inter_token_latency_seconds")]
        return "\n".join(lines) + "\n"
