"""The simulator's front door: :func:`simulate` one algorithm on one workload."""

from __future__ import annotations

from dataclasses import dataclass

from .algorithms import get_algorithm
from .config import Tiling, Workload, as_size
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


def takes_sram(algo: str) -> bool:
    """Whether ``algo`` sizes its own tiles from M (``smallcache``: s x s tiles with 3s² + 2s <= M).

    Such an algorithm lists ``sram_elems`` among its ``OPTIONS``; :func:`simulate` hands it the
    M it was given, exactly, instead of turning M into FlashAttention's Br x Bc tiling (which
    would round M up to a multiple of 4d and refuse M < 4d).
    """
    return "sram_elems" in getattr(get_algorithm(algo), "OPTIONS", {})


def resolve_tiling(workload: Workload, algo: str, tiling: Tiling | None = None,
                   sram_elems: int | None = None) -> Tiling | None:
    """The tiling an algorithm runs with: given explicitly, or from M by the paper's rule.

    None for an algorithm that takes no block sizes (standard attention, the fast and torch
    schedules: a tiling given to one is a ValueError, never dropped), and for one that sizes its
    tiles from M itself (:func:`takes_sram`) when M rather than a tiling is given.  An M below
    what an algorithm without an M rule of its own can run at is refused
    (:func:`flashsim.bounds.check_sram`: standard attention needs M >= 2d).
    """
    mod = get_algorithm(algo)
    if not isinstance(workload, Workload):
        raise ValueError(f"workload={type(workload).__name__}: must be a flashsim.Workload")
    if tiling is not None and not isinstance(tiling, Tiling):
        raise ValueError(f"tiling={tiling!r}: must be a flashsim.Tiling, e.g. Tiling(block_m=64, block_n=64), or None")
    if sram_elems is not None:
        from .bounds import check_sram

        sram_elems = as_size("sram_elems", sram_elems)  # checked even where unused (standard)
        check_sram(workload, algo, sram_elems)
    if not mod.NEEDS_TILING:
        if tiling is not None:  # never dropped silently
            raise ValueError(f"tiling={tiling!r}: algorithm {algo!r} takes no Br x Bc tiling (its blocks are its "
                             "own: options such as gemm_block or config)")
        return None
    if tiling is not None and sram_elems is not None:
        raise ValueError("tiling and sram_elems: give one of them, not both")
    if tiling is not None:
        return tiling
    if sram_elems is None:
        raise ValueError(f"sram_elems=None: algorithm {algo!r} needs an SRAM size M or explicit block sizes")
    if takes_sram(algo):
        return None
    return Tiling.from_sram(sram_elems, workload.head_dim)


def _resolve(workload: Workload, algo: str, tiling: Tiling | None, sram_elems: int | None,
             options: dict) -> tuple[Tiling | None, dict]:
    """(tiling, options) the algorithm's ``schedule`` and ``closed_form`` are called with."""
    tl = resolve_tiling(workload, algo, tiling, sram_elems)
    if tl is None and sram_elems is not None and takes_sram(algo):  # with a tile too: it must fit M
        options = {**options, "sram_elems": as_size("sram_elems", sram_elems)}
    return tl, options


def _passes(pass_: str) -> tuple[str, ...]:
    if not isinstance(pass_, str) or pass_ not in PASSES:
        raise ValueError(f"pass_={pass_!r}: must be one of {list(PASSES)}")
    return tuple(pass_.split("+"))


def build_schedule(workload: Workload, algo: str, pass_: str = "fwd", tiling: Tiling | None = None,
                   sram_elems: int | None = None, **options) -> Schedule:
    mod = get_algorithm(algo)
    _passes(pass_)
    tl, options = _resolve(workload, algo, tiling, sram_elems, options)
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
    _passes(pass_)
    tl, options = _resolve(workload, algo, tiling, sram_elems, options)
    out: dict[tuple[str, str], int] = {}
    for p in _passes(pass_):
        if p not in mod.PASSES:
            raise ValueError(f"pass_={p!r}: algorithm {algo!r} models only {list(mod.PASSES)}")
        for k, v in mod.closed_form(workload, tl, p, **options).items():
            out[k] = out.get(k, 0) + int(v)
    return out


def simulate(workload: Workload, algo: str, pass_: str = "fwd", tiling: Tiling | None = None,
             sram_elems: int | None = None, **options) -> SimResult:
    """Walk the schedule and evaluate the closed form; both are returned.

    ``SimResult.options`` are the options the algorithm ran with (for ``smallcache`` given M, M
    itself as ``sram_elems``).
    """
    get_algorithm(algo)
    _passes(pass_)
    tl, run_options = _resolve(workload, algo, tiling, sram_elems, options)
    sched = build_schedule(workload, algo, pass_, tiling, sram_elems, **options)
    io = walk(sched)
    cf_el = closed_form_elements(workload, algo, pass_, tiling, sram_elems, **options)
    cf = from_elements(cf_el, sched.tensors)
    return SimResult(algo, pass_, workload, tl, io, cf, run_options)


__all__ = ["SimResult", "simulate", "build_schedule", "closed_form_elements", "resolve_tiling", "takes_sram",
           "IOCount", "Traffic", "PASSES"]
