"""Training surecall-tiny: the synthetic corpus, the BPE tokenizer and the training loop.

Nothing here runs at import or at inference time; `surecall.models` holds the shipped result.
"""
