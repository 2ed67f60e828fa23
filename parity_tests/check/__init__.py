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
- the reference: levels.py (the registry of levels, one entry each; the reference read through it, and its
  activations inside a layer), probes.py (each level's inputs), reference.py (each level's shapes, forward and
  backward: every call into numpy_transformer's level math)
- judging: session.py (one check's stages: the recording, the inferred model, the layouts), calling.py (how the
  module is called: layout, order, masks), running.py (how it is run: copies, float32 islands, its own head,
  positions), judge.py (check.module: conventions, config, the float64 and float32 comparison, caveats), cli.py
  (`transformer-parity check`'s sandboxed child), towers.py (a ViT or a CLIP text tower, where the text levels
  do not fit)
- naming the mistake: diagnose.py (probes, then the first divergence or the variants), divergence.py (hooks, the
  first divergent submodule), matchers.py (the catalogue's variants on a unit's inputs), variants.py (the reference
  with one mistake put in), mistakes.py, attention_mistakes.py, backward_mistakes.py, diagnosis.py (the registry)
- check.pair: pairs.py (a NumPy pair against the reference's and finite differences), pair_table.py (the pairs it
  judges and the workbook grades), your_turn.py (the walkthroughs' "your turn" cells)
- report.py: CATALOGUE (read from mistakes.py), Result and its printed report
"""

from .judge import module
from .levels import REFERENCES
from .pairs import PAIRS, pair
from .report import CATALOGUE, Diagnosis, Result

__all__ = ["module", "pair", "REFERENCES", "PAIRS", "CATALOGUE", "Diagnosis", "Result"]
