"""Context parallelism: attention over P devices, each with its own HBM, joined by NVLink.

When a sequence is too long for one GPU it is split over P devices, and the IO question has two
levels: the HBM traffic of each device, and the bytes over the interconnect, which may or may not
hide under the compute.  This module counts both for two schedules, forward and backward, of
self-attention (Nq = Nk = N) on P devices:

**Ring attention** (``parallel="ring"``).  Device r keeps its query shard and its K, V shard; the
K, V shards travel round the ring r -> r + 1, so at step s (0 <= s < P) device r holds the shard
of device src = (r - s) mod P, and the transfer for step s + 1 runs while step s computes (P − 1
transfers).  Each step is one FlashAttention-2 call on a block (the single-device ``flash2``
schedule, walked as it is), writing a partial output O_s and its logsumexp L_s; the partial
outputs are merged by logsumexp into fp32 accumulators (O, L):
L' = log(e^L + e^{L_s}), O' = e^{L − L'} O + e^{L_s − L'} O_s.

* Full attention: the sequence in P contiguous shards of n = N/P rows; every step is an n x n
  block.
* Causal: zig-zag (load-balanced) sharding.  The sequence is cut into 2P chunks of c = N/2P
  rows and device r holds chunks r and 2P − 1 − r (2c = n rows, in that order).  Step 0 is the
  device's own shard, causal n x n; a step whose K, V come from a device src < r is all n query
  rows against the first chunk of K, V (n x c, no mask: "lower"); from src > r, the second
  query chunk against all of K, V (c x n, no mask: "upper").  Every step but the first computes
  2c² scores on every device.

The backward keeps Q, O, dO, L and a dQ accumulator (fp32) at home; K, V travel as in the
forward, and with them the dK, dV accumulators (fp32) of the shard they belong to: at step s the
device adds its block's dK_s, dV_s to the accumulator that arrived from r − 1 (step 0 starts its
own), and sends it on while step s + 1 computes; after the last step the accumulators go home (P
sends of dK, dV in all; the last one is not overlapped).  Each step is one flash2 backward call
(its D = rowsum(dO∘O) pre-pass included, as the real run calls it) with the final O and L.

**Ulysses** (``parallel="ulysses"``).  Each device holds N/P rows of every head; an all-to-all
turns sequence shards into head shards (H/P query heads, Hkv/P kv heads, all N rows), each device
runs single-device flash2 on its heads, and an all-to-all turns O back into sequence shards (L
stays in the head layout for the backward).  Backward: dO in, flash2 backward, dQ, dK, dV out.
Nothing overlaps the all-to-alls (the attention needs all of its input).

What is counted, per device (elements, bytes and sectors per tensor, from the walker; the same
elements from a closed form):

* each step's flash2 kernel (its own tensors: Q, K, V, ... and the partial outputs written as
  ``Os``, ``Ls`` (forward) or ``dQs``, ``dKs``, ``dVs`` (backward));
* the merge and the accumulations, each one fused elementwise kernel: at step s >= 1 it reads
  the accumulator rows and the partial ones and writes the accumulator (``Oacc``, ``Lacc``,
  ``dQacc``, ``dKacc``, ``dVacc``, fp32).  At step 0 the partial output becomes the accumulator:
  nothing moves in fp32, one cast (read the partial, write fp32) otherwise; at the end, for
  fp16/bf16, one cast of each accumulator to the input precision (``O``, ``dQ``, ``dK``, ``dV``);
* the transfers: the sender reads what it sends from HBM and the receiver writes it
  (``K@link``, ``V@link``, ``dK@link``, ``dV@link``; Ulysses: ``Q@link`` ... ``dV@link``, the
  whole buffer read and written, the device's own 1/P copied in place).

Interconnect: ``link_bytes`` of a step is what the busiest directed link carries during it.  On
a switch (the presets: NVSwitch), a device's sends share its per-direction bandwidth
(``Hardware.link_bytes_per_s``): ring attention's step moves its K, V (and dK, dV) shard, an
all-to-all (P − 1)/P of the buffer.  On a ring topology (each device linked to its two
neighbours) ring attention is the same and an all-to-all's chunks take the shorter way round
(ties split evenly): the busiest link carries Σ_k min(k, P − k)/2 chunks of 1/P of the buffer.

The roofline per step: ``compute_s`` (the step's flash2 FLOPs at the preset's peak, as
:mod:`flashsim.roofline`; the elementwise merges' FLOPs are not counted), ``memory_s`` (the
step's HBM bytes, merges and transfers included, at the HBM bandwidth) and ``link_s``
(``link_bytes`` at the link bandwidth).  With the transfer overlapped, the step takes
``time_s = max(compute_s, memory_s, link_s)``; the verdict is "hidden" when
``link_s <= max(compute_s, memory_s)`` and "exposed" otherwise.  Steps run in lockstep (each
waits for its neighbour's shard), so the run takes Σ over steps of the slowest device's step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .api import build_schedule, closed_form_elements, resolve_tiling
from .config import STAT_BYTES, Hardware, Tiling, Workload, as_size, get_gpu
from .flops import flops as count_flops
from .roofline import roofline_from_counts
from .traffic import ZERO, IOCount, Launch, Schedule, TensorLayout, Traffic, read, walk, write

PARALLEL = ("ring", "ulysses")
PASSES = ("fwd", "bwd", "fwd+bwd")
#: bytes of the fp32 accumulators
ACC_BYTES = 4

#: What each tensor of a context-parallel breakdown is (beside flash2's own).
TENSORS = {
    "Os": "a step's partial output (its block of keys), input precision",
    "Ls": "a step's partial logsumexp, fp32",
    "Oacc": "the merged output, fp32 accumulator", "Lacc": "the merged logsumexp, fp32",
    "dQs": "a step's dQ", "dKs": "a step's dK", "dVs": "a step's dV",
    "dQacc": "dQ accumulator, fp32", "dKacc": "dK accumulator (travels with K, V), fp32",
    "dVacc": "dV accumulator (travels with K, V), fp32",
    "Q@link": "Q sent (read) / received (written)", "K@link": "K sent (read) / received (written)",
    "V@link": "V sent (read) / received (written)", "O@link": "O sent / received",
    "dO@link": "dO sent / received", "dQ@link": "dQ sent / received",
    "dK@link": "dK sent / received", "dV@link": "dV sent / received",
}


@dataclass(frozen=True)
class Step:
    """One step of one device: its kernel (if any), its merges, its transfers and its roofline."""

    device: int
    pass_: str
    index: int
    #: ring: "full", "diag" (zig-zag step 0), "lower", "upper", "final" (the last dK, dV sends
    #: and the casts); ulysses: "a2a_in", "attn", "a2a_out"
    kind: str
    q_rows: int  # query rows of the step's attention (0: no attention)
    k_rows: int
    io: IOCount  # the walker's count of everything the step moves in HBM
    closed_form: dict  # (tensor, direction) -> elements, from formulas
    sent_bytes: int  # bytes the device sends during the step
    link_bytes: int  # bytes on the busiest directed link during the step
    matmul_flops: int
    nonmatmul_flops: int
    compute_s: float
    memory_s: float
    link_s: float

    @property
    def time_s(self) -> float:
        return max(self.compute_s, self.memory_s, self.link_s)

    @property
    def hidden(self) -> bool:
        """The transfer hides under the step's compute (or its HBM traffic)."""
        return self.link_s <= max(self.compute_s, self.memory_s)

    @property
    def verdict(self) -> str:
        return "hidden" if self.hidden else "exposed"

    def to_dict(self) -> dict:
        return {"device": self.device, "pass": self.pass_, "step": self.index, "kind": self.kind,
                "q_rows": self.q_rows, "k_rows": self.k_rows, "hbm_bytes": self.io.bytes,
                "sent_bytes": self.sent_bytes, "link_bytes": self.link_bytes, "matmul_flops": self.matmul_flops,
                "nonmatmul_flops": self.nonmatmul_flops, "compute_s": self.compute_s, "memory_s": self.memory_s,
                "link_s": self.link_s, "time_s": self.time_s, "verdict": self.verdict}


