"""Check your own Transformer: the NumPy reference as a judge of a user's PyTorch modules and NumPy backward passes.

    from parity_tests import check
    result = check.module(my_model, "transformer", n_heads=8)   # a whole model, a layer or a component
    print(result)      # conventions, inferred config, the weight map, every tensor's error, divergence, diagnosis
    result = check.pair(my_forward, my_backward, "layer_norm")  # a hand-written NumPy pair

docs/howto/check_your_model.md is the contract (names, result fields, catalogue ids). The stages, each module's
docstring saying more: reading the module (dataflow, mapping, units, tables, weight_map); the reference (levels,
probes, reference); judging (session, calling, running, judge; cli's sandboxed child; towers for ViT and CLIP
towers); naming the mistake (divergence, matchers, variants, mistakes, backward_mistakes, diagnosis); check.pair
(pairs, pair_table, your_turn); report.py: CATALOGUE, Result and its printed report.
"""

from .judge import module
from .levels import REFERENCES
from .pairs import PAIRS, pair
from .report import CATALOGUE, Diagnosis, Result

__all__ = ["module", "pair", "REFERENCES", "PAIRS", "CATALOGUE", "Diagnosis", "Result"]
