"""`surecall serve`: the OpenAI-compatible server (surecall.server) on uvicorn.

Loads the model once (the shipped surecall-tiny unless `--model DIR`), builds an `AsyncLLM` and
binds the app to 127.0.0.1 unless `--host` says otherwise. SIGTERM or Ctrl-C stops accepting
connections, lets in-flight requests finish for `--grace-s` seconds, aborts what is left, and
exits 0. It needs the `serve` extra (starlette, uvicorn); without it, one line says so.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from surecall.commands.args import device, non_negative_float, non_negative_int, positive_int
from surecall.errors import SurecallError


def _port(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"expected a port in 1-65535, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, metavar="DIR",
                        help="local Hugging Face model directory (default: the shipped surecall-tiny)")
    parser.add_argument("--served-model-name", default=None, metavar="NAME",
                        help="the model id clients send (default: the model directory's name, '_' as '-')")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: loopback only)")
    parser.add_argument("--port", type=_port, default=8000, help="TCP port, 1-65535 (default 8000)")
    parser.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/* (default: none)")
    parser.add_argument("--max-num-seqs", type=positive_int, default=64, help="rows decoded together (default 64)")
    parser.add_argument("--max-queue", type=non_negative_int, default=256,
                        help="requests waiting beyond --max-num-seqs before 429 (default 256)")
    parser.add_argument("--max-num-batched-tokens", type=positive_int, default=2048,
                        help="tokens per engine step, prefill chunks included (default 2048)")
    parser.add_argument("--num-blocks", type=positive_int, default=None, help="KV cache blocks of 16 tokens (default: sized from the model)")
    parser.add_argument("--default-max-tokens", type=positive_int, default=512,
                        help="completion budget when a request sets none (default 512, capped by the context)")
    parser.add_argument("--grace-s", type=non_negative_float, default=10.0,
                        help="seconds in-flight requests get to finish after SIGTERM (default 10)")
    parser.add_argument("--device", default=None, type=device, help="cpu | cuda (default: cuda when available)")
    parser.add_argument("--threads", type=positive_int, default=None, help="CPU intra-op threads (default: 1 for the tiny model)")
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn
    except ImportError as exc:
        raise SurecallError(f"surecall serve needs the serve extra: pip install 'surecall[serve]' ({exc})") from None
    from surecall.async_llm import AsyncLLM
    from surecall.commands.breakeven import set_cpu_threads
    from surecall.models import default_model_dir
    from surecall.server import ServerSettings, build_app

    model_dir = Path(args.model) if args.model else default_model_dir()
    if not model_dir.is_dir():
        raise SurecallError(f"Invalid --model {str(model_dir)!r}: expected a local model directory")
    set_cpu_threads(args.threads, is_tiny=args.model is None)
    name = args.served_model_name or model_dir.name.replace("_", "-")
    engine = AsyncLLM(str(model_dir), device=args.device, max_num_seqs=args.max_num_seqs, num_blocks=args.num_blocks,
                      max_num_batched_tokens=args.max_num_batched_tokens)
    settings = ServerSettings(model_name=name, api_key=args.api_key, max_queue=args.max_queue,
                              default_max_tokens=args.default_max_tokens)
    app = build_app(engine, settings, owns_engine=True)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            timeout_graceful_shutdown=args.grace_s, access_log=args.log_level in ("debug", "info"))
    server = uvicorn.Server(config)
    # uvicorn re-raises the signal it caught once it has shut down; a handler of ours, restored
    # in its place, keeps that from killing the process, so a graceful stop exits 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    print(f"surecall serve: model {name} ({model_dir}) on http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    server.run()
    engine.shutdown()
    return 0