@dataclass(frozen=True)
class CPResult:
    """A context-parallel simulation: every device's steps, their totals, and the run's time."""

    parallel: str
    devices: int
    pass_: str
    workload: Workload
    tiling: Tiling
    gpu: str
    topology: str
    link_bytes_per_s: float | None
    steps: tuple[Step, ...]
    per_device: tuple[IOCount, ...] = field(repr=False)  # walker totals, device by device
    per_device_closed: tuple[IOCount, ...] = field(repr=False)

    @property
    def agrees(self) -> bool:
        """Walker == closed form for every device, tensor and direction."""
        return all(a.elements_by_key() == b.elements_by_key() for a, b in zip(self.per_device, self.per_device_closed))

    def device_steps(self, device: int) -> list[Step]:
        """The steps device ``device`` (0 .. devices - 1) runs, in order."""
        if isinstance(device, (bool, np.bool_)) or not isinstance(device, (int, np.integer)) \
                or not 0 <= device < self.devices:
            raise ValueError(f"device={device!r}: must be an integer in 0..{self.devices - 1}")
        return [s for s in self.steps if s.device == device]

    @property
    def sent_bytes(self) -> tuple[int, ...]:
        """Bytes each device sends over the whole run."""
        return tuple(sum(s.sent_bytes for s in self.device_steps(r)) for r in range(self.devices))

    def _lockstep(self, key) -> float:
        slots: dict[tuple[str, int, str], float] = {}
        for s in self.steps:
            k = (s.pass_, s.index, s.kind if self.parallel == "ulysses" else "")
            slots[k] = max(slots.get(k, 0.0), key(s))
        return sum(slots.values())

    @property
    def time_s(self) -> float:
        """Σ over steps of the slowest device's step time, transfers overlapped with compute."""
        return self._lockstep(lambda s: s.time_s)

    @property
    def serial_time_s(self) -> float:
        """The same with every transfer after its step's compute (no overlap)."""
        return self._lockstep(lambda s: max(s.compute_s, s.memory_s) + s.link_s)

    @property
    def exposed_steps(self) -> int:
        return sum(not s.hidden for s in self.steps)

    def to_dict(self) -> dict:
        w = self.workload
        return {
            "parallel": self.parallel, "devices": self.devices, "pass": self.pass_, "gpu": self.gpu,
            "topology": self.topology, "link_bytes_per_s": self.link_bytes_per_s,
            "workload": {"batch": w.batch, "heads": w.heads, "kv_heads": w.hkv, "seq_len": w.nq, "head_dim": w.d,
                         "dtype": w.dtype, "causal": w.causal},
            "block_m": self.tiling.block_m, "block_n": self.tiling.block_n,
            "closed_form_agrees": self.agrees,
            "per_device": [io.to_dict() for io in self.per_device],
            "sent_bytes": list(self.sent_bytes),
            "steps": [s.to_dict() for s in self.steps],
            "time_s": self.time_s, "serial_time_s": self.serial_time_s, "exposed_steps": self.exposed_steps,
        }


