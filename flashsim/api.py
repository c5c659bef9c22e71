"""The simulator's front door: :func:`simulate` one algorithm on one workload."""

from __future__ import annotations

from dataclasses import dataclass

from .algorithms import get_algorithm
from .config import Tiling, Workload
from .traffic import IOCount, Schedule, Traffic, from_elements, walk

PASSES = ("fwd", "bwd", "fwd+bwd")


@dataclass(frozen=True)
class SimResult:
    algorithm: str
    pass_: str
    workload: Workload
    tiling: Tiling | None
    io: IOCount  # from the walker: elements, bytes and sectors, per tensor and per launch
    closed_form: IOCount  # from the formulas: elements and bytes per tensor
    options: dict

    @property
    def agrees(self) -> bool:
        """Walker and closed form give the same element count for every (tensor, direction)."""
        return self.io.elements_by_key() == self.closed_form.elements_by_key()


def resolve_tiling(workload: Workload, algo: str, tiling: Tiling | None = None,
                   sram_elems: int | None = None) -> Tiling | None:
    """The tiling an algorithm runs with: given explicitly, or from M by the paper's rule."""
    mod = get_algorithm(algo)
    if not mod.NEEDS_TILING:
        return None
    if tiling is not None and sram_elems is not None:
        raise ValueError("tiling and sram_elems: give one of them, not both")
    if tiling is not None:
        return tiling
    if sram_elems is None:
        raise ValueError(f"sram_elems=None: algorithm {algo!r} needs an SRAM size M or explicit block sizes")
    return Tiling.from_sram(sram_elems, workload.head_dim)


def _passes(pass_: str) -> tuple[str, ...]:
    if pass_ not in PASSES:
        raise ValueError(f"pass_={pass_!r}: must be one of {list(PASSES)}")
    return tuple(pass_.split("+"))


def build_schedule(workload: Workload, algo: str, pass_: str = "fwd", tiling: Tiling | None = None,
                   sram_elems: int | None = None, **options) -> Schedule:
    mod = get_algorithm(algo)
    tl = resolve_tiling(workload, algo, tiling, sram_elems)
    scheds = []
    for p in _passes(pass_):
        if p not in mod.PASSES:
            raise ValueError(f"pass_={p!r}: algorithm {algo!r} models only {list(mod.PASSES)}")
        scheds.append(mod.schedule(workload, tl, p, **options))
    if len(scheds) == 1:
        return scheds[0]
    tensors = {}
    for s in scheds:
        tensors.update(s.tensors)
    return Schedule(scheds[0].algorithm, tensors, [ln for s in scheds for ln in s.launches],
                    {"passes": [s.meta for s in scheds]})


def closed_form_elements(workload: Workload, algo: str, pass_: str = "fwd", tiling: Tiling | None = None,
                         sram_elems: int | None = None, **options) -> dict[tuple[str, str], int]:
    mod = get_algorithm(algo)
    tl = resolve_tiling(workload, algo, tiling, sram_elems)
    out: dict[tuple[str, str], int] = {}
    for p in _passes(pass_):
        if p not in mod.PASSES:
            raise ValueError(f"pass_={p!r}: algorithm {algo!r} models only {list(mod.PASSES)}")
        for k, v in mod.closed_form(workload, tl, p, **options).items():
            out[k] = out.get(k, 0) + int(v)
    return out


def simulate(workload: Workload, algo: str, pass_: str = "fwd", tiling: Tiling | None = None,
             sram_elems: int | None = None, **options) -> SimResult:
    """Walk the schedule and evaluate the closed form; both are returned."""
    tl = resolve_tiling(workload, algo, tiling, sram_elems)
    sched = build_schedule(workload, algo, pass_, tl, **options)
    io = walk(sched)
    cf_el = closed_form_elements(workload, algo, pass_, tl, **options)
    cf = from_elements(cf_el, sched.tensors)
    return SimResult(algo, pass_, workload, tl, io, cf, dict(options))


__all__ = ["SimResult", "simulate", "build_schedule", "closed_form_elements", "resolve_tiling",
           "IOCount", "Traffic", "PASSES"]
