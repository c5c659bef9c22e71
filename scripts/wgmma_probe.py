"""Can a Numba kernel reach Hopper's warpgroup instructions?  A compile-only probe, no GPU needed.

    python scripts/wgmma_probe.py            # PTX target, ptxas's verdict and, where the tools are
                                             # on PATH, the SASS instructions, for sm_90a and sm_90

The Hopper forward of the performance issue needs ``wgmma.mma_async`` (the warpgroup matrix
product, operands from shared-memory descriptors, accumulators in registers) and ``setmaxnreg``
(producer and consumer warpgroups with their own register budgets).  Both exist only on the
architecture-specific target sm_90a.  This probe writes them the way ``kernels/perf/tc_gpu.py``
writes ``mma.sync``: inline PTX in CUDA C++ device functions linked into a Numba kernel through
``cuda.declare_device(..., link=cuda.CUSource(...))``, with link-time optimisation.  The kernel:
two warpgroups; the first gives registers back (``setmaxnreg.dec`` 40), the second takes them
(``setmaxnreg.inc`` 240) and issues one m64n64k16 fp16 -> fp32 ``wgmma`` between ``wgmma.fence``
and ``wgmma.commit_group`` / ``wait_group 0``, then stores its 32 accumulators a thread.

It compiles the kernel through numba-cuda's own path (``_compile_pyfunc_with_fixup``, then the LTO
PTX) for compute capability (9, 0, "a") and (9, 0) and runs ``ptxas`` on each PTX.  numba-cuda
0.30 compiles for (9, 0, "a") by itself when the GPU it runs on has compute capability 9.0
(``numba/cuda/codegen.py``, ``_ensure_cc``), so on an H100 or H200 every Numba kernel is already
an sm_90a kernel.  SASS is listed where ``cuobjdump`` and ``nvdisasm`` are on PATH (the
``nvidia-cuda-cuobjdump`` and ``nvidia-cuda-nvdisasm`` wheels carry them).  Nothing here runs the
kernel: whether the product is right, and how fast, is for a GPU.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout, as ptx_snapshot.py

_CU = r"""
extern "C" __device__ int fs_wgmma_m64n64k16_f16(int* ret, float* d, unsigned long long desc_a,
                                                  unsigned long long desc_b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, 1, 1, 1, 0, 0;"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(desc_a), "l"(desc_b));
    return 0;
}
extern "C" __device__ int fs_wgmma_fence(int* ret) {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    return 0;
}
extern "C" __device__ int fs_wgmma_commit(int* ret) {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    return 0;
}
extern "C" __device__ int fs_wgmma_wait0(int* ret) {
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    return 0;
}
extern "C" __device__ int fs_setmaxnreg_inc240(int* ret) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;");
    return 0;
}
extern "C" __device__ int fs_setmaxnreg_dec40(int* ret) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    return 0;
}
"""

#: SASS instructions that show the warpgroup path (HGMMA: the wgmma product; HMMA: mma.sync's)
SASS_OF_INTEREST = ("HGMMA", "WARPGROUP", "USETMAXREG", "HMMA")


def probe_kernel():
    """The probe kernel's Python function and its signature (nothing compiled yet)."""
    from cffi import FFI
    from numba import cuda, float32, types

    link = cuda.CUSource(_CU)
    i32 = types.int32
    wgmma = cuda.declare_device("fs_wgmma_m64n64k16_f16", i32(types.CPointer(float32), types.uint64, types.uint64),
                                link=link)
    fence, commit, wait0, inc, dec = (cuda.declare_device(n, i32(), link=link) for n in (
        "fs_wgmma_fence", "fs_wgmma_commit", "fs_wgmma_wait0", "fs_setmaxnreg_inc240", "fs_setmaxnreg_dec40"))
    ffi = FFI()

    def kernel(out, desc_a, desc_b):
        acc = cuda.local.array(32, float32)
        for i in range(32):
            acc[i] = 0.0
        if cuda.threadIdx.x // 128 == 0:  # the producer warpgroup: registers given back
            dec()
        else:  # the consumer warpgroup: one warpgroup product
            inc()
            fence()
            wgmma(ffi.from_buffer(acc), desc_a[0], desc_b[0])
            commit()
            wait0()
            for i in range(32):
                out[(cuda.threadIdx.x - 128) * 32 + i] = acc[i]

    return kernel, types.void(float32[::1], types.uint64[::1], types.uint64[::1])