# --------------------------------------------------------------------------------------------
# Checks


def check_parallel(w: Workload, devices: int, parallel: str) -> int:
    """``devices`` as an int, or a ValueError naming the field the split cannot be made on."""
    if not isinstance(parallel, str) or parallel not in PARALLEL:
        raise ValueError(f"parallel={parallel!r}: must be one of {list(PARALLEL)}")
    if isinstance(devices, int) and not isinstance(devices, bool) and devices < 1:
        raise ValueError(f"devices={devices}: must be at least 1")
    p = as_size("devices", devices)
    if not isinstance(w, Workload):
        raise ValueError(f"workload={type(w).__name__}: must be a flashsim.Workload")
    if w.nk != w.nq:
        raise ValueError(f"seq_len_k={w.nk}: context parallelism here is self-attention, seq_len_k must equal "
                         f"seq_len_q={w.nq}")
    if w.block_mask is not None:
        raise ValueError("block_mask: context-parallel schedules take no block mask")
    if parallel == "ring" and w.causal:
        if w.nq % (2 * p):
            raise ValueError(f"seq_len_q={w.nq}: causal ring attention cuts the sequence into 2*devices = {2 * p} "
                             f"zig-zag chunks; it must be a multiple of {2 * p}")
    elif w.nq % p:
        raise ValueError(f"seq_len_q={w.nq}: must be a multiple of devices={p} (one shard per device)")
    if parallel == "ulysses":
        if w.heads % p:
            raise ValueError(f"heads={w.heads}: Ulysses gives each device heads/devices heads; must be a multiple "
                             f"of devices={p}")
        if w.hkv % p:
            raise ValueError(f"kv_heads={w.hkv}: Ulysses shards the kv heads too; must be a multiple of devices={p}")
    return p


# --------------------------------------------------------------------------------------------
# Pieces: elementwise kernels and transfers as schedules the walker counts


def _layout(name: str, rows: int, cols: int, elem_bytes: int, slices: int) -> TensorLayout:
    return TensorLayout(name, rows, cols, elem_bytes, slices)


