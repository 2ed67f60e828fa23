"""How the grader starts its child (parity_tests/exercises/runner.py): under bubblewrap where the machine has it.

With `bwrap` (Linux, the Debian package bubblewrap) the child sees the Python installation read-only (its standard
library; site-packages is an empty folder), NumPy and SciPy read-only in /site, the runner and its submission
read-only in /grader (a copy of the student's file, nothing else of theirs or of the project), a private
temporary folder as its working folder, and nothing else: no network, no other process (its own process
namespace, so that killing it at the time limit kills everything it started), no terminal session, no
capabilities. Without bubblewrap the child is a plain process in a fresh working folder of its own, with the
same resource limits, which cannot stop it from reading or writing the user's files (`warning`). Either way the
limits are set in the child before it runs (`limits`): address space, processes, open files, file size and CPU
time; and on Linux (x86-64, arm64) the child forbids itself, before the student's code runs, to start a process
or a program, or to signal or trace another (runner.no_new_processes, a seccomp filter).
"""

from __future__ import annotations

import importlib.util
import os
import platform
import resource
import shutil
import site as site_module
import subprocess
import sys
import sysconfig
from functools import cache
from pathlib import Path

from . import runner

__all__ = ["warning", "level", "bwrap", "command", "limits", "site_folder", "CHAINED_MODULES"]
ADDRESS_SPACE = 4 << 30  # bytes: NumPy and SciPy loaded, a few exercises' arrays; a 50 GB allocation fails
PROCESSES = 64  # more than the user runs already (the limit counts them all); a root user's are not counted
OPEN_FILES = 64
FILE_SIZE = 64 << 20  # bytes a file the child writes may reach (its private /tmp is in memory)
PACKAGES = ("numpy", "scipy")  # what a submission may import besides the standard library
# The encoder layer's exercise chains the reference's pairs: these modules of numpy_transformer, which import
# nothing of the project outside themselves, are copied beside the submission, and nothing else of it.
CHAINED_MODULES = ("layers", "attention", "flash_attention", "scores", "sinks", "validation", "special")
CHAINED_INIT = (
    '"""The reference pairs an encoder layer chains, and only those."""\n\n'
    "from .attention import multi_head_attention_backward, multi_head_attention_forward  # noqa: F401\n"
)
RUNNER = Path(__file__).with_name("runner.py")


def level() -> str:
    """How the child is isolated here: "bubblewrap", "no new processes" (the seccomp filter only) or "none"."""
    if bwrap() is not None:
        return "bubblewrap"
    machine = platform.machine()
    return "no new processes" if sys.platform.startswith("linux") and machine in runner.SYSCALLS else "none"


def warning() -> str | None:
    """What the grader cannot stop here, in a sentence for the teacher (None under bubblewrap)."""
    if level() == "bubblewrap":
        return None
    cannot = "read any file you can (the reference's source among them) and write any file you can (a classmate's"
    cannot += " copy among them)"
    if level() == "none":
        cannot += ", start processes and send signals"
    return (
        "bubblewrap (bwrap) is not available here, so each submission runs as a plain process of yours: its verdict"
        f" is out of its reach, but it can {cannot}. Grade an exam on a Linux machine with bubblewrap installed"
        " (apt-get install bubblewrap); see the teaching how-to."
    )


@cache
def bwrap() -> str | None:
    """The path of a bubblewrap that runs here (user namespaces can be disabled even where it is installed),
    or None."""
    path = shutil.which("bwrap")
    if path is None or not sys.platform.startswith("linux"):
        return None
    probe = [path, "--unshare-all", "--die-with-parent", "--cap-drop", "ALL", *_python_binds(), "--proc", "/proc"]
    probe += ["--dev", "/dev", _real(sys.executable), "-I", "-S", "-c", "pass"]
    try:
        done = subprocess.run(probe, capture_output=True, timeout=30, check=False, preexec_fn=limits(30))
    except (OSError, subprocess.TimeoutExpired):
        return None
    return path if done.returncode == 0 else None


def _real(path) -> str:
    return os.path.realpath(path)


