"""The judge survives the code it runs: `transformer-parity check` loads and judges the user's target in a child
process with a time limit (exit 0 passes, 1 fails, 2 bad arguments or code that could not run, each with its
reason); in-process check.module turns sys.exit into a failure; NaN never passes (check.module, check.pair,
gradcheck); closures over a module's own submodules survive the judge's copies.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from torch import nn

from numpy_transformer.gradcheck import check_pair
from numpy_transformer.layers import layer_norm_backward, layer_norm_forward
from parity_tests import check
from parity_tests import user_models as U
from parity_tests.__main__ import main

HEAD = "import os, sys, time\nimport torch\nfrom torch import nn\n\n\n"
NORM = """class Norm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.ones(8)), nn.Parameter(torch.zeros(8))

    def forward(self, x):
        {body}
        return nn.functional.layer_norm(x, (8,), self.weight, self.bias, 1e-5)
"""

UNRUNNABLE = {  # name -> (source, target attribute, extra arguments, what the message must say)
    "exit at import": (HEAD + "sys.exit(0)\n", "Norm", [], "importing"),
    "exit in forward": (HEAD + NORM.format(body="sys.exit(0)"), "Norm", [], "called sys.exit(0) in its forward"),
    "os._exit in forward": (HEAD + NORM.format(body="os._exit(0)"), "Norm", [], "exited with status 0"),
    "hang in forward": (HEAD + NORM.format(body="time.sleep(60)"), "Norm", ["--timeout", "4"], "did not finish"),
    "not callable": (HEAD + "Norm = 3\n", "Norm", [], "neither a torch.nn.Module nor a zero-argument factory"),
    "factory raises": (HEAD + "def Norm():\n    raise RuntimeError('no GPU')\n", "Norm", [], "RuntimeError: no GPU"),
    "factory gives no module": (HEAD + "def Norm():\n    return 3\n", "Norm", [], "of type int, not a torch"),
    "syntax error": (HEAD + "def Norm(:\n", "Norm", [], "SyntaxError"),
}


FAST = ("exit in forward", "hang in forward", "syntax error")  # one child each: the rest run with -m slow


@pytest.mark.parametrize("case", [c if c in FAST else pytest.param(c, marks=pytest.mark.slow) for c in UNRUNNABLE])
def test_cli_exits_2_with_the_reason_when_user_code_cannot_run(case, tmp_path, capsys):
    source, attr, extra, says = UNRUNNABLE[case]
    path = tmp_path / "usercode.py"
    path.write_text(source)
    assert main(["check", f"{path}:{attr}", "layer_norm", *extra]) == 2
    err = capsys.readouterr().err
    assert "could not be judged" in err and says in err, err


def test_cli_judges_in_a_child_and_exits_1_on_a_failure(tmp_path, capsys):
    path = tmp_path / "usercode.py"
    path.write_text(HEAD + NORM.format(body="x = x * 1.001"))
    assert main(["check", f"{path}:Norm", "layer_norm"]) == 1
    assert "FAILED" in capsys.readouterr().out
    assert main(["check", f"{path}:Norm", "layer_norm", "--timeout", "0"]) == 2
    assert main(["check", f"{path}:Norm", "layer_norm", "--call", "nocolon"]) == 2
    assert "--call: expected MODULE:ATTR" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_call_option_is_the_apis_call():
    model, call = "parity_tests.user_models:AnnotatedStyle", "parity_tests.user_models:annotated_call"
    assert main(["check", model, "transformer", "--call", call]) == 0


def test_sys_exit_in_forward_is_a_failure_with_its_reason_in_process():
    class Exits(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight, self.bias = nn.Parameter(torch.ones(8)), nn.Parameter(torch.zeros(8))

        def forward(self, x):
            raise SystemExit(3)

    result = check.module(Exits(), "layer_norm")
    assert not result.passed and result.error == "the user's code called sys.exit(3) in its forward", str(result)
    assert "error: the user's code called sys.exit(3)" in str(result)


class NaNGradientNorm(nn.Module):
    """The right layer norm forward, a NaN input gradient: torch.where's unused sqrt of negatives."""

    def __init__(self):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.ones(8)), nn.Parameter(torch.zeros(8))

    def forward(self, x):
        x = x + torch.where(x > 1e6, torch.sqrt(x), torch.zeros_like(x))
        return nn.functional.layer_norm(x, (8,), self.weight, self.bias, 1e-5)


