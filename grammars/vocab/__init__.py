"""surecall.grammars.vocab: the exact bytes each token id contributes, from any tokenizer source.

`core` holds `Vocab` and `load_vocab`; `loaders` the format readers (tokenizer.json, vocab.json +
merges, SentencePiece, tiktoken ranks, transformers/tiktoken objects); `shared` finds the shared
vocabularies for `shared:NAME` specs. It does not compile grammars.
"""

from surecall.grammars.vocab.core import Vocab, load_vocab

__all__ = ["Vocab", "load_vocab"]
