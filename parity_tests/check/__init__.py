"""Check your own Transformer: the NumPy reference as a judge of a user's PyTorch modules and NumPy backward passes.

    from parity_tests import check
    result = check.module(my_model, "transformer", n_heads=8)   # a whole model, a layer or a component
    print(result)      # conventions, inferred config, the weight map, every tensor's error, divergence, diagnosis
    result = check.pair(my_forward, my_backward, "layer_norm")  # a hand-written NumPy pair

Llama-style modules (RMSNorm, rotary positions, grouped-query attention, SwiGLU) are judged as "transformer_lm",
"decoder_only_layer", "multi_head_attention", "rms_norm" and "gated_feed_forward", their config and RoPE pairing
inferred. docs/howto/check_your_model.md is the contract (names, result fields, catalogue ids).
The parts:

- dataflow.py  the user's forward recorded once (op recorder, module hooks): every role read from the dataflow
- mapping.py   the user's parameters read as pieces, in the order the flow uses them; the Link a weight map is made of
- units.py     the reference's units the flow read, the config they imply, the links to the reference's names
- tables.py    fixed tables built in float32 (sinusoids, RoPE's) recognised and overwritten in float64
- weight_map.py  the weight map as the result gives it (data: the links it came from), and read back
- calling.py   how the user's module is called: layout, argument order, masks in the user's own convention
- level_table.py  the registry of levels, one entry each: inputs, probe, shapes, runner, what is inferred and shown
- probes.py    each level's inputs: random, padded, batch-first, as the reference takes them
- reference.py each level's parameter shapes, forward and backward: every call into numpy_transformer's level math
- levels.py    the registry read by name (probe, shapes, run), and the reference's activations inside a layer
- session.py   one check's state: the module read, the reference's weights and probes, copies, candidates
- judge.py     check.module: convention and config detection, the float64 and float32 comparison, caveats
- running.py   how the user's module is run: closure-keeping copies, float32 islands, its own head, positions
- cli.py       `transformer-parity check`'s side in the sandboxed child: load the user's target, judge it
- diagnose.py  probes (dropout in eval, overflow), then the first divergence or a component's variants
- divergence.py  hooks on the user's submodules, the reference's stages, the first divergent submodule
- matchers.py  the catalogue's variants run on a unit's inputs (attention, norms, gated feed-forward, embeddings)
- variants.py  the reference with one known mistake put in (forward only, float64)
- pairs.py     check.pair: a user's NumPy pair against the reference's and finite differences, case by case
- pair_table.py  the pairs check.pair judges and the exercise workbook (parity_tests.exercises) grades
- mistakes.py  the registry of mistakes, one entry each (id, line, unit, variants, tests); levels_of: where looked for
- attention_mistakes.py  the registry's attention mistakes, in the order they are tried
- backward_mistakes.py  the tests of a hand-written backward's gradient the registry names
- diagnosis.py Mistake, Site and Diagnosis: what the registry is made of, and a known mistake found
- report.py    CATALOGUE (read from mistakes.py), Result and its printed report
"""

from .judge import module
from .levels import REFERENCES
from .pairs import PAIRS, pair
from .report import CATALOGUE, Diagnosis, Result

__all__ = ["module", "pair", "REFERENCES", "PAIRS", "CATALOGUE", "Diagnosis", "Result"]