def _ew(name: str, layouts: dict[str, TensorLayout], ops: list[tuple[str, bool, int, int]]) -> Schedule:
    """One elementwise launch per group of tensors with the same slice count: ``ops`` are
    (tensor, write, first row, rows) of every slice; one program per slice."""
    groups: dict[int, list] = {}
    for op in ops:
        groups.setdefault(layouts[op[0]].slices, []).append(op)
    launches = []
    for slices, group in groups.items():
        idx = np.arange(slices, dtype=np.int64)

        def accesses(group=group):
            return [(write if wr else read)(t, r0, nr) for t, wr, r0, nr in group]

        launches.append(Launch(name, slices, {t: idx for t, *_ in group}, accesses))
    return Schedule(name, dict(layouts), launches)


def _ew_closed(layouts: dict[str, TensorLayout], ops) -> dict:
    out: dict = {}
    for t, wr, _r0, nr in ops:
        lay = layouts[t]
        key = (t, "write" if wr else "read")
        out[key] = out.get(key, 0) + nr * lay.cols * lay.slices
    return out


def _rename(io: IOCount, names: dict[str, str]) -> IOCount:
    bd: dict = {}
    for (t, dr), tr in io.breakdown.items():
        k = (names.get(t, t), dr)
        bd[k] = bd.get(k, ZERO) + tr
    return IOCount(bd)


def _rename_el(el: dict, names: dict[str, str]) -> dict:
    out: dict = {}
    for (t, dr), n in el.items():
        k = (names.get(t, t), dr)
        out[k] = out.get(k, 0) + n
    return out


def _add(a: IOCount, b: IOCount) -> IOCount:
    bd = dict(a.breakdown)
    for k, t in b.breakdown.items():
        bd[k] = bd.get(k, ZERO) + t
    return IOCount(bd)


