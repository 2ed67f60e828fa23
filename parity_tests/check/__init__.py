"""Check your own Transformer: the NumPy reference as a judge of a user's PyTorch modules and NumPy backward passes.

    from parity_tests import check
    result = check.module(my_model, "transformer", n_heads=8)   # a whole model, a layer or a component
    print(result)      # conventions, inferred config, the weight map, every tensor's error, divergence, diagnosis
    result = check.pair(my_forward, my_backward, "layer_norm")  # a hand-written NumPy pair

Llama-style modules (RMSNorm, rotary positions, grouped-query attention, SwiGLU) are judged as "transformer_lm",
"decoder_only_layer", "multi_head_attention", "rms_norm" and "gated_feed_forward", their config and RoPE pairing
inferred. docs/howto/check_your_model.md is the contract (names, result fields, catalogue ids).
The parts, by stage (each module's docstring says more):

- reading the module: dataflow.py (its forward recorded once: each parameter's role from the dataflow), mapping.py
  (its parameters as pieces; the Link a weight map is made of), units.py (the reference's units the flow read, the
  config they imply), tables.py (fixed float32 tables overwritten in float64), weight_map.py (the map as given)
- the reference: levels.py (the registry of levels, one entry each; the reference read through it), probes.py
  (each level's inputs), reference.py (each level's shapes, forward and backward, and its stages inside a layer or a
  model: every call into numpy_transformer's level math)
- judging, one pass over frozen stages: session.py (the recording, the inferred Model, the prepared Check; running
  the module under a Check), calling.py (how the module is called: layout, order, masks, or as one real call
  does), running.py (copies, float32 islands, its own head, positions, rows against bars), judge.py
  (check.module: the Choice of convention, config and map, then the verdict), cli.py (`transformer-parity check`'s
  sandboxed child), towers.py (a ViT or a CLIP text tower, where the text levels do not fit)
- naming the mistake: divergence.py (probes, then the first divergent submodule judged in situ, or a component's
  variants), matchers.py (the catalogue's variants on a unit's inputs), variants.py (the reference with one mistake
  put in), mistakes.py, backward_mistakes.py, diagnosis.py (the registry, the error measure)
- check.pair: pairs.py (a NumPy pair against the reference's and finite differences), pair_table.py (the pairs it
  judges and the workbook grades), your_turn.py (the walkthroughs' "your turn" cells)
- report.py: CATALOGUE (read from mistakes.py), Result and its printed report
"""

from .judge import module
from .levels import REFERENCES
from .pairs import PAIRS, pair
from .report import CATALOGUE, Diagnosis, Result

__all__ = ["module", "pair", "REFERENCES", "PAIRS", "CATALOGUE", "Diagnosis", "Result"]
