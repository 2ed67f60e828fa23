"""Check your own Transformer: the NumPy reference as a judge of a user's PyTorch modules and NumPy backward passes.

    from parity_tests import check
    result = check.module(my_attention, "multi_head_attention", n_heads=4)
    print(result)        # conventions, inferred config, the weight map, a table of errors, divergence, diagnosis
    result = check.pair(my_forward, my_backward, "layer_norm")

See DESIGN.md, "Checking a user's implementation", for the contract, and report.CATALOGUE for the mistakes named.
"""

from .judge import module
from .pairs import PAIRS, pair
from .report import CATALOGUE, Diagnosis, Result

__all__ = ["module", "pair", "PAIRS", "CATALOGUE", "Diagnosis", "Result"]
