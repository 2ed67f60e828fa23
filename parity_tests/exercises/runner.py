"""The grader's child: a small Python program that runs a student's forward and backward, and nothing else.

`python -I -S runner.py SITE SUBMISSION NAME FD` imports NumPy (and SciPy) from SITE, then the student's module
SUBMISSION, and serves the grader's requests: each one names `forward` or `backward` and carries its arguments
(arrays, numbers, strings, dicts and tuples of them, a cache by its number); the answer goes back on file
descriptor FD as arrays and numbers only. The student's caches stay here, known to the grader by number. This
file imports nothing of the project: the reference, the comparison and the verdict live in the grader, which
never imports the student's code (parity_tests.exercises.grading).

The messages are the same both ways (`pack`, `unpack`): 16 bytes (the lengths of a JSON header and of the data
after it, little-endian), the header (a tree of nodes: {"a": i} the i-th array, {"v": a JSON scalar},
{"t": [nodes]} a tuple, {"d": [[key, node], ...]} a dict, {"h": n} cache n, {"ns": [[key, node], ...]} an
object with attributes) and the arrays' bytes one after the other, each array's dtype (numbers only) and shape
listed in the header. Nothing is pickled: the grader reads what comes back as bytes it checks, never as code.
"""

from __future__ import annotations

import builtins
import dataclasses
import importlib.abc
import importlib.util
import json
import os
import struct
import sys
import types

if __name__ == "__main__":  # the child runs with -I -S: NumPy comes from the folder the grader names
    sys.path.append(sys.argv[1])

import numpy as np  # noqa: E402

DTYPES = frozenset(
    ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64"]
)
MAX_HEADER = 1 << 22  # bytes of JSON a message may carry (4 MiB)
MAX_DATA = 1 << 28  # bytes of arrays a message may carry (256 MiB)
MAX_DEPTH = 8  # nesting of tuples and dicts
MAX_NDIM = 16
MAX_TEXT = 400  # characters of a string (an error message is cut there)
REMOVED_BUILTINS = ("exec", "eval", "compile", "open", "breakpoint", "input", "exit", "quit")


class ProtocolError(ValueError):
    """A message that is not what the protocol allows (said in one sentence)."""


class Handle:
    """A cache the child keeps, known to the grader by its number."""

    def __init__(self, number: int):
        self.number = number

    def __repr__(self) -> str:
        return f"<cache {self.number}>"


def pack(meta: dict, value) -> bytes:
    """One message: `meta` (plain JSON) and `value` encoded as described in the module docstring."""
    arrays: list = []
    body = _node(value, arrays, 0)
    header = {"meta": meta, "body": body, "arrays": [[a.dtype.name, list(a.shape)] for a in arrays]}
    head = json.dumps(header).encode()
    data = b"".join(a.tobytes() for a in arrays)
    return struct.pack("<QQ", len(head), len(data)) + head + data


def _node(v, arrays: list, depth: int):
    """The node of `v` (arrays appended to `arrays`); TypeError for anything the protocol cannot carry."""
    if depth > MAX_DEPTH:
        raise TypeError(f"nested more than {MAX_DEPTH} deep")
    if isinstance(v, np.ndarray | np.generic):
        a = np.ascontiguousarray(v)
        if a.dtype.name not in DTYPES:
            raise TypeError(f"an array of dtype {a.dtype}, which cannot be sent back (numbers only)")
        arrays.append(a)
        return {"a": len(arrays) - 1}
    if v is None or type(v) in (bool, int, float, str):
        return {"v": v}
    if isinstance(v, tuple | list):
        return {"t": [_node(x, arrays, depth + 1) for x in v]}
    if isinstance(v, dict) and all(type(k) is str for k in v):
        return {"d": [[k, _node(x, arrays, depth + 1)] for k, x in v.items()]}
    if isinstance(v, Handle):
        return {"h": v.number}
    if isinstance(v, types.SimpleNamespace) or (dataclasses.is_dataclass(v) and not isinstance(v, type)):
        fields = (
            vars(v)
            if isinstance(v, types.SimpleNamespace)
            else {f.name: getattr(v, f.name) for f in dataclasses.fields(v)}
        )
        return {"ns": [[k, _node(x, arrays, depth + 1)] for k, x in fields.items()]}
    raise TypeError(f"a {type(v).__name__}, which cannot be sent back (arrays, numbers, tuples and dicts only)")


