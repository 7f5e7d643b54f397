"""surecall.grammars: tokenizer vocabularies and JSON Schema -> TokenTable compilation.

Ground floor: imports nothing of ours above `surecall.errors`. Public entry points:
`load_vocab`, `Vocab`, `TokenTable`, `compile_schema`, `compile_catalog`.
"""

from surecall.grammars.table import TokenTable
from surecall.grammars.vocab import Vocab, load_vocab

__all__ = ["Vocab", "load_vocab", "TokenTable"]