def test_nan_gradient_fails_check_module():
    result = check.module(NaNGradientNorm(), "layer_norm")
    row = next(r for r in result.rows if r.name == "dx" and r.dtype == "float64")
    assert not result.passed and math.isnan(row.error), str(result)
    assert next(r for r in result.rows if r.name == "output").ok  # the forward itself is right


def _nan_dx_backward(dout, cache):
    dx, dweight, dbias = layer_norm_backward(dout, cache)
    return dx * np.nan, dweight, dbias


def test_nan_gradient_is_never_a_pass_in_gradcheck_and_check_pair():
    rng = np.random.default_rng(0)
    args = dict(x=rng.standard_normal((2, 3, 4)), weight=np.ones(4), bias=np.zeros(4), eps=1e-5)
    fd = check_pair(layer_norm_forward, _nan_dx_backward, args, ["x", "weight", "bias"])
    assert math.isnan(fd.errors["x"]) and math.isnan(fd.worst), str(fd)
    result = check.pair(layer_norm_forward, _nan_dx_backward, "layer_norm", dtypes=("float64",))
    rows = [r for r in result.rows if r.name.endswith("dx vs finite differences")]
    assert rows and all(math.isnan(r.error) and not r.ok for r in rows), str(result)
    assert "0.00e+00" not in result.unexplained and "nan against finite differences" in result.unexplained


def test_module_that_computes_no_attention_is_refused_saying_so_not_an_internal_error():
    """Projections named q_proj ... out_proj that the forward never uses: roles come from the computation, which
    holds no attention, and the refusal says so."""

    class ReturnsQuery(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(8, 8) for _ in range(4))

        def forward(self, query, key, value, mask=None):
            return query

    refused = check.module(
        ReturnsQuery(), "multi_head_attention", n_heads=2
    )  # could not judge: said in result.error, never raised
    assert not refused.passed and re.search(
        r"found 0 attentions in the module, .* a softmax reading a product of", refused.error or ""
    ), str(refused)


def test_a_lambda_over_the_modules_own_submodules_runs_the_judged_copy():
    block = U.MinGPTBlock()
    before = {n: t.clone() for n, t in block.state_dict().items()}
    result = check.module(block, "decoder_only_layer", n_heads=2)
    assert result.passed, str(result)
    assert all(torch.equal(before[n], t) for n, t in block.state_dict().items())  # the user's module untouched
    assert next(block.parameters()).dtype == torch.float32


@pytest.mark.slow
def test_cli_loads_a_file_whose_dataclass_needs_its_module(tmp_path, capsys):
    """nanoGPT's GPTConfig is a @dataclass under `from __future__ import annotations`: dataclasses look the module
    up in sys.modules, so a file loaded by path must be registered there, as an import would."""
    source = "from __future__ import annotations\n\nfrom dataclasses import dataclass\n\nfrom torch import nn\n\n\n"
    source += "@dataclass\nclass Config:\n    width: int = 8\n\n\n"
    source += "def norm():\n    return nn.LayerNorm(Config().width)\n"
    path = tmp_path / "dataclass_model.py"
    path.write_text(source)
    assert main(["check", f"{path}:norm", "layer_norm"]) == 0, capsys.readouterr().err


def test_grader_fails_a_nan_gradient_and_says_nan(tmp_path):
    from parity_tests.exercises import grade, write_workbook

    write_workbook(tmp_path, ["softmax"])
    path = tmp_path / "softmax.py"
    text = path.read_text().replace(
        "    raise NotImplementedError(\"softmax backward: derive dx from dout and cache['p']\")",
        "    return cache['p'] * (dout - (dout * cache['p']).sum(-1, keepdims=True)) * np.nan",
    )
    assert text != path.read_text()
    path.write_text(text if "import numpy as np" in text else "import numpy as np\n" + text)
    entry = grade(tmp_path)["exercises"]["softmax"]
    assert not entry["passed"] and "nan" in entry["summary"] and "0.00e+00" not in entry["summary"], entry
