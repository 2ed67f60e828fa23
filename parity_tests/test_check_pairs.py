"""check.pair, the exercise workbook and the `check` / `exercises` / `grade` subcommands.

The reference's own pairs pass; broken NumPy pairs (a wrong forward, a wrong backward, a softmax without the max
subtraction) fail with the mistake named or the wrong gradient and its error; a workbook filled with the reference's
code passes the grader, and each untouched stub fails with "not implemented yet".
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from numpy_transformer import layers as L
from parity_tests import check
from parity_tests.__main__ import main
from parity_tests.exercises import EXERCISES, POINTS, write_workbook
from parity_tests.exercises.grading import grade_file
from parity_tests.workbook_answers import answer


@pytest.mark.parametrize("name", list(check.PAIRS))
def test_reference_pair_passes(name):
    spec = check.PAIRS[name]
    result = check.pair(spec.forward, spec.backward, name)
    assert result.passed, str(result)
    assert any("finite differences" in r.name for r in result.rows)


def unbiased_layer_norm_forward(x, weight, bias, eps):
    mean = x.mean(-1, keepdims=True)
    x_hat = (x - mean) / np.sqrt(x.var(-1, keepdims=True, ddof=1) + eps)  # divides by n - 1
    return x_hat * weight + bias, (x_hat, weight)


def simple_layer_norm_backward(dout, cache):
    x_hat, weight = cache  # forgets that x_hat depends on x through the mean and the variance
    return dout * weight, (dout * x_hat).sum((0, 1)), dout.sum((0, 1))


def test_wrong_forward_is_named():
    result = check.pair(unbiased_layer_norm_forward, simple_layer_norm_backward, "layer_norm")
    assert not result.passed
    assert [d.id for d in result.diagnoses] == ["layer_norm.unbiased_variance"]


def test_annotated_transformers_layer_norm_pair_names_both_of_its_mistakes():
    """x.std() + eps: the variance divided by n - 1 and eps outside the root, each alone reproducing nothing; the
    pair's forward is searched as check.module's units are (matchers.match_unit), the two together found."""

    def forward(x, weight, bias, eps):
        out = (x - x.mean(-1, keepdims=True)) / (x.std(-1, keepdims=True, ddof=1) + eps) * weight + bias
        return out, L.layer_norm_forward(x, weight, bias, eps)[1]

    result = check.pair(forward, L.layer_norm_backward, "layer_norm", dtypes=("float64",))
    assert not result.passed
    assert [d.id for d in result.diagnoses] == ["layer_norm.unbiased_variance", "layer_norm.eps_outside_sqrt"]


def test_wrong_backward_says_which_gradient_and_by_how_much():
    def wrong(d, c):  # dx forgets the normalisation's paths
        return (d * c.weight, *L.layer_norm_backward(d, c)[1:])

    result = check.pair(L.layer_norm_forward, wrong, "layer_norm")
    assert not result.passed and result.diagnoses == []
    assert "dx:" in result.unexplained and "against finite differences" in result.unexplained
    assert "dweight" not in result.unexplained  # the other gradients are right


def test_softmax_without_max_subtraction_is_named():
    def forward(x, mask=None):
        e = np.exp(x if mask is None else np.where(mask, x, -np.inf))
        total = e.sum(-1, keepdims=True)
        p = np.nan_to_num(e / np.where(total == 0, 1, total))  # hides the overflow's NaN as zeros
        return p, p

    result = check.pair(forward, lambda dout, p: p * (dout - (dout * p).sum(-1, keepdims=True)), "softmax")
    assert [d.id for d in result.diagnoses] == ["attention.no_max_subtraction"], str(result)


def test_pair_arguments_are_checked():
    with pytest.raises(ValueError, match="reference must be one of"):
        check.pair(L.linear_forward, L.linear_backward, "dense")
    with pytest.raises(TypeError, match="must be callables"):
        check.pair(L.linear_forward, None, "linear")


def test_workbook_stubs_fail_and_right_answers_pass(tmp_path, capsys):
    assert main(["exercises", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.glob("*.py")) == sorted(f"{n}.py" for n in EXERCISES)
    assert "format_name: percent" in (tmp_path / "notebooks" / "softmax.py").read_text()
    stubs = {name: grade_file(tmp_path / f"{name}.py", name) for name in EXERCISES}
    assert all(not e["passed"] and "not implemented yet" in e["summary"] for e in stubs.values()), stubs
    for name in EXERCISES:
        answer(tmp_path, name)
    answered = {name: grade_file(tmp_path / f"{name}.py", name, seed=11) for name in EXERCISES}
    assert all(e["passed"] for e in answered.values()), {n: e["summary"] for n, e in answered.items()}
    capsys.readouterr()
    out = tmp_path / "card.json"
    assert main(["grade", str(tmp_path), "--only", "softmax,linear", "--seed", "3", "--json", str(out)]) == 0
    card = json.loads(out.read_text())
    assert card["passed"] and card["passed_count"] == 2 and card["seed"] == 3
    assert card["points"] == card["max_points"] == POINTS["softmax"] + POINTS["linear"]
    assert "float64 1e-10 against the reference" in capsys.readouterr().out


def test_workbook_only_and_refusals(tmp_path):
    write_workbook(tmp_path, ["softmax", "linear"])
    assert sorted(p.name for p in tmp_path.glob("*.py")) == ["linear.py", "softmax.py"]
    with pytest.raises(ValueError, match="refusing to overwrite"):
        write_workbook(tmp_path, ["softmax"])
    with pytest.raises(ValueError, match="unknown exercise"):
        write_workbook(tmp_path / "other", ["attention"])
    assert main(["exercises", str(tmp_path / "x"), "--only", "nope"]) == 2


def test_grader_names_a_student_mistake(tmp_path):
    write_workbook(tmp_path, ["softmax"])
    path = tmp_path / "softmax.py"
    text = path.read_text().replace(
        "    raise NotImplementedError(\"softmax backward: derive dx from dout and cache['p']\")",
        "    return cache['p'] * dout  # forgets the row sum",
    )
    path.write_text(text)
    entry = grade_file(path, "softmax")
    assert not entry["passed"] and "dx" in entry["summary"]


def test_check_command(tmp_path, capsys):
    out = tmp_path / "result.json"
    assert (
        main(["check", "parity_tests.user_models:HeadwiseLM", "transformer_lm", "--n-heads", "2", "--json", str(out)])
        == 0
    )
    assert "PASSED" in capsys.readouterr().out
    assert json.loads(out.read_text())["passed"]
    mapping = tmp_path / "map.json"
    mapping.write_text(json.dumps(json.loads(out.read_text())["mapping"]))
    assert (
        main(
            [
                "check",
                "parity_tests.user_models:HeadwiseLM",
                "transformer_lm",
                "--n-heads",
                "2",
                "--mapping",
                str(mapping),
            ]
        )
        == 0
    )
    assert main(["check", "parity_tests/user_models.py:Seq2Seq", "transformer"]) == 0
    assert main(["check", "parity_tests.user_models:nothing", "transformer"]) == 2


ROPE_MILLION = """
import torch
from parity_tests.corpus.llama import ModelArgs, Transformer