def unpack(read, *, trusted: bool = False):
    """(meta, value) of one message; `read(n)` returns exactly n bytes (or raises). Anything that is not what the
    protocol allows raises ProtocolError; every array is a fresh copy of a numeric dtype. Unless `trusted`, the
    value may hold no cache numbers nor objects (only the grader sends those)."""
    try:
        size_head, size_data = struct.unpack("<QQ", read(16))
    except struct.error as exc:
        raise ProtocolError(f"a message without its lengths ({exc})") from None
    if size_head > MAX_HEADER or size_data > MAX_DATA:
        raise ProtocolError(f"a message of {size_head} + {size_data} bytes, over the limits")
    try:
        header = json.loads(read(size_head).decode())
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"a header that is not JSON ({type(exc).__name__})") from None
    if (
        not isinstance(header, dict)
        or set(header) != {"meta", "body", "arrays"}
        or not isinstance(header["meta"], dict)
    ):
        raise ProtocolError("a header without exactly meta, body and arrays")
    specs = header["arrays"]
    if not isinstance(specs, list):
        raise ProtocolError("arrays is not a list")
    shapes = [_spec(s) for s in specs]
    sizes = [np.dtype(d).itemsize * int(np.prod(shape, dtype=np.int64)) for d, shape in shapes]
    if sum(sizes) != size_data:
        raise ProtocolError(f"the arrays listed take {sum(sizes)} bytes, the message carries {size_data}")
    data = read(size_data)
    arrays, offset = [], 0
    for (dtype, shape), size in zip(shapes, sizes, strict=True):
        flat = np.frombuffer(data, dtype=dtype, count=size // np.dtype(dtype).itemsize, offset=offset)
        arrays.append(flat.reshape(shape).copy())
        offset += size
    return header["meta"], _value(header["body"], arrays, 0, trusted)


def _spec(spec):
    if not (isinstance(spec, list) and len(spec) == 2 and spec[0] in DTYPES and isinstance(spec[1], list)):
        raise ProtocolError(f"an array listed as {str(spec)[:80]}, not [dtype, shape] of a numeric dtype")
    shape = spec[1]
    if len(shape) > MAX_NDIM or not all(type(n) is int and 0 <= n <= MAX_DATA for n in shape):
        raise ProtocolError(f"an array of shape {str(shape)[:80]}")
    return spec[0], tuple(shape)


def _value(node, arrays: list, depth: int, trusted: bool):
    if depth > MAX_DEPTH + 1:
        raise ProtocolError(f"a value nested more than {MAX_DEPTH} deep")
    if not isinstance(node, dict) or len(node) != 1:
        raise ProtocolError(f"a node {str(node)[:80]}, not one of a, v, t, d")
    ((kind, content),) = node.items()
    if kind == "a" and type(content) is int and 0 <= content < len(arrays):
        return arrays[content]
    if kind == "v" and (content is None or type(content) in (bool, int, float, str)):
        return content[:MAX_TEXT] if isinstance(content, str) else content
    if kind == "t" and isinstance(content, list):
        return tuple(_value(x, arrays, depth + 1, trusted) for x in content)
    if kind in ("d", "ns") and isinstance(content, list) and (kind == "d" or trusted):
        items = {}
        for item in content:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
                raise ProtocolError(f"a dict entry {str(item)[:80]}")
            items[item[0][:MAX_TEXT]] = _value(item[1], arrays, depth + 1, trusted)
        return items if kind == "d" else types.SimpleNamespace(**items)
    if kind == "h" and trusted and type(content) is int:
        return Handle(content)
    raise ProtocolError(f"a node {str(node)[:80]} the protocol does not allow here")


class _Refuser(importlib.abc.MetaPathFinder):
    """Refuses, and remembers, an import of the reference, the project or torch that is not already loaded (the
    encoder layer's chained pairs are loaded before the student's code)."""

    def __init__(self, refused_modules):
        self.refused_modules = tuple(refused_modules)
        self.refused: list = []

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.refused_modules:
            self.refused.append(fullname)
            raise ImportError(f"{fullname} may not be imported by a submission")
        return None


# System calls the student's code may not make, by machine: starting a process or a program (a thread is allowed:
# clone with CLONE_THREAD), signalling or tracing another process. (AUDIT_ARCH, {name: number}.)
SYSCALLS = {
    "x86_64": (
        0xC000003E,
        {"fork": 57, "vfork": 58, "execve": 59, "execveat": 322, "kill": 62, "tkill": 200, "tgkill": 234,
         "ptrace": 101, "process_vm_writev": 311, "pidfd_send_signal": 424},
        {"clone": 56, "clone3": 435},
    ),
    "aarch64": (
        0xC00000B7,
        {"execve": 221, "execveat": 281, "kill": 129, "tkill": 130, "tgkill": 131, "ptrace": 117,
         "process_vm_writev": 271, "pidfd_send_signal": 424},
        {"clone": 220, "clone3": 435},
    ),
}  # fmt: skip
CLONE_THREAD = 0x00010000


def no_new_processes() -> bool:
    """Forbid this process, from now on, the system calls of SYSCALLS (a seccomp filter, which nothing it runs can
    remove): they fail with EPERM (clone3 with ENOSYS, so that a thread falls back to clone). False where this
    machine has no such filter (not Linux, another processor)."""
    import ctypes
    import platform

    if not sys.platform.startswith("linux") or platform.machine() not in SYSCALLS:
        return False
    arch, refused, spawning = SYSCALLS[platform.machine()]
    clone, clone3 = spawning["clone"], spawning["clone3"]
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    load, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    program = [(load, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, eperm), (load, 0, 0, 0), (jge, 0, 1, 0x40000000)]
    program += [(ret, 0, 0, eperm)]  # x32 system calls: none needed
    for number in refused.values():
        program += [(jeq, 0, 1, number), (ret, 0, 0, eperm)]
    program += [(jeq, 0, 1, clone3), (ret, 0, 0, enosys), (jeq, 1, 0, clone), (ret, 0, 0, allow)]
    program += [(load, 0, 0, 16), (jset, 0, 1, CLONE_THREAD), (ret, 0, 0, allow), (ret, 0, 0, eperm)]

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    filters = (Filter * len(program))(*[Filter(*f) for f in program])
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS: required of an unprivileged filter
        return False
    return libc.prctl(22, 2, ctypes.byref(Program(len(program), filters)), 0, 0) == 0  # PR_SET_SECCOMP, FILTER


def _reader(stream):
    def read(n: int) -> bytes:
        data = stream.read(n)
        if len(data) != n:
            raise EOFError("the grader closed the request stream")
        return data

    return read


def main(argv) -> None:
    """The child's loop (see the module docstring). argv: SITE SUBMISSION NAME FD REFUSED (comma-separated) TAG
    (the name of the grader's folder for this child, which only marks its processes)."""
    site, submission, name, fd, refused_modules, _tag = argv
    answers = os.fdopen(int(fd), "wb", buffering=0)
    read = _reader(sys.stdin.buffer)
    sys.stdin = open(os.devnull)  # noqa: SIM115  the student's code reads nothing from the grader
    refuser = _Refuser(refused_modules.split(","))
    if name == "encoder_layer":  # the reference's pairs the exercise chains, loaded before the refuser
        importlib.import_module("numpy_transformer")
        importlib.import_module("numpy_transformer.layers")
    sys.meta_path.insert(0, refuser)
    contained = no_new_processes()
    state: dict = {"caches": {}, "submission": submission, "name": name}
    while True:
        try:
            meta, value = unpack(read, trusted=True)
        except EOFError:
            os._exit(0)
        try:
            reply, result = _serve(meta["op"], value, state)
        except SystemExit as exc:
            reply, result = {"exit": f"called sys.exit({exc.code!r}) instead of returning"}, None
        except BaseException as exc:  # KeyboardInterrupt too: the student's, reported, not ours
            reply, result = {"error": type(exc).__name__, "message": _text(exc)}, None
        sys.stdout.flush()
        sys.stderr.flush()
        reply["refused"] = list(dict.fromkeys(refuser.refused))
        reply["contained"] = contained
        try:
            message = pack(reply, result)
        except Exception as exc:  # noqa: BLE001  what the student's code returned cannot be sent: say so
            message = pack({"error": "TypeError", "message": f"returned {_text(exc)}", "refused": reply["refused"]}, 0)
        answers.write(message)


def _serve(op: str, value, state: dict):
    """One request: load the submission, or call its forward or backward. (reply, result)."""
    if op == "load":
        spec = importlib.util.spec_from_file_location(f"submission_{state['name']}", state["submission"])
        module = importlib.util.module_from_spec(spec)
        module.__dict__["__builtins__"] = {k: v for k, v in vars(builtins).items() if k not in REMOVED_BUILTINS}
        spec.loader.exec_module(module)
        state["forward"], state["backward"] = module.forward, module.backward
        return {"ok": True}, None
    caches = state["caches"]
    args = [caches[a.number] if isinstance(a, Handle) else a for a in value["args"]]
    result = state[op](*args, **value["kwargs"])
    if op == "backward":
        return {"ok": True}, result
    if not (isinstance(result, tuple) and len(result) == 2):
        raise TypeError(f"forward returned a {type(result).__name__}, expected (out, cache)")
    caches[len(caches)] = result[1]
    return {"ok": True, "cache": len(caches) - 1}, result[0]


def _text(exc: BaseException) -> str:
    try:
        return str(exc)[:MAX_TEXT]
    except Exception:  # noqa: BLE001  an exception whose message itself raises
        return "(its message cannot be printed)"


if __name__ == "__main__":
    main(sys.argv[1:])
