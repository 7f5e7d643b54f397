"""surecall.kernels: grammar-masked sampling (mask, sample, logprob, advance) on Triton, with torch references."""
