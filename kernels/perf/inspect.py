"""Compile a numbered variant for sm_90 without a GPU and report what the compiler made of it.

    python -m kernels.perf.inspect fwd_fp16_v4 64 64 4 2 0 1     # the variant's kernel source(*args)
    python -m kernels.perf.inspect bwd_fp16_v1:dq 64 64 4 1 1 1  # one of a variant's SOURCES
    python -m kernels.perf.inspect fwd_fp16_v7 64 64 8 1 1 0 --kw LPT=1  # a keyword of the source

Prints the post-link-time-optimisation PTX's size and ``mma.sync`` count, and, where ``ptxas``
and ``cuobjdump`` are found (the ``nvidia-cuda-nvcc`` and ``nvidia-cuda-cuobjdump`` wheels of the
``test`` extra first, else PATH: :func:`tool`), the registers, stack frame and spills, the counts
of the SASS instructions that matter (HMMA, LDSM, LDGSTS, MUFU.EX2, local-memory LDL/STL, CALL),
and those of the main loop (:func:`hot_loop`).  Everything here needs only NVVM, NVRTC and nvJitLink, which pip
provides, so it runs on the CPU machine; the tests use :func:`lto_ptx` the same way.

numba-cuda compiles a kernel's device functions for the *current* device's compute capability;
with no GPU there is none, so :func:`lto_ptx` answers that question with (9, 0) while it
compiles.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter

from flashsim.cmdline import ToolParser

from . import variant

CC = (9, 0)


class _Hopper:
    compute_capability = CC


def lto_ptx(module: str, *args, min_blocks: int = 1, **kw) -> str:
    """PTX of variant ``module``'s kernel source (``SOURCES``: its only one, or ``module:part``'s)
    called with ``args`` (and keywords ``kw``, e.g. ``BF16=True``), after linking its CUDA C++
    helpers with LTO."""
    import numba.cuda.dispatcher as dispatcher
    from numba.cuda.compiler import _compile_pyfunc_with_fixup

    name, _, part = module.partition(":")
    mod = variant(name)
    source, signature = mod.SOURCES[part] if part else next(iter(mod.SOURCES.values()))
    fn, nt, _ = source(*args, **kw)
    cc = getattr(mod, "CC", CC)  # (9, 0, "a") for a variant that needs sm_90a's instructions
    saved = dispatcher.get_current_device
    dispatcher.get_current_device = lambda: _Hopper()
    try:
        lib, _ = _compile_pyfunc_with_fixup(fn, signature(), device=False, cc=cc, abi="numba", lto=True,
                                            launch_bounds=(nt, min_blocks))
        lib._lto = True  # the library was built from LTO-IR; let it link and emit PTX
        return lib.get_lto_ptx(cc=cc).rstrip("\0")
    finally:
        dispatcher.get_current_device = saved


def tool(name: str) -> str | None:
    """The path of CUDA tool ``name`` (``ptxas``, ``cuobjdump``, ``nvdisasm``): the pip wheels' first
    (``nvidia-cuda-nvcc``, ``-cuobjdump``, ``-nvdisasm``, in the ``test`` extra), whose ptxas reads the
    PTX that the NVVM of the same CUDA release writes (an older system ptxas refuses its newer
    ``.version``), else PATH's; None if neither has it."""
    try:
        import nvidia

        for root in getattr(nvidia, "__path__", []):
            for sub in ("cu13", "cuda_nvcc", "cuda_cuobjdump", "cuda_nvdisasm"):
                path = os.path.join(root, sub, "bin", name)
                if os.access(path, os.X_OK):
                    return path
    except ImportError:
        pass
    return shutil.which(name)


_OP = re.compile(r"^\s+/\*([0-9a-f]+)\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)([^;]*);", re.M)


def hot_loop(sass: str) -> dict:
    """The loop of the SASS that holds the most HMMA or HGMMA (a backward branch's target to the
    branch): its instructions, HMMA, HGMMA, CALL (a call in a kernel's main loop is a library routine, such as the
    64-bit division that bwd_fp16_v3's loop once made 7 times a step) and local-memory accesses
    (LDL/STL: spills).  Counted statically, each instruction once."""
    ins = [(int(m.group(1), 16), m.group(2), m.group(3)) for m in _OP.finditer(sass)]
    best = []

    def products(body):  # mma.sync (HMMA) and warpgroup (HGMMA) products
        return body.count("HMMA") + body.count("HGMMA")

    for a, op, rest in ins:
        br = re.search(r"(0x[0-9a-f]+)\s*$", rest) if op == "BRA" else None
        if br and int(br.group(1), 16) < a:
            body = [o for x, o, _ in ins if int(br.group(1), 16) <= x <= a]
            if products(body) > products(best):
                best = body
    return {"loop_instructions": len(best), "loop_HMMA": best.count("HMMA"), "loop_HGMMA": best.count("HGMMA"),
            "loop_CALL": best.count("CALL"), "loop_local": best.count("LDL") + best.count("STL")}


