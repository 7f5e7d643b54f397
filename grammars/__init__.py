"""surecall.grammars: tokenizer vocabularies and JSON Schema -> TokenTable compilation.

Ground floor: imports nothing of ours above `surecall.errors`. Public entry points:
`load_vocab`, `Vocab`, `TokenTable`, `GrammarOptions`, `compile_schema`, `compile_catalog`,
`compile_regex`. Rooms: `schema/` (JSON Schema -> regex), `vocab/` (tokenizer bytes),
`automaton` (byte DFA), `tokenwalk` + `compile` (the token table), `cache` (disk cache),
`formats` (per-model tool-call envelopes), `tool_shape` (reading tool definitions).
"""

from surecall.grammars.compile import compile_catalog, compile_regex, compile_schema
from surecall.grammars.options import GrammarOptions
from surecall.grammars.table import TokenTable
from surecall.grammars.vocab.core import Vocab, load_vocab

__all__ = ["Vocab", "load_vocab", "TokenTable", "GrammarOptions", "compile_schema", "compile_catalog", "compile_regex"]