def lto_ptx(cc: tuple) -> str:
    """The probe's PTX after link-time optimisation, compiled for ``cc`` ((9, 0, "a") or (9, 0))."""
    import numba.cuda.dispatcher as dispatcher
    from numba.cuda.compiler import _compile_pyfunc_with_fixup

    class _Device:
        compute_capability = cc[:2]

    fn, sig = probe_kernel()
    saved = dispatcher.get_current_device
    dispatcher.get_current_device = lambda: _Device()
    try:
        lib, _ = _compile_pyfunc_with_fixup(fn, sig, device=False, cc=cc, abi="numba", lto=True, launch_bounds=(256, 1))
        lib._lto = True
        return lib.get_lto_ptx(cc=cc).rstrip("\0")
    finally:
        dispatcher.get_current_device = saved


def assemble(ptx: str, arch: str) -> dict:
    """ptxas's verdict on ``ptx`` for ``arch`` (and the SASS instructions of interest, where
    cuobjdump and nvdisasm are on PATH); {} without ptxas."""
    if not shutil.which("ptxas"):
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        Path(src).write_text(re.sub(r"^\.version .*$", ".version 9.0", ptx, count=1, flags=re.M))
        res = subprocess.run(["ptxas", f"-arch={arch}", "-v", src, "-o", cubin], capture_output=True, text=True)
        out = {"ok": res.returncode == 0}
        errors = [ln.split("error", 1)[1].strip(" :") for ln in res.stderr.splitlines() if " error " in ln]
        if errors:
            out["errors"] = errors
        m = re.search(r"Used (\d+) registers", res.stderr)
        if m:
            out["registers"] = int(m.group(1))
        if out["ok"] and shutil.which("cuobjdump") and shutil.which("nvdisasm"):
            sass = subprocess.run(["cuobjdump", "-sass", cubin], capture_output=True, text=True).stdout
            ins = r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)"  # an instruction's opcode
            ops = Counter(m.group(1) for m in re.finditer(ins, sass))
            out["sass"] = {op: n for op, n in sorted(ops.items()) if op.startswith(SASS_OF_INTEREST)}
    return out


def main() -> int:
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        print("wgmma_probe: error: NUMBA_ENABLE_CUDASIM=1 (the simulator cannot compile)", file=sys.stderr)
        return 2
    import numba_cuda

    def version(tool):
        if not shutil.which(tool):
            return "not on PATH"
        out = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
        return out[-1] if out else "on PATH"

    print(f"numba-cuda {numba_cuda.__version__}; ptxas: {version('ptxas')}; cuobjdump: {version('cuobjdump')}; "
          f"nvdisasm: {'on PATH' if shutil.which('nvdisasm') else 'not on PATH'}")
    for cc, arch in (((9, 0, "a"), "sm_90a"), ((9, 0), "sm_90")):
        ptx = lto_ptx(cc)
        target = re.search(r"^\.target (\S+)", ptx, re.M).group(1)
        print(f"{arch}: PTX .target {target}, wgmma.mma_async {ptx.count('wgmma.mma_async')}, "
              f"setmaxnreg {ptx.count('setmaxnreg')}")
        res = assemble(ptx, arch)
        if not res:
            continue
        if res["ok"]:
            print(f"  ptxas: accepted, {res.get('registers')} registers")
        else:
            print("  ptxas: rejected: " + "; ".join(res.get("errors", ["(no error line)"])))
        if "sass" in res:
            print("  SASS: " + ", ".join(f"{op} x{n}" for op, n in res["sass"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