def model():
    torch.manual_seed(0)
    return Transformer(ModelArgs(rope_theta=1e6))  # a RoPE base of 1e6, as Qwen's
"""


@pytest.mark.slow  # 9 s of CLI runs; test_check_command keeps the CLI in the default run
def test_check_command_passes_the_config_options_through(tmp_path, capsys):
    """--rope-theta, --config-field NAME=VALUE, --dtype and --seed reach check.module: a Llama whose RoPE base is
    1e6 passes at --rope-theta 1e6 and fails at 1e4 (the base given is the one judged), compared in float64 only."""
    path = tmp_path / "rope_million.py"
    path.write_text(ROPE_MILLION)
    out = tmp_path / "result.json"
    args = ["check", f"{path}:model", "transformer_lm", "--dtype", "float64", "--seed", "1", "--json", str(out)]
    assert main([*args, "--rope-theta", "1e6", "--config-field", "layer_norm_eps=1e-5"]) == 0, capsys.readouterr()
    result = json.loads(out.read_text())
    assert result["config"]["rope_theta"] == 1e6 and result["config"]["layer_norm_eps"] == 1e-5
    assert {row["dtype"] for row in result["rows"]} == {"float64"}
    assert main([*args, "--config-field", "rope_theta=10000"]) == 1
    assert json.loads(out.read_text())["config"]["rope_theta"] == 1e4


@pytest.mark.parametrize(
    "extra, said",
    [
        (["--config-field", "nope=1"], "'nope' is not a config field"),
        (["--config-field", "rope_theta"], "expected NAME=VALUE"),
        (["--rope-theta", "1e4", "--config-field", "rope_theta=1e6"], "rope_theta given twice"),
        (["--mask", "sideways"], "invalid choice"),
    ],
)
def test_check_command_refuses_a_bad_config_option_before_running_anything(extra, said, capsys):
    """Refused with exit status 2 and the reason, before the target (which does not exist) is even imported."""
    try:
        status = main(["check", "no_such_module_at_all:model", "transformer_lm", *extra])
    except SystemExit as exc:  # argparse's own refusals exit 2 themselves
        status = exc.code
    assert status == 2
    err = capsys.readouterr().err
    assert said in err and "no module named" not in err, err


def test_no_subcommand_still_runs_the_parity_report(monkeypatch):
    seen = []
    monkeypatch.setattr("parity_tests.report.main", lambda argv: seen.append(argv) or 0)
    assert main(["--dtype", "float32", "--json", "x.json"]) == 0
    assert seen == [["--dtype", "float32", "--json", "x.json"]]


def test_attention_pair_with_a_wrong_scale_is_named():
    from numpy_transformer import scaled_dot_product_attention_backward, scaled_dot_product_attention_forward

    def forward(q, k, v, mask=None):
        return scaled_dot_product_attention_forward(q / np.sqrt(q.shape[-1]), k, v, mask)  # divides by d, not sqrt(d)

    result = check.pair(forward, scaled_dot_product_attention_backward, "scaled_dot_product_attention")
    assert "attention.wrong_scale" in [d.id for d in result.diagnoses], str(result)
    assert "d_head = 4: the root is missing" in result.diagnoses[0].message


def test_cli_imports_a_module_from_the_current_directory(tmp_path, monkeypatch):
    """`transformer-parity check mymodels:factory ...` run where mymodels.py lies (not installed), as the README
    shows it: the current directory is importable, as under `python -m`."""
    from parity_tests.__main__ import main

    source = "import torch.nn as nn\n\n\ndef layer():\n"
    source += "    return nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)\n"
    (tmp_path / "mymodels_cwd.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert main(["check", "mymodels_cwd:layer", "encoder_layer", "--n-heads", "2"]) == 0


def test_multi_head_attention_pair_with_heads_split_without_the_transpose_is_named():
    """Heads split by a reshape alone, merged back with the transpose: the catalogue's variant of the
    multi_head_attention pair reproduces it (it came out equal to the reference before, and went unnamed)."""
    from numpy_transformer import attention as A

    def forward(params, query, key, value, n_heads, attn_mask=None):
        B, T, D = query.shape

        def heads(x, name):  # (B, T, D) -> (B, H, T, Dh) by a reshape alone: each head mixes positions
            y = x @ params[f"{name}_proj.weight"].T + params[f"{name}_proj.bias"]
            return y.reshape(y.shape[0], n_heads, y.shape[1], D // n_heads)

        q, k, v = heads(query, "q"), heads(key, "k"), heads(value, "v")
        scores = q @ k.swapaxes(-1, -2) / np.sqrt(D // n_heads)
        if attn_mask is not None:
            scores = np.where(attn_mask, scores, -1e9)
        p = np.exp(scores - scores.max(-1, keepdims=True))
        context = (p / p.sum(-1, keepdims=True) @ v).transpose(0, 2, 1, 3).reshape(B, T, D)  # with the transpose
        cache = A.multi_head_attention_forward(params, query, key, value, n_heads, attn_mask)[1]  # the backward's
        return context @ params["out_proj.weight"].T + params["out_proj.bias"], cache

    result = check.pair(forward, A.multi_head_attention_backward, "multi_head_attention")
    assert not result.passed
    assert [d.id for d in result.diagnoses] == ["attention.heads_without_transpose"], str(result)