def _add_el(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, n in b.items():
        out[k] = out.get(k, 0) + n
    return out


def _a2a_link_bytes(nbytes: int, p: int, topology: str) -> int:
    """Bytes on the busiest directed link of an all-to-all of a ``nbytes`` buffer per device."""
    if p == 1:
        return 0
    chunk = nbytes // p
    if topology == "switch":
        return (p - 1) * chunk
    hops = sum(min(k, p - k) for k in range(1, p))  # per source, both directions together
    return hops * chunk // 2


# --------------------------------------------------------------------------------------------
# The simulation


class _Sim:
    def __init__(self, w: Workload, p: int, parallel: str, tiling: Tiling, gpu: Hardware, topology: str):
        self.w, self.p, self.parallel, self.t, self.gpu, self.topology = w, p, parallel, tiling, gpu, topology
        self.cache: dict = {}
        self.n = w.nq // p
        self.c = self.n // 2
        eb = w.elem_bytes
        bh, bk = w.bh, w.batch * w.hkv
        n, d = self.n, w.d
        self.lay = {
            "Os": _layout("Os", n, d, eb, bh), "Ls": _layout("Ls", n, 1, STAT_BYTES, bh),
            "Oacc": _layout("Oacc", n, d, ACC_BYTES, bh), "Lacc": _layout("Lacc", n, 1, ACC_BYTES, bh),
            "O": _layout("O", n, d, eb, bh), "dQs": _layout("dQs", n, d, eb, bh),
            "dQacc": _layout("dQacc", n, d, ACC_BYTES, bh),
            "dQ": _layout("dQ", n, d, eb, bh),
            "dKs": _layout("dKs", n, d, eb, bk), "dVs": _layout("dVs", n, d, eb, bk),
            "dKacc": _layout("dKacc", n, d, ACC_BYTES, bk), "dVacc": _layout("dVacc", n, d, ACC_BYTES, bk),
            "dK": _layout("dK", n, d, eb, bk), "dV": _layout("dV", n, d, eb, bk),
            "K@link": _layout("K@link", n, d, eb, bk), "V@link": _layout("V@link", n, d, eb, bk),
            "dK@link": _layout("dK@link", n, d, ACC_BYTES, bk), "dV@link": _layout("dV@link", n, d, ACC_BYTES, bk),
        }
        if parallel == "ulysses":
            for name in ("Q", "O", "dO", "dQ"):
                self.lay[f"{name}@link"] = _layout(f"{name}@link", n, d, eb, bh)
            for name in ("K", "V", "dK", "dV"):
                self.lay[f"{name}@link"] = _layout(f"{name}@link", n, d, eb, bk)

    # the single-device kernel of a step, walked and in closed form (cached by shape)
    def kernel(self, pass_: str, q_rows: int, k_rows: int, causal: bool, heads_div: int = 1):
        key = (pass_, q_rows, k_rows, causal, heads_div)
        if key not in self.cache:
            w = self.w
            ws = Workload(batch=w.batch, heads=w.heads // heads_div, kv_heads=w.hkv // heads_div, seq_len_q=q_rows,
                          seq_len_k=k_rows, head_dim=w.d, dtype=w.dtype, causal=causal)
            io = walk(build_schedule(ws, "flash2", pass_, tiling=self.t))
            el = closed_form_elements(ws, "flash2", pass_, tiling=self.t)
            f = count_flops(ws, pass_, "flash2", tiling=self.t)
            self.cache[key] = (io, el, f)
        return self.cache[key]

    def ew(self, name: str, ops) -> tuple[IOCount, dict]:
        ops = [op for op in ops if op[3] > 0]
        if not ops:
            return IOCount({}), {}
        return walk(_ew(name, self.lay, ops)), _ew_closed(self.lay, ops)

    def step(self, r: int, pass_: str, index: int, kind: str, q_rows: int, k_rows: int, kern, ew_parts,
             sent: int, link: int) -> Step:
        io, el = IOCount({}), {}
        mm = nm = 0
        if kern is not None:
            kio, kel, f = kern
            io, el, mm, nm = _add(io, kio), _add_el(el, kel), f["matmul"], f["nonmatmul"]
        for pio, pel in ew_parts:
            io, el = _add(io, pio), _add_el(el, pel)
        rf = roofline_from_counts(mm, nm, io.bytes or 0, self.gpu, self.w.dtype)
        bw = self.gpu.link_bytes_per_s
        link_s = 0.0 if link == 0 else (float("inf") if bw is None else link / bw)
        return Step(r, pass_, index, kind, q_rows, k_rows, io, el, sent, link, mm, nm,
                    rf["compute_s"] if kern is not None else 0.0, rf["memory_s"], link_s)

    # ---------------------------------------------------------------- ring
    def ring_blocks(self, r: int, s: int) -> tuple[str, int, int, int, bool]:
        """(kind, first query row, query rows, key rows, causal) of device r's step s."""
        n, c = self.n, self.c
        if not self.w.causal:
            return "full", 0, n, n, False
        if s == 0:
            return "diag", 0, n, n, True
        src = (r - s) % self.p
        return ("lower", 0, n, c, False) if src < r else ("upper", c, c, n, False)

    def kv_bytes(self, elem_bytes: int) -> int:
        return 2 * self.w.batch * self.w.hkv * self.n * self.w.d * elem_bytes

    def ring(self, r: int, pass_: str) -> list[Step]:
        p, n, w = self.p, self.n, self.w
        lowp = w.dtype != "fp32"
        steps = []
        kv = self.kv_bytes(w.elem_bytes)
        dkv = self.kv_bytes(ACC_BYTES)
        send_kv = [("K@link", False, 0, n), ("V@link", False, 0, n), ("K@link", True, 0, n), ("V@link", True, 0, n)]
        send_dkv = [(t, wr, 0, n) for t in ("dK@link", "dV@link") for wr in (False, True)]
        for s in range(p):
            kind, q0, qn, kn, causal = self.ring_blocks(r, s)
            more = s < p - 1
            if pass_ == "fwd":
                kern = self.kernel("fwd", qn, kn, causal)
                kern = (_rename(kern[0], {"O": "Os", "L": "Ls"}), _rename_el(kern[1], {"O": "Os", "L": "Ls"}), kern[2])
                if s == 0:
                    merge = [("Os", False, q0, qn), ("Oacc", True, q0, qn)] if lowp else []
                else:
                    merge = [(t, False, q0, qn) for t in ("Oacc", "Lacc", "Os", "Ls")] + \
                            [("Oacc", True, q0, qn), ("Lacc", True, q0, qn)]
                if s == p - 1 and lowp:
                    merge += [("Oacc", False, 0, n), ("O", True, 0, n)]
                parts = [self.ew("ring_merge", merge), self.ew("ring_send_kv", send_kv if more else [])]
                sent = kv if more else 0
                steps.append(self.step(r, pass_, s, kind, qn, kn, kern, parts, sent, sent))
            else:
                names = {"dQ": "dQs", "dK": "dKs", "dV": "dVs"}
                kern = self.kernel("bwd", qn, kn, causal)
                kern = (_rename(kern[0], names), _rename_el(kern[1], names), kern[2])
                # the K, V rows this step's block touched: lower steps only the first chunk
                k0 = 0
                if s == 0:
                    acc = ([("dQs", False, q0, qn), ("dQacc", True, q0, qn), ("dKs", False, k0, kn),
                            ("dKacc", True, k0, kn), ("dVs", False, k0, kn), ("dVacc", True, k0, kn)] if lowp else [])
                else:
                    acc = []
                    for a, b, r0, rn in (("dQacc", "dQs", q0, qn), ("dKacc", "dKs", k0, kn), ("dVacc", "dVs", k0, kn)):
                        acc += [(a, False, r0, rn), (b, False, r0, rn), (a, True, r0, rn)]
                sends = (send_kv if more else []) + (send_dkv if s >= 1 else [])
                sent = (kv if more else 0) + (dkv if s >= 1 else 0)
                parts = [self.ew("ring_accumulate", acc), self.ew("ring_send", sends)]
                steps.append(self.step(r, pass_, s, kind, qn, kn, kern, parts, sent, sent))
        if pass_ == "bwd" and (p > 1 or lowp):
            # the accumulators go home (not overlapped), then the casts to the input precision
            final = send_dkv if p > 1 else []
            cast = [(a, False, 0, n) for a in ("dQacc", "dKacc", "dVacc")] + \
                   [(b, True, 0, n) for b in ("dQ", "dK", "dV")] if lowp else []
            sent = dkv if p > 1 else 0
            steps.append(self.step(r, pass_, p, "final", 0, 0, None,
                                   [self.ew("ring_send", final), self.ew("ring_cast", cast)], sent, sent))
        return steps

    def ring_closed(self, r: int, pass_: str) -> dict:
        """The closed form of device r's pass: the step kinds counted, not walked (r lower steps,
        P − 1 − r upper ones with zig-zag), each step's flash2 closed form, and the merges'
        and transfers' rows by formula."""
        p, n, c, w = self.p, self.n, self.c, self.w
        bh, bk, d = w.bh, w.batch * w.hkv, w.d
        lowp = w.dtype != "fp32"
        fwd = pass_ == "fwd"
        names = {"O": "Os", "L": "Ls"} if fwd else {"dQ": "dQs", "dK": "dKs", "dV": "dVs"}
        if w.causal:
            kinds = {("diag", n, n, True): 1, ("lower", n, c, False): r, ("upper", c, n, False): p - 1 - r}
        else:
            kinds = {("full", n, n, False): p}
        el: dict = {}
        for (_, qn, kn, causal), count in kinds.items():
            if count:
                kel = closed_form_elements(Workload(batch=w.batch, heads=w.heads, kv_heads=w.hkv, seq_len_q=qn,
                                                    seq_len_k=kn, head_dim=d, dtype=w.dtype, causal=causal),
                                           "flash2", pass_, tiling=self.t)
                el = _add_el(el, {k: count * v for k, v in _rename_el(kel, names).items()})
        # query rows of steps 1..P-1 (merged into the accumulators): lower steps n, upper steps c
        q_later = (r * n + (p - 1 - r) * c) if w.causal else (p - 1) * n
        k_later = (r * c + (p - 1 - r) * n) if w.causal else (p - 1) * n
        extra: dict = {}

        def add(t, dr, elems):
            if elems:
                extra[(t, dr)] = extra.get((t, dr), 0) + elems

        if fwd:
            for t in ("Oacc", "Os"):
                add(t, "read", q_later * d * bh)
            for t in ("Lacc", "Ls"):
                add(t, "read", q_later * bh)
            add("Oacc", "write", q_later * d * bh)
            add("Lacc", "write", q_later * bh)
            if lowp:  # step 0's cast, the final cast
                add("Os", "read", n * d * bh)
                add("Oacc", "write", n * d * bh)
                add("Oacc", "read", n * d * bh)
                add("O", "write", n * d * bh)
            for t in ("K@link", "V@link"):
                for dr in ("read", "write"):
                    add(t, dr, (p - 1) * n * d * bk)
        else:
            for a, b, rows, sl in (("dQacc", "dQs", q_later, bh), ("dKacc", "dKs", k_later, bk),
                                   ("dVacc", "dVs", k_later, bk)):
                add(a, "read", rows * d * sl)
                add(b, "read", rows * d * sl)
                add(a, "write", rows * d * sl)
                if lowp:
                    add(b, "read", n * d * sl)  # step 0's cast
                    add(a, "write", n * d * sl)
                    add(a, "read", n * d * sl)  # the final cast
                    add(a[:-3], "write", n * d * sl)
            for t in ("K@link", "V@link"):
                for dr in ("read", "write"):
                    add(t, dr, (p - 1) * n * d * bk)
            for t in ("dK@link", "dV@link"):
                for dr in ("read", "write"):
                    add(t, dr, (p if p > 1 else 0) * n * d * bk)
        return _add_el(el, extra)

    # ---------------------------------------------------------------- ulysses
    def ulysses(self, r: int, pass_: str) -> list[Step]:
        p, n, w = self.p, self.n, self.w
        moved_in = ("Q", "K", "V") if pass_ == "fwd" else ("dO",)
        moved_out = ("O",) if pass_ == "fwd" else ("dQ", "dK", "dV")
        steps = []
        for index, (kind, names) in enumerate((("a2a_in", moved_in), ("attn", ()), ("a2a_out", moved_out))):
            if kind == "attn":
                kern = self.kernel(pass_, w.nq, w.nq, w.causal, heads_div=p)
                steps.append(self.step(r, pass_, index, kind, w.nq, w.nq, kern, [], 0, 0))
                continue
            ops = [(f"{t}@link", wr, 0, n) for t in names for wr in (False, True)] if p > 1 else []
            nbytes = sum(self.lay[f"{t}@link"].slices * self.lay[f"{t}@link"].slice_bytes for t in names)
            sent = nbytes // p * (p - 1)
            steps.append(self.step(r, pass_, index, kind, 0, 0, None, [self.ew(f"ulysses_{kind}", ops)], sent,
                                   _a2a_link_bytes(nbytes, p, self.topology)))
        return steps

    def ulysses_closed(self, r: int, pass_: str) -> dict:
        w, p, n = self.w, self.p, self.n
        ws = Workload(batch=w.batch, heads=w.heads // p, kv_heads=w.hkv // p, seq_len_q=w.nq, head_dim=w.d,
                      dtype=w.dtype, causal=w.causal)
        el = dict(closed_form_elements(ws, "flash2", pass_, tiling=self.t))
        names = ("Q", "K", "V", "O") if pass_ == "fwd" else ("dO", "dQ", "dK", "dV")
        for t in names if p > 1 else ():
            lay = self.lay[f"{t}@link"]
            for dr in ("read", "write"):
                el[(f"{t}@link", dr)] = n * lay.cols * lay.slices
        return el


def context_parallel(workload: Workload, devices: int, parallel: str = "ring", pass_: str = "fwd",
                     gpu: str | Hardware = "h100", tiling: Tiling | None = None, sram_elems: int | None = None,
                     topology: str | None = None) -> CPResult:
    """Simulate ``workload`` (the whole problem: B, H, N, d) split over ``devices`` GPUs.

    ``parallel``: "ring" or "ulysses"; ``pass_``: "fwd", "bwd" or "fwd+bwd".  Each step's flash2
    kernel runs with ``tiling`` (Br x Bc), else the paper's rule from ``sram_elems`` (M in
    elements), else from the preset's shared memory per thread block.  ``topology`` overrides
    the preset's ("switch" or "ring").  ValueError, naming the field, for a split that cannot be
    made: devices < 1, N not a multiple of P (of 2P for the causal ring's zig-zag chunks), heads
    or kv heads not multiples of P (Ulysses), Nk != Nq, a block mask.
    """
    if not isinstance(pass_, str) or pass_ not in PASSES:
        raise ValueError(f"pass_={pass_!r}: must be one of {list(PASSES)}")
    p = check_parallel(workload, devices, parallel)
    g = gpu if isinstance(gpu, Hardware) else get_gpu(gpu)
    topo = g.link_topology if topology is None else topology
    if topo not in ("switch", "ring"):
        raise ValueError(f"topology={topo!r}: must be 'switch' or 'ring'")
    if tiling is None and sram_elems is None:
        sram_elems = g.sram_elems(workload.elem_bytes)
    t = resolve_tiling(workload, "flash2", tiling, sram_elems)
    sim = _Sim(workload, p, parallel, t, g, topo)
    steps: list[Step] = []
    walked, closed = [], []
    for r in range(p):
        io_r, el_r = IOCount({}), {}
        for ps in pass_.split("+"):
            st = sim.ring(r, ps) if parallel == "ring" else sim.ulysses(r, ps)
            steps += st
            for s in st:
                io_r = _add(io_r, s.io)
            el_r = _add_el(el_r, sim.ring_closed(r, ps) if parallel == "ring" else sim.ulysses_closed(r, ps))
        walked.append(io_r)
        closed.append(_from_elements(el_r, io_r, sim.lay))
    return CPResult(parallel, p, pass_, workload, t, g.name, topo, g.link_bytes_per_s, tuple(steps), tuple(walked),
                    tuple(closed))


def _from_elements(el: dict, walked: IOCount, layouts: dict[str, TensorLayout]) -> IOCount:
    """An IOCount of closed-form elements, with bytes from each tensor's element size (the walked
    count's for flash2's own tensors, which this module does not lay out)."""
    bd = {}
    for key, n in el.items():
        if not n:
            continue
        t = key[0]
        if t in layouts:
            eb = layouts[t].elem_bytes
        elif key in walked.breakdown and walked.breakdown[key].elements:
            tr = walked.breakdown[key]
            eb = tr.bytes // tr.elements
        else:
            eb = 0
        bd[key] = Traffic(int(n), int(n) * eb, None)
    return IOCount(bd)


__all__ = ["PARALLEL", "TENSORS", "CPResult", "Step", "check_parallel", "context_parallel", "format_text"]


def format_text(r: CPResult) -> str:
    """What ``flashsim simulate --devices P --parallel ...`` prints: the per-device HBM traffic,
    the bytes each device sends, and device 0's steps with their roofline verdicts."""
    from .report import format_table

    w = r.workload
    lines = [f"{r.parallel} attention on {r.devices} devices, {r.pass_}: batch {w.batch}, heads {w.heads} "
             f"(kv {w.hkv}), N {w.nq} ({w.nq // r.devices} rows per device), d {w.d}, {w.dtype}"
             f"{', causal (zig-zag shards)' if w.causal and r.parallel == 'ring' else ', causal' if w.causal else ''}",
             f"GPU {r.gpu}; each step's flash2 with {r.tiling.block_m} x {r.tiling.block_n} tiles; interconnect "
             + ("none" if r.link_bytes_per_s is None else f"{r.link_bytes_per_s / 1e9:,.0f} GB/s per direction, "
                f"{r.topology}"), ""]
    rows = []
    for (t, dr), tr in sorted(r.per_device[0].breakdown.items()):
        rows.append([t, dr, tr.elements, f"{tr.bytes / 1e6:,.3f}", tr.sectors])
    lines.append("device 0, HBM traffic per tensor:")
    lines.append(format_table(["tensor", "dir", "elements", "MB", "sectors"], rows,
                              right=[False, False, True, True, True]))
    told = [t for t in sorted({k[0] for k in r.per_device[0].breakdown}) if t in TENSORS]
    if told:
        lines.append("tensors: " + "; ".join(f"{t} = {TENSORS[t]}" for t in told))
    lines.append("")
    lines.append(format_table(
        ["device", "HBM read MB", "HBM write MB", "HBM total MB", "sent MB"],
        [[d, f"{io.read_bytes / 1e6:,.3f}", f"{io.write_bytes / 1e6:,.3f}", f"{io.bytes / 1e6:,.3f}",
          f"{sent / 1e6:,.3f}"] for d, (io, sent) in enumerate(zip(r.per_device, r.sent_bytes))],
        right=[True] * 5))
    lines.append("")
    lines.append("device 0, step by step (overlapped: time = max(compute, HBM, link)):")
    lines.append(format_table(
        ["pass", "step", "kind", "block", "HBM MB", "link MB", "compute us", "HBM us", "link us", "transfer"],
        [[s.pass_, s.index, s.kind, f"{s.q_rows} x {s.k_rows}" if s.q_rows else "", f"{s.io.bytes / 1e6:,.3f}",
          f"{s.link_bytes / 1e6:,.3f}", f"{s.compute_s * 1e6:,.2f}", f"{s.memory_s * 1e6:,.2f}",
          f"{s.link_s * 1e6:,.2f}", s.verdict if s.link_bytes else ""] for s in r.device_steps(0)],
        right=[False, True, False, True, True, True, True, True, True, False]))
    lines.append("")
    moving = [s for s in r.steps if s.link_bytes]
    lines.append(f"closed form agrees with the walker: {'yes' if r.agrees else 'NO'}")
    lines.append(f"transfers hidden under compute: {sum(s.hidden for s in moving)} of {len(moving)} "
                 f"(all devices); time {r.time_s * 1e3:.4g} ms overlapped, {r.serial_time_s * 1e3:.4g} ms serial")
    return "\n".join(lines)
