"""Train a Transformer to read numbers aloud: "29,284.30" -> "twenty-nine thousand two hundred
eighty-four point three zero" (the task of the UPC "Build your own Transformer" lab).

    python examples/train_numbers.py                       # pure NumPy, float32, the defaults
    python examples/train_numbers.py --backend torch       # the same with torch_transformer
    python examples/train_numbers.py --quick               # seconds: a smoke test
    python examples/train_numbers.py --model llama --out runs/llama   # a decoder-only Llama-style LM instead
    python examples/train_numbers.py --backend torch --precision bf16 --compile    # bfloat16 autocast, compiled
    torchrun --nproc-per-node 2 examples/train_numbers.py --backend torch          # data parallel (DDP), 2 processes
    torchrun --nproc-per-node 4 examples/train_numbers.py --backend torch --device cuda   # 4 GPUs, NCCL
    python examples/train_numbers.py --resume runs/numbers/training_state   # continue an interrupted run

Source: characters (digits, ",", "."); target: English words. The numbers of the test split never
appear in training. After training, the test split is translated with greedy decoding and scored.
Writes into --out: metrics.json, checkpoint.safetensors (the config and vocabularies in its
metadata), loss_curve.png and attention_*.png (every attention module of one test example).

Every --save-every steps, and at the end of training, it writes a training checkpoint to --out/training_state
(numpy_transformer.training / torch_transformer.training: the weights, the optimizer's moments and step, the
schedule's position, the random generators' states, where the data stream was, the loss history). A run
killed at any moment and started again with --resume DIR (that folder, or the --out folder holding it) and the
same flags takes the same steps as the run never stopped, every loss and the final weights bit for bit;
--max-steps (and --minutes) may be raised to train on.

Two models (--model): `transformer`, the paper's encoder-decoder (characters into the encoder, words
out of the decoder), and `llama`, a decoder-only TransformerLM built as Llama is (RMSNorm before each
sublayer, rotary positions, SwiGLU feed-forward, grouped-query attention, no biases). The LM reads one
sequence per number, the prompt (its characters, then <bos>) followed by the words and <eos>, and
learns the continuation only (the loss ignores the prompt positions); it is scored by greedy decoding
from the prompt with the KV cache, on the same test numbers and with the same metrics.

Under torchrun (torch backend) every process draws the same global batch of --batch-size sequences and
trains on its own contiguous rows of it, inside DistributedDataParallel; the loss is the mean over the
whole global batch's targets (torch_transformer.distributed), so N processes take the same steps as one.
Rank 0 alone logs, evaluates and writes files. --accumulate K splits each process's rows into K
micro-batches whose gradients add up locally (DDP's no_sync) before one all-reduce and one optimizer step.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from examples import plotting, tasks  # noqa: E402
from numpy_transformer import TransformerConfig  # noqa: E402
from transformer_spec import training  # noqa: E402

# Each model's defaults (a flag given on the command line wins): sizes and optimisation that reach the
# target (>= 0.95 test exact match) well inside the time budget on 2 CPU cores.
MODEL_DEFAULTS = {
    "transformer": dict(
        d_model=128, heads=4, kv_heads=None, d_ff=512, layers=2, dropout=0.1, label_smoothing=0.1, lr=0.5, warmup=400
    ),
    "llama": dict(
        d_model=128, heads=4, kv_heads=2, d_ff=384, layers=4, dropout=0.0, label_smoothing=0.1, lr=0.5, warmup=400
    ),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model",
        choices=list(MODEL_DEFAULTS),
        default="transformer",
        help="transformer: the paper's encoder-decoder; llama: a decoder-only Llama-style TransformerLM",
    )
    p.add_argument("--backend", choices=["numpy", "torch"], default="numpy")
    p.add_argument("--device", default="cpu", help="torch backend only: cpu, cuda (under torchrun: cuda:LOCAL_RANK)")
    p.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        default="fp32",
        help="torch backend only: bf16 runs forward and loss under bfloat16 autocast (weights and Adam stay float32)",
    )
    p.add_argument("--compile", action="store_true", help="torch backend only: torch.compile the model")
    p.add_argument(
        "--accumulate", type=int, default=1, help="torch backend only: micro-batches per step (gradient accumulation)"
    )
    p.add_argument("--out", default="runs/numbers")
    p.add_argument("--minutes", type=float, default=12.0, help="training time budget")
    p.add_argument("--max-steps", type=int, help="default 20,000 (30 with --quick)")
    p.add_argument("--n-train", type=int, default=60_000)
    p.add_argument("--n-val", type=int, default=500)
    p.add_argument("--n-test", type=int, default=2_000)
    p.add_argument("--max-value", type=int, default=999_999, help="largest integer part of a number")
    p.add_argument("--batch-size", type=int, default=64)
    # Model and optimisation: None takes the --model's default (MODEL_DEFAULTS).
    p.add_argument("--d-model", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--kv-heads", type=int, help="key/value heads of grouped-query attention (None: --heads)")
    p.add_argument("--d-ff", type=int)
    p.add_argument("--layers", type=int, help="transformer: encoder and decoder layers each; llama: decoder layers")
    p.add_argument("--dropout", type=float)
    p.add_argument("--label-smoothing", type=float)
    p.add_argument("--lr", type=float, help="factor of the paper's schedule")
    p.add_argument("--warmup", type=int)
    p.add_argument("--clip", type=float, default=1.0, help="max global gradient norm")
    p.add_argument("--eval-every", type=int, default=500, help="steps between validation checks")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="a tiny run that finishes in seconds")
    p.add_argument(
        "--save-every",
        type=int,
        help="steps between training checkpoints in --out/training_state (default 500; 0: none, the default with "
        "--quick and under torchrun)",
    )
    p.add_argument("--resume", help="continue from a training checkpoint: its folder, or the --out folder holding it")
    args = p.parse_args(argv)
    if args.save_every is not None and args.save_every < 0:
        p.error(f"--save-every must be >= 0, got {args.save_every}")
    if args.backend == "numpy" and (args.precision != "fp32" or args.compile or args.accumulate != 1):
        p.error("--precision bf16, --compile and --accumulate are options of the torch backend")
    if args.accumulate < 1:
        p.error(f"--accumulate must be >= 1, got {args.accumulate}")
    for name, value in MODEL_DEFAULTS[args.model].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.quick:
        args.minutes, args.n_train, args.n_val, args.n_test = 0.5, 400, 20, 40
        args.d_model, args.d_ff, args.layers, args.eval_every, args.warmup = 32, 64, 1, 15, 10
    if args.max_steps is None:
        args.max_steps = 30 if args.quick else 20_000
    if args.save_every is None:  # none under torchrun: a training checkpoint holds one process's random state
        args.save_every = 0 if args.quick or int(os.environ.get("WORLD_SIZE", "1")) > 1 else 500
    return args


# What a resumed run must share with the run it continues: every flag that changes the steps taken. The others
# (where files go, how long to train, how often to evaluate or save, the device) may change between the two.
FREE_FLAGS = ("out", "minutes", "max_steps", "eval_every", "save_every", "resume", "quick", "device", "compile")


def run_flags(args) -> dict:
    return {k: v for k, v in sorted(vars(args).items()) if k not in FREE_FLAGS}


# ----------------------------------------------------------------------------------------------
# The two backends: the same four operations, written with each implementation. A batch is the model's
# inputs, a tuple ((src_ids, tgt_in) for the Transformer, (ids,) for the LM), and its targets.


class NumpyBackend:
    """Training with numpy_transformer: forward, loss, hand-written backward, clip, Adam step."""

    name = "numpy"

    def __init__(self, config: TransformerConfig, args):
        import numpy_transformer as nt
        from numpy_transformer import optim

        self.nt = nt
        model_class = nt.TransformerLM if args.model == "llama" else nt.Transformer
        self.model = model_class(config, seed=args.seed, dtype=np.float32)
        self.optimizer = optim.Adam(self.model.params, lr=args.lr, betas=(0.9, 0.98), eps=1e-9)
        self.schedule = optim.NoamLR(self.optimizer, config.d_model, args.warmup)
        self.clip, self.label_smoothing, self.pad_id = args.clip, args.label_smoothing, config.pad_id
        self.clip_grad_norm = optim.clip_grad_norm

    def lr(self) -> float:
        return self.optimizer.lr

    def train_step(self, inputs: tuple, targets) -> float:
        model, nt = self.model.train(), self.nt
        logits = model.forward(*inputs)  # (B, T, V)
        loss, cache = nt.cross_entropy_forward(logits, targets, self.pad_id, self.label_smoothing)
        model.zero_grad()
        model.backward(nt.cross_entropy_backward(cache))
        self.clip_grad_norm(model.grads, self.clip)
        self.optimizer.step(model.grads)
        self.schedule.step()
        return float(loss)

    def decode(self, src_ids, max_len: int) -> np.ndarray:
        """Greedy decoding of the source (Transformer) or from the prompt (LM), with the KV cache."""
        return self.nt.generate(self.model.eval(), src_ids, max_new_tokens=max_len)

    def attention_maps(self, inputs: tuple) -> dict:
        self.model.eval().forward(*inputs)
        return self.model.attention_maps()

    def save(self, path, metadata: dict) -> None:
        from numpy_transformer.checkpoint import save_checkpoint

        save_checkpoint(path, self.model, metadata)

    def save_state(self, directory, step: int, generators: dict, extra: dict, metadata: dict) -> None:
        from numpy_transformer.training import save_training_checkpoint

        save_training_checkpoint(
            directory, self.model, self.optimizer, step, self.schedule, generators, extra, metadata
        )

    def load_state(self, directory, generators: dict) -> dict:
        from numpy_transformer.training import load_training_checkpoint

        return load_training_checkpoint(directory, self.model, self.optimizer, self.schedule, generators)


class TorchBackend:
    """Training with torch_transformer: the same data, config, schedule and metrics; in one process or, under
    torchrun, data parallel (DistributedDataParallel) with each process on its rows of the global batch."""

    name = "torch"

    def __init__(self, config: TransformerConfig, args, ctx=None):
        import contextlib

        import torch

        import torch_transformer as tt
        from torch_transformer import distributed

        self.torch, self.tt, self.distributed, self.contextlib = torch, tt, distributed, contextlib
        self.ctx = ctx if ctx is not None else distributed.Context(device=torch.device(args.device))
        self.device = self.ctx.device
        torch.manual_seed(args.seed)  # the same initial weights in every process (DDP also copies rank 0's)
        model_class = tt.TransformerLM if args.model == "llama" else tt.Transformer
        self.model = model_class(config).to(self.device)
        self.train_model = distributed.wrap(self.model, self.ctx)  # DDP on a multi-process run
        if args.compile:
            self.train_model = torch.compile(self.train_model, dynamic=True)  # every batch has its own (B, S, T)
        torch.manual_seed(args.seed + self.ctx.rank)  # dropout: different units in each process
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=args.lr, betas=(0.9, 0.98), eps=1e-9)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda n: config.d_model**-0.5 * min((n + 1) ** -0.5, (n + 1) * args.warmup**-1.5)
        )
        self.clip, self.label_smoothing, self.pad_id = args.clip, args.label_smoothing, config.pad_id
        self.accumulate, self.bf16 = args.accumulate, args.precision == "bf16"

    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def _tensors(self, *arrays):
        return [self.torch.from_numpy(a).to(self.device) for a in arrays]

    def rows_needed(self) -> int:
        """The smallest global batch every process can take a micro-batch of."""
        return self.ctx.world_size * self.accumulate

    def train_step(self, inputs: tuple, targets) -> float:
        """One optimizer step on the global batch (B, ...): this process takes its rows and splits them into
        micro-batches; the loss of each is its share of the global batch's mean (distributed.cross_entropy_share),
        so the accumulated, all-reduced gradient is the whole batch's. Returns the global batch's mean loss."""
        torch, distributed = self.torch, self.distributed
        batch = [torch.from_numpy(a) for a in (*inputs, targets)]
        self.model.check_inputs(*batch[:-1])  # value checks on the CPU, before the tensors move
        # Every process holds the global batch: it counts the global batch's targets without communication.
        n_targets = int((targets != self.pad_id).sum())
        rows = distributed.shard(len(targets), self.ctx)
        mine = [a[rows] for a in batch]  # this process's rows
        micro = [[a[part].to(self.device) for a in mine] for part in _parts(len(mine[0]), self.accumulate)]
        self.train_model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = 0.0
        for i, (*model_inputs, micro_targets) in enumerate(micro):
            last = i == len(micro) - 1
            # no_sync: add this micro-batch's gradient locally; the last backward all-reduces the sum.
            sync = self.contextlib.nullcontext() if last or not self.ctx.distributed else self.train_model.no_sync()
            with sync:
                with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
                    logits = self.train_model(*model_inputs)
                share = distributed.cross_entropy_share(
                    logits.float(), micro_targets, n_targets, self.pad_id, self.label_smoothing
                )
                share.backward()
            loss = loss + share.detach()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimizer.step()
        self.schedule.step()
        return distributed.global_loss(loss).item()

    def decode(self, src_ids, max_len: int) -> np.ndarray:
        (src,) = self._tensors(src_ids)  # the plain model: decoding is rank 0's, never collective
        return self.tt.generate(self.model.eval(), src, max_new_tokens=max_len).cpu().numpy()

    def attention_maps(self, inputs: tuple) -> dict:
        with self.torch.no_grad():
            self.model.eval()(*self._tensors(*inputs), need_weights=True)
        return {k: v.float().cpu().numpy() for k, v in self.model.attention_maps().items()}

    def save(self, path, metadata: dict) -> None:
        from torch_transformer.checkpoint import save_checkpoint

        save_checkpoint(path, self.model, metadata)

    def save_state(self, directory, step: int, generators: dict, extra: dict, metadata: dict) -> None:
        from torch_transformer.training import save_training_checkpoint

        save_training_checkpoint(
            directory, self.model, self.optimizer, step, self.schedule, generators, extra, metadata
        )

    def load_state(self, directory, generators: dict) -> dict:
        from torch_transformer.training import load_training_checkpoint

        return load_training_checkpoint(directory, self.model, self.optimizer, self.schedule, generators)


def _parts(n: int, k: int) -> list[slice]:
    """k contiguous slices of range(n), sizes differing by at most one."""
    return [slice(i * n // k, (i + 1) * n // k) for i in range(k)]


# ----------------------------------------------------------------------------------------------
# The two models' views of the data: how a pair becomes a batch, how the test split is decoded, which
# config and vocabularies the checkpoint carries. Both report predictions as [<bos>, words..., <eos>]
# next to the reference [words..., <eos>], so one `evaluate` scores either.


class EncoderDecoderData:
    """The paper's model: the number's characters (and <eos>) into the encoder, <bos> and the words into the
    decoder, which predicts the words and <eos>."""

    def __init__(self, splits: tasks.Splits):
        self.src_vocab, self.tgt_vocab = tasks.build_vocabs(splits.train)
        self.vocab = self.tgt_vocab  # the vocabulary of what is generated and scored
        self.S, self.T = tasks.max_lengths(splits.train + splits.val + splits.test, self.src_vocab, self.tgt_vocab)
        self.description = f"vocab {len(self.src_vocab)} chars -> {len(self.tgt_vocab)} words"

    def config(self, args) -> TransformerConfig:
        return TransformerConfig(
            src_vocab_size=len(self.src_vocab),
            tgt_vocab_size=len(self.tgt_vocab),
            d_model=args.d_model,
            n_heads=args.heads,
            n_kv_heads=args.kv_heads,
            d_ff=args.d_ff,
            n_encoder_layers=args.layers,
            n_decoder_layers=args.layers,
            dropout=args.dropout,
            max_len=max(self.S, self.T) + 1,
            pad_id=self.tgt_vocab.pad_id,
            bos_id=self.tgt_vocab.bos_id,
            eos_id=self.tgt_vocab.eos_id,
        )

    def batch(self, pairs) -> tuple[tuple, np.ndarray]:
        src_ids, tgt_in, tgt_out = tasks.encode_batch(pairs, self.src_vocab, self.tgt_vocab)
        return (src_ids, tgt_in), tgt_out

    def eval_batches(self, pairs, batch_size: int):
        for start in range(0, len(pairs), batch_size):
            yield pairs[start : start + batch_size]

    def predict(self, backend, pairs) -> tuple[np.ndarray, np.ndarray]:
        """(predictions (B, 1 + steps): <bos> then the decoded words, references tgt_out (B, T))."""
        (src_ids, _), tgt_out = self.batch(pairs)
        return backend.decode(src_ids, self.T), tgt_out

    def attention_example(self, backend, pair):
        """The attention maps of one pair, read with the model's own translation as decoder input:
        (maps, source tokens, target tokens, the translated words)."""
        (src_ids, _), _ = self.batch([pair])
        words = self.tgt_vocab.decode(backend.decode(src_ids, self.T)[0])
        tgt_in = np.array([[self.tgt_vocab.bos_id] + self.tgt_vocab.encode(words, add_eos=False)])
        maps = backend.attention_maps((src_ids, tgt_in))
        return maps, list(pair[0]) + [tasks.EOS], [tasks.BOS] + words, words

    def checkpoint_metadata(self) -> dict:
        return {"src_vocab": self.src_vocab.to_dict(), "tgt_vocab": self.tgt_vocab.to_dict()}


class LanguageModelData:
    """A decoder-only LM: one sequence per pair, the prompt (the number's characters, then <bos>) followed
    by the words and <eos>; the loss is on the words and <eos> only (tasks.encode_lm_batch)."""

    def __init__(self, splits: tasks.Splits):
        self.vocab = tasks.build_lm_vocab()
        for src, tgt in splits.train:  # a token outside the vocabulary raises ValueError
            self.vocab.encode(list(src) + tgt.split())
        src_vocab, tgt_vocab = tasks.build_vocabs()  # only to measure the longest source and target
        self.S, self.T = tasks.max_lengths(splits.train + splits.val + splits.test, src_vocab, tgt_vocab)
        self.description = f"vocab {len(self.vocab)} chars and words"

    def config(self, args) -> TransformerConfig:
        """Llama's architecture at this task's size."""
        return TransformerConfig(
            src_vocab_size=len(self.vocab),  # unused by a TransformerLM; the special ids must fit in it
            tgt_vocab_size=len(self.vocab),
            d_model=args.d_model,
            n_heads=args.heads,
            n_kv_heads=args.kv_heads,
            d_ff=args.d_ff,
            n_encoder_layers=0,
            n_decoder_layers=args.layers,
            dropout=args.dropout,
            activation="silu",
            gated_ffn=True,  # SwiGLU
            norm="rms",
            norm_first=True,
            positional="rope",
            bias=False,
            output_bias=False,
            scale_embeddings=False,
            max_len=self.S + self.T,  # a prompt of at most S tokens (characters, <bos>), then at most T generated
            pad_id=self.vocab.pad_id,
            bos_id=self.vocab.bos_id,
            eos_id=self.vocab.eos_id,
        )

    def batch(self, pairs) -> tuple[tuple, np.ndarray]:
        ids, targets = tasks.encode_lm_batch(pairs, self.vocab)
        return (ids,), targets

    def eval_batches(self, pairs, batch_size: int):
        """Batches of numbers with one length: their prompts are then one array, with no padding
        (TransformerLM masks nothing but the future, so a padded prompt would be read as tokens)."""
        by_length: dict[int, list] = {}
        for pair in pairs:
            by_length.setdefault(len(pair[0]), []).append(pair)
        for n in sorted(by_length):
            group = by_length[n]
            for start in range(0, len(group), batch_size):
                yield group[start : start + batch_size]

    def predict(self, backend, pairs) -> tuple[np.ndarray, np.ndarray]:
        """Greedy continuation of the prompts of numbers of n characters each: the result from column n on
        is <bos> then the generated words, as the encoder-decoder's; targets[:, n:] is its tgt_out."""
        (ids,), targets = self.batch(pairs)
        n = len(pairs[0][0])
        tokens = backend.decode(ids[:, : n + 1], self.T)  # (B, n + 1 + steps): the prompt, then its continuation
        return tokens[:, n:], targets[:, n:]

    def attention_example(self, backend, pair):
        """The self-attention maps of one pair: the prompt and the model's own continuation (without its
        <eos>) as the input. Returns (maps, [], the input's tokens, the generated words)."""
        n = len(pair[0])
        (ids,), _ = self.batch([pair])
        tokens = backend.decode(ids[:, : n + 1], self.T)[0]
        words = self.vocab.decode(tokens[n + 1 :])
        sequence = np.array([ids[0, : n + 1].tolist() + self.vocab.encode(words, add_eos=False)])
        maps = backend.attention_maps((sequence,))
        return maps, [], list(pair[0]) + [tasks.BOS] + words, words

    def checkpoint_metadata(self) -> dict:
        return {"vocab": self.vocab.to_dict()}


def evaluate(backend, data, pairs, batch_size: int = 256) -> tuple[float, float]:
    """Greedy-decode `pairs` and return (exact match, token accuracy)."""
    exact = correct = 0.0
    for chunk in data.eval_batches(pairs, batch_size):
        pred, tgt_out = data.predict(backend, chunk)
        exact += tasks.exact_match(pred, tgt_out, data.vocab) * len(chunk)
        correct += tasks.token_accuracy(pred, tgt_out, data.vocab.pad_id) * int((tgt_out != data.vocab.pad_id).sum())
    n_tokens = sum(len(tgt.split()) + 1 for _, tgt in pairs)  # words + eos
    return exact / len(pairs), correct / n_tokens


def main(argv=None) -> dict:
    args = parse_args(argv)
    ctx = None
    if args.backend == "torch":
        from torch_transformer import distributed

        ctx = distributed.init(args.device)  # a process group under torchrun, else one process
    elif int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise SystemExit("the NumPy backend trains in one process: use --backend torch under torchrun")
    metrics = train(args, ctx)  # on an error the process exits, and torchrun stops the others
    if ctx is not None:
        distributed.shutdown()  # waits for rank 0's evaluation and files
    return metrics


def resume_folder(path) -> Path:
    """--resume's folder: a training checkpoint, or an --out folder holding one in training_state/."""
    path = Path(path)
    nested = path / "training_state"
    return (
        nested
        if not (path / "trainer.json").exists()
        and (nested.exists() or nested.parent.joinpath(".training_state.old").exists())
        else path
    )


def check_same_run(saved: dict, flags: dict, where) -> None:
    """ValueError unless the flags that decide the steps are the checkpoint's (FREE_FLAGS may differ)."""
    differences = [
        f"--{k.replace('_', '-')} {saved.get(k)!r} there, {flags[k]!r} here" for k in flags if saved.get(k) != flags[k]
    ]
    if differences:
        raise ValueError(f"{where}: the checkpoint's run had other settings: {'; '.join(differences)}")


class Progress:
    """Where training is: what a training checkpoint holds beside the model, optimizer and generators."""

    def __init__(self) -> None:
        self.step = self.tokens = 0
        self.epoch = 0  # epochs of the training split finished
        self.batches = 0  # batches of this epoch drawn (trained on, or passed over as too short)
        self.seconds = 0.0  # training time before this process started (a resumed run's budget counts it)
        self.history: dict = {"step": [], "loss": [], "val_step": [], "val_exact_match": []}

    def to_dict(self, args, seconds: float) -> dict:
        return {
            "run": run_flags(args),
            "data": {"epoch": self.epoch, "batches": self.batches},
            "tokens": self.tokens,
            "train_seconds": seconds,
            "history": self.history,
        }

    @classmethod
    def resume(cls, args, backend, rng: np.random.Generator) -> Progress:
        """Load --resume's checkpoint into the backend and `rng` (the data generator as the interrupted epoch
        began: that epoch's batches are drawn again, and the ones trained on already passed over)."""
        folder = training.locate(resume_folder(args.resume))
        try:  # the flags first: a checkpoint of other settings is refused before anything is loaded
            saved = json.loads((folder / training.TRAINER_FILE).read_text())["run"]
        except (OSError, ValueError, KeyError, TypeError):
            saved = None  # a torn trainer.json: load_state says what is wrong with it
        if saved is not None:
            check_same_run(saved, run_flags(args), args.resume)
        trainer = backend.load_state(folder, {"data": rng})
        progress = cls()
        progress.step, progress.tokens, progress.history = trainer["step"], trainer["tokens"], trainer["history"]
        progress.epoch, progress.batches = trainer["data"]["epoch"], trainer["data"]["batches"]
        progress.seconds = trainer["train_seconds"]
        return progress


def train_steps(args, ctx, backend, data, splits, log) -> tuple[int, int, dict, float]:
    """The training loop, from the start or from --resume's checkpoint, saving one every --save-every steps and
    after the last. Returns (steps, tokens, history, training seconds)."""
    main_process = ctx is None or ctx.is_main
    rng = np.random.default_rng(args.seed)  # the same in every process: the same global batches
    progress = Progress()
    if args.resume:
        progress = Progress.resume(args, backend, rng)
        log(f"resumed from step {progress.step} ({args.resume})")
    history = progress.history
    start = time.perf_counter() - progress.seconds
    budget = args.minutes * 60
    rows_needed = getattr(backend, "rows_needed", lambda: 1)()
    quiet = None if main_process else True  # tqdm: None shows the bar on a terminal only
    bar = tqdm(
        total=args.max_steps, initial=progress.step, desc="training", unit="step", mininterval=1.0, disable=quiet
    )
    out_of_time = progress.step >= args.max_steps
    while progress.step < args.max_steps and not out_of_time:
        epoch_rng = copy.deepcopy(rng)  # the data generator as this epoch begins: what a checkpoint stores
        skip, progress.batches = progress.batches, 0
        for batch in tasks.batches(splits.train, args.batch_size, rng):
            progress.batches += 1
            if progress.batches <= skip or len(batch) < rows_needed:
                # trained on before the checkpoint this run resumed from; or a chunk's last, short batch, too
                # few rows for every process (and micro-batch)
                continue
            inputs, targets = data.batch(batch)
            loss = backend.train_step(inputs, targets)
            progress.step += 1
            step = progress.step
            progress.tokens += sum(int((ids != backend.pad_id).sum()) for ids in inputs)  # positions the model ran
            history["step"].append(step)
            history["loss"].append(loss)
            elapsed = time.perf_counter() - start
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{progress.tokens / elapsed:,.0f}", lr=f"{backend.lr():.2e}")
            if step % args.eval_every == 0 and main_process:
                val_em, _ = evaluate(backend, data, splits.val)
                history["val_step"].append(step)
                history["val_exact_match"].append(val_em)
                bar.write(f"step {step}: loss {loss:.3f}, validation exact match {val_em:.3f}")
            # every process stops at the same step: rank 0's clock (and anyone's) decides for all
            out_of_time = time.perf_counter() - start >= budget
            if ctx is not None:
                out_of_time = ctx.any(out_of_time)
            if args.save_every and (step % args.save_every == 0 or step >= args.max_steps or out_of_time):
                # also after the last step, so that a finished run can train on
                metadata = {**data.checkpoint_metadata(), "steps": step}
                extra = progress.to_dict(args, time.perf_counter() - start)
                backend.save_state(Path(args.out) / "training_state", step, {"data": epoch_rng}, extra, metadata)
            if step >= args.max_steps or out_of_time:
                break
        else:
            progress.epoch += 1
            progress.batches = 0
    bar.close()
    return progress.step, progress.tokens, history, time.perf_counter() - start


def train(args, ctx) -> dict:
    """Training, evaluation and the files; under torchrun rank 0 alone evaluates and writes, and the other
    processes return {} after the last step."""
    main_process = ctx is None or ctx.is_main
    world_size = 1 if ctx is None else ctx.world_size
    out = Path(args.out)
    if main_process:
        out.mkdir(parents=True, exist_ok=True)
    splits = tasks.make_numbers_dataset(args.n_train, args.n_val, args.n_test, max_value=args.max_value, seed=args.seed)
    data = LanguageModelData(splits) if args.model == "llama" else EncoderDecoderData(splits)
    config = data.config(args)
    backend = NumpyBackend(config, args) if args.backend == "numpy" else TorchBackend(config, args, ctx)
    log = print if main_process else (lambda *a, **k: None)
    if world_size > 1 and (args.resume or args.save_every):
        # each process has its own dropout generator; a training checkpoint holds one process's
        raise SystemExit("--resume and --save-every train in one process: pass --save-every 0 under torchrun")
    log(
        f"numbers to words: {len(splits.train)} train / {len(splits.val)} val / {len(splits.test)} test, "
        f"model {args.model}, {data.description}, backend {backend.name}, "
        f"budget {args.minutes:g} min or {args.max_steps} steps"
        + (f", {world_size} processes x {args.batch_size // world_size} rows" if world_size > 1 else "")
    )

    step, tokens, history, train_seconds = train_steps(args, ctx, backend, data, splits, log)
    if not main_process:
        return {}

    eval_start = time.perf_counter()
    test_em, test_acc = evaluate(backend, data, splits.test)
    eval_seconds = time.perf_counter() - eval_start
    metrics = {
        "test_exact_match": test_em,
        "test_token_accuracy": test_acc,
        "n_test": len(splits.test),
        "n_train": len(splits.train),
        "train_seconds": train_seconds,
        "eval_seconds": eval_seconds,
        "steps": step,
        "tokens_per_second": tokens / train_seconds,
        "final_loss": float(np.mean(history["loss"][-50:])),
        "model": args.model,
        "backend": backend.name,
        "dtype": "float32",
        "precision": args.precision,
        "compiled": args.compile,
        "world_size": world_size,
        "config": config.to_dict(),
        "args": vars(args),
        "history": history,
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"),
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
    backend.save(
        out / "checkpoint.safetensors",
        {**data.checkpoint_metadata(), "steps": step},
    )
    plotting.plot_loss_curve(
        history["step"],
        history["loss"],
        out / "loss_curve.png",
        history["val_step"],
        history["val_exact_match"],
        title=f"numbers to words ({args.model}, {backend.name})",
    )

    # Attention maps of one test example, read with the model's own translation as input.
    example = max(splits.test[:50], key=lambda pair: len(pair[0]))
    maps, src_tokens, tgt_tokens, words = data.attention_example(backend, example)
    plotting.plot_attention_maps(maps, src_tokens, tgt_tokens, out)

    print(
        f"test exact match {test_em:.4f}, token accuracy {test_acc:.4f} on {len(splits.test)} numbers; "
        f"{step} steps in {train_seconds:.0f} s ({metrics['tokens_per_second']:,.0f} tokens/s)"
    )
    print(f'example: "{example[0]}" -> "{" ".join(words)}"')
    print(f"wrote {out}/metrics.json, checkpoint.safetensors, loss_curve.png, attention_*.png")
    return metrics


if __name__ == "__main__":
    main()
