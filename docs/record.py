"""Run a measurement and check in what it wrote, stamped with the date and the machine.

The docs' speed and training tables are generated from the JSON files under docs/data/, never typed. Each
file is what a benchmark (``--json``) or a training run (``metrics.json``) wrote, wrapped as

    {"recorded": {"date": ..., "machine": {...}, "command": [...]}, "data": <what the command wrote>}

Usage (``{tmp}`` in the command is replaced by a fresh temporary folder; ``--reads`` names the file the
command writes there, ``{tmp}/out.json`` by default):

    python docs/record.py docs/data/bench.json -- python benchmarks/bench.py --json {tmp}/out.json
    python docs/record.py docs/data/flash_attention.json -- python benchmarks/flash_attention.py --json {tmp}/out.json
    python docs/record.py docs/data/training_numpy.json --reads {tmp}/metrics.json -- \\
        python examples/train_numbers.py --minutes 2 --out {tmp}
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (the platform's processor string where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict:
    """What the figures depend on: CPU, the cores this process may use, Python, NumPy and torch versions."""
    import numpy

    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    return {
        "cpu": cpu_model(),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "system": platform.platform(),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "torch": torch_version,
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], usage="%(prog)s target [--reads PATH] -- command ..."
    )
    parser.add_argument("target", type=Path, help="the JSON file to write (under docs/data/)")
    parser.add_argument("--reads", default="{tmp}/out.json", help="the file the command writes")
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    args, command = parser.parse_args(argv[:split]), argv[split + 1 :]
    if not command:
        parser.error("command: expected the measurement to run after --, got nothing")
    with tempfile.TemporaryDirectory() as tmp:
        command = [part.replace("{tmp}", tmp) for part in command]
        started = datetime.datetime.now(datetime.timezone.utc)
        load_before = os.getloadavg()[0]
        subprocess.run(command, check=True)
        load_after = os.getloadavg()[0]
        data = json.loads(Path(args.reads.replace("{tmp}", tmp)).read_text())
    shown = [part.replace(tmp, "{tmp}") for part in command]
    record = {
        "recorded": {
            "date": started.isoformat(timespec="seconds"),
            "machine": machine(),
            "command": shown,
            # other processes on the same cores slow a measurement down: the 1-minute load average says how busy
            "load_average": [round(load_before, 2), round(load_after, 2)],
        }
    }
    record["data"] = data
    args.target.parent.mkdir(parents=True, exist_ok=True)
    args.target.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.target}", file=sys.stderr)


if __name__ == "__main__":
    main()