def ptxas_resources(info: str) -> dict:
    """Registers, stack frame and spill bytes from ``ptxas -v``'s report (None where absent)."""
    out = {}
    for key, pat in (("registers", r"Used (\d+) registers"), ("stack_bytes", r"(\d+) bytes stack frame"),
                     ("spill_store_bytes", r"(\d+) bytes spill stores"),
                     ("spill_load_bytes", r"(\d+) bytes spill loads")):
        m = re.search(pat, info)
        out[key] = int(m.group(1)) if m else None
    return out


def sass_report(ptx: str, sass_out: str | None = None) -> dict:
    """ptxas's resource line, SASS instruction counts and :func:`hot_loop`'s (empty if the tools
    are missing); ``sass_out``: a file to write the SASS listing to."""
    ptxas, cuobjdump = tool("ptxas"), tool("cuobjdump")
    if not (ptxas and cuobjdump):
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        p, c = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(p, "w") as f:
            f.write(ptx)
        target = re.search(r"^\.target\s+(sm_\w+)", ptx, re.M)  # sm_90a where the PTX needs it
        res = subprocess.run([ptxas, f"-arch={target.group(1) if target else 'sm_90'}", "-v", p, "-o", c],
                             capture_output=True, text=True)
        if res.returncode:
            return {"ptxas_error": res.stderr.strip()[-500:]}
        nvdisasm = tool("nvdisasm")  # cuobjdump -sass runs it: PATH, or NVDISASM_PATH
        env = dict(os.environ, **({"NVDISASM_PATH": os.path.dirname(nvdisasm)} if nvdisasm else {}))
        dump = subprocess.run([cuobjdump, "-sass", c], capture_output=True, text=True, env=env)
        if dump.returncode or not _OP.search(dump.stdout):
            return {"cuobjdump_error": (dump.stderr.strip() or "no SASS in its output")[-500:]}
        sass = dump.stdout
    if sass_out:
        with open(sass_out, "w") as f:
            f.write(sass)
    out = ptxas_resources(res.stderr)
    ops = Counter(m.group(2) for m in _OP.finditer(sass))
    out["instructions"] = sum(ops.values())
    for op in ("HMMA", "HGMMA", "LDSM", "LDGSTS", "MUFU", "FFMA", "LDS", "LDL", "STL", "SHFL", "BAR", "CALL"):
        out[op] = ops.get(op, 0)
    out.update(hot_loop(sass))
    return out


def main(argv=None) -> int:
    ap = ToolParser(description=__doc__.splitlines()[0])
    ap.add_argument("variant")
    ap.add_argument("args", nargs="*", type=int, help="the variant's _source arguments (booleans as 0/1)")
    ap.add_argument("--minb", type=int, default=1, help="blocks per SM promised to ptxas (launch bounds)")
    ap.add_argument("--sass", metavar="FILE", help="also write the SASS listing to FILE")
    ap.add_argument("--kw", nargs="*", default=[], metavar="KEY=INT",
                    help="keyword arguments of the source (booleans as 0/1), e.g. LPT=1 or BF16=1")
    a = ap.parse_args(argv)
    kw = {}
    for item in a.kw:
        key, sep, val = item.partition("=")
        if not (sep and key.isidentifier()):
            ap.error(f"--kw {item}: want KEY=INT")
        try:
            kw[key] = int(val)
        except ValueError:
            ap.error(f"--kw {item}: {val!r} is not an integer")
    if a.sass:
        try:
            open(a.sass, "a").close()  # writable, before minutes of compiling
        except OSError as e:
            ap.error(f"--sass {a.sass}: {e.strerror}")
    try:
        ptx = lto_ptx(a.variant, *a.args, min_blocks=a.minb, **kw)
    except (ValueError, TypeError) as e:  # an unknown variant, or arguments its source does not take
        ap.exit(2, f"{ap.prog}: error: {e}\n")
    print(f"{a.variant}{tuple(a.args)}{kw or ''}: PTX {len(ptx)} chars, {ptx.count('mma.sync')} mma.sync, "
          f"{'has' if '.local' in ptx else 'no'} .local")
    rep = sass_report(ptx, a.sass)
    missing = "(no ptxas/cuobjdump: the test extra's wheels or PATH)"
    print("  " + (", ".join(f"{k} {v}" for k, v in rep.items()) if rep else missing))
    return 0


if __name__ == "__main__":
    sys.exit(main())