def _python_binds() -> list:
    """bwrap arguments: /usr (the C libraries), the interpreter, its standard library (site-packages hidden)."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/lib", "/lib64", "/bin"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    paths = sysconfig.get_paths()
    shown = {_real(sys.executable), _real(paths["stdlib"]), _real(paths["platstdlib"])}
    library = sysconfig.get_config_var("LIBDIR")
    if library and sysconfig.get_config_var("LDLIBRARY"):
        shown.add(_real(Path(library) / sysconfig.get_config_var("LDLIBRARY")))
    for path in sorted(p for p in shown if not p.startswith("/usr/")):
        args += ["--ro-bind-try", path, path]
    bound = ["/usr", *shown]
    for site in sorted({_real(p) for p in [paths["purelib"], paths["platlib"], *site_module.getsitepackages()]}):
        if os.path.isdir(site) and any(site.startswith(p + "/") for p in bound):
            args += ["--tmpfs", site]  # the installed packages (the project, torch) out of sight
    return args


def site_folder(folder: Path, name: str) -> Path:
    """`folder`/site: what the child may import besides the standard library, as links to NumPy and SciPy
    (and their bundled libraries) and, for the encoder layer, a copy of the pairs it chains."""
    site = folder / "site"
    site.mkdir()
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        where = Path(spec.submodule_search_locations[0])
        for path in (where, where.with_name(f"{package}.libs")):
            if path.exists():
                (site / path.name).symlink_to(path)
    if name == "encoder_layer":
        source = Path(importlib.util.find_spec("numpy_transformer").submodule_search_locations[0])
        package = site / "numpy_transformer"
        package.mkdir()
        for module in CHAINED_MODULES:
            shutil.copyfile(source / f"{module}.py", package / f"{module}.py")
        (package / "__init__.py").write_text(CHAINED_INIT)
    return site


def command(folder: Path, site: Path, submission: Path, name: str, fd: int, refused: str) -> list:
    """The child's command line: the runner under bwrap when it runs here, else a plain isolated Python."""
    arguments = [name, str(fd), refused, folder.name]  # the folder's name: the child's processes findable by it
    if bwrap() is None:
        return [sys.executable, "-I", "-S", str(RUNNER), str(site), str(submission), *arguments]
    args = [bwrap(), "--unshare-all", "--new-session", "--die-with-parent", "--cap-drop", "ALL"]
    args += ["--uid", "65534", "--gid", "65534", *_python_binds()]
    for entry in sorted(site.iterdir()):
        args += ["--ro-bind", _real(entry), f"/site/{entry.name}"]
    args += ["--ro-bind", str(RUNNER), "/grader/runner.py", "--ro-bind", str(submission), f"/grader/{name}.py"]
    args += ["--proc", "/proc", "--dev", "/dev", "--size", str(FILE_SIZE), "--tmpfs", "/tmp", "--chdir", "/tmp"]
    args += ["--setenv", "HOME", "/tmp"]
    return [*args, _real(sys.executable), "-I", "-S", "/grader/runner.py", "/site", f"/grader/{name}.py", *arguments]


def _processes_of_this_user() -> int:
    """How many processes this user runs now (Linux's /proc; 0 where there is none)."""
    count = 0
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            count += entry.stat().st_uid == os.getuid()
        except OSError:
            pass
    return count


def limits(cpu_seconds: float):
    """A preexec_fn setting the child's resource limits (see the module docstring)."""
    cpu = int(cpu_seconds) + 2
    processes = PROCESSES + _processes_of_this_user()

    def apply() -> None:
        for limit, value in (
            (resource.RLIMIT_AS, ADDRESS_SPACE),
            (resource.RLIMIT_NPROC, processes),
            (resource.RLIMIT_NOFILE, OPEN_FILES),
            (resource.RLIMIT_FSIZE, FILE_SIZE),
            (resource.RLIMIT_CPU, cpu),
            (resource.RLIMIT_CORE, 0),
        ):
            soft, hard = resource.getrlimit(limit)
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(limit, (value, value))

    return apply
