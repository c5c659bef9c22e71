"""The LTO PTX of the shipped fast kernels, without a GPU: a snapshot to hold a change against.

    python scripts/ptx_snapshot.py DIR [variant ...]     # write DIR/<kernel>.ptx and DIR/summary.json
    python scripts/ptx_snapshot.py --compare OLD NEW     # which kernels' PTX differ
    python scripts/ptx_snapshot.py --bf16 DIR [variant ...]  # the fp16 variants compiled for bf16

Every variant of :data:`kernels.perf.VARIANTS` (or those named) is compiled for sm_90 with its
default block shape at d = 64 and 128, causal or not (``kernels.perf.inspect``'s way: NVVM and
nvJitLink, no device), its kernels captured at ``tc.jit_kernel``.  The PTX is written with the
mangled function names replaced (they carry the module's name) and compared with the shared
arrays' symbol numbers set aside (they count the kernels compiled before in the process).  The
summary has ptxas's registers and spills where ``ptxas`` is found (``kernels.perf.inspect.tool``:
the test extra's wheel, else PATH; the PTX's ``.version`` is lowered to 9.0 for an older one,
which changes nothing in the code), and the counts of ``mma.sync``,
``ldmatrix`` and ``cp.async``.  Run from the repository root, without ``NUMBA_ENABLE_CUDASIM``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's kernels, not an installed one


def _norm(ptx: str) -> str:
    return re.sub(r"_cudapy_smem_\d+", "SMEM", ptx)


def compare(old: str, new: str) -> int:
    diff = 0
    for p in sorted(Path(new).glob("*.ptx")):
        q = Path(old) / p.name
        state = "missing" if not q.exists() else ("same" if _norm(q.read_text()) == _norm(p.read_text()) else "DIFF")
        diff += state != "same"
        print(f"{state:7s} {p.stem}")
    return 1 if diff else 0


def _ptxas(ptx: str) -> dict:
    from kernels.perf.inspect import ptxas_resources, tool

    ptxas = tool("ptxas")
    if not ptxas:
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(re.sub(r"^\.version .*$", ".version 9.0", ptx, count=1, flags=re.M))
        arch = re.search(r"^\.target\s+(sm_\w+)", ptx, re.M)
        info = subprocess.run([ptxas, f"-arch={arch.group(1) if arch else 'sm_90'}", "-v", src,
                               "-o", os.path.join(tmp, "k.cubin")],
                              capture_output=True, text=True).stderr
    res = ptxas_resources(info)
    return {k: res[k] for k in ("registers", "spill_store_bytes", "spill_load_bytes")}


def snapshot(out: str, names: list[str], bf16: bool = False) -> int:
    import numba.cuda.dispatcher as dispatcher
    from numba.cuda.compiler import _compile_pyfunc_with_fixup

    from kernels import perf
    from kernels.perf import inspect, tc

    captured = []
    tc.jit_kernel = lambda fn, threads, min_blocks=1: captured.append((fn, threads, min_blocks)) or fn
    os.makedirs(out, exist_ok=True)
    summary = {}
    extra = {"bf16": True} if bf16 else {}
    for name in names or [n for n in perf.VARIANTS if not bf16 or "fp16" in n]:
        v = perf.variant(name)
        parts = list(v.SOURCES)
        for d in (64, 128):
            for causal in (False, True):
                cfg = v.default_config(d)
                captured.clear()
                if hasattr(v, "kernels"):  # bwd_fp16_v1: its two kernels, in SOURCES' order
                    v.kernels.__wrapped__(d, causal, **cfg, **extra)
                elif hasattr(v, "forward"):
                    getattr(v.kernel, "__wrapped__", v.kernel)(d=d, causal=causal, **cfg, **extra)
                else:
                    v.kernel.__wrapped__(d, causal, **cfg, **extra)
                for part, (fn, nt, minb) in zip(parts, captured):
                    saved = dispatcher.get_current_device
                    dispatcher.get_current_device = lambda: inspect._Hopper()
                    cc = getattr(v, "CC", inspect.CC)  # sm_90a for the warpgroup kernels
                    try:
                        lib, _ = _compile_pyfunc_with_fixup(fn, v.SOURCES[part][1](), device=False, cc=cc,
                                                            abi="numba", lto=True, launch_bounds=(nt, minb))
                        lib._lto = True
                        ptx = lib.get_lto_ptx(cc=cc).rstrip("\0")
                    finally:
                        dispatcher.get_current_device = saved
                    label = (f"{name}{'-' + part if len(parts) > 1 else ''}-d{d}-{'causal' if causal else 'full'}"
                             f"{'-bf16' if bf16 else ''}")
                    Path(out, label + ".ptx").write_text(re.sub(r"_ZN[0-9A-Za-z_$]+", "FN", ptx))
                    summary[label] = dict(_ptxas(ptx), mma=ptx.count("mma.sync"), ldmatrix=ptx.count("ldmatrix"),
                                          cp_async=ptx.count("cp.async.cg"), local=".local" in ptx)
                    print(label, summary[label], flush=True)
    Path(out, "summary.json").write_text(json.dumps(summary, indent=1))
    return 0


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        print("ptx_snapshot: error: NUMBA_ENABLE_CUDASIM=1 (the simulator cannot compile)", file=sys.stderr)
        return 2
    if args[0] == "--compare":
        if len(args) != 3:
            print("ptx_snapshot: error: --compare takes OLD and NEW", file=sys.stderr)
            return 2
        return compare(args[1], args[2])
    from kernels import perf

    bf16 = args[0] == "--bf16"
    if bf16:
        args = args[1:]
        if not args:
            print("ptx_snapshot: error: --bf16 takes DIR", file=sys.stderr)
            return 2
    unknown = [n for n in args[1:] if n not in perf.VARIANTS or (bf16 and "fp16" not in n)]
    if unknown:
        names = ", ".join(sorted(perf.VARIANTS))
        print(f"ptx_snapshot: error: variant={unknown[0]!r}: one of {names}", file=sys.stderr)
        return 2
    return snapshot(args[0], args[1:], bf16)


if __name__ == "__main__":
    sys.exit(main())
