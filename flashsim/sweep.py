"""Parameter sweeps over the simulator, tidy records, CSV files and log-log exponent fits.

A sweep varies one parameter of a *base* configuration (a dict of :class:`~flashsim.config.Workload`
fields plus ``sram_elems`` (M) and/or ``block_m``/``block_n``) and simulates each algorithm and
pass at each value.  Every result is one flat record (a dict of scalars), ready for CSV, pandas
or :mod:`flashsim.plot`:

* the workload: ``batch, heads, kv_heads, seq_len_q, seq_len_k, head_dim, dtype, causal,
  block_density`` (None without a block mask);
* the run: ``algo, pass, block_m, block_n, sram_elems`` (the block sizes as the algorithm
  module's ``blocks`` gives them: for ``smallcache`` both are its tile side s), ``param, value``;
* traffic: ``hbm_read_bytes, hbm_write_bytes, hbm_bytes, hbm_elements`` and, when walked,
  ``hbm_sectors`` and ``agrees`` (walker == closed form);
* arithmetic: ``flops, matmul_flops, nonmatmul_flops`` (:mod:`flashsim.flops`);
* bounds (forward-pass bounds of :mod:`flashsim.bounds`, in elements, and ``*_bytes`` = elements
  x element size): ``bound_standard, bound_flash, bound_lower, bound_saha_ye, regime`` — only
  when M is known (given, or from a GPU preset), else None;
* with a GPU: ``gpu, time_s, compute_s, memory_s, bound, arithmetic_intensity``
  (:mod:`flashsim.roofline`).

Parameter names: any workload field, ``sram_elems`` or ``M``, ``block_m``/``Br``,
``block_n``/``Bc``, ``N`` (sets ``seq_len_q`` and ``seq_len_k``), ``d`` (``head_dim``), ``B``,
``H``, and ``gpu`` (values are preset names; M becomes the preset's shared memory per thread
block in elements, and the roofline uses that GPU).
"""

from __future__ import annotations

import csv
import math
import sys
import warnings
from collections.abc import Callable, Iterable

import numpy as np

from .algorithms import ALL_ALGORITHMS, get_algorithm
from .api import PASSES, build_schedule, closed_form_elements, simulate
from .bounds import bounds as compute_bounds
from .config import Hardware, Tiling, Workload, as_size, get_gpu
from .flops import flops as count_flops
from .output import atomic_write
from .roofline import roofline_from_counts
from .traffic import from_elements

WORKLOAD_FIELDS = ("batch", "heads", "seq_len_q", "head_dim", "seq_len_k", "kv_heads", "dtype", "causal",
                   "block_mask")
#: The one table of parameter names -> record fields, for sweeps, fits, plots and the command line.
#: ``N`` is the sequence length: swept, it sets both ``seq_len_q`` and ``seq_len_k``; as an axis or
#: a filter it is ``seq_len_q``.
ALIASES = {"M": "sram_elems", "N": "seq_len_q", "Br": "block_m", "Bc": "block_n", "d": "head_dim", "B": "batch",
           "H": "heads", "Nq": "seq_len_q", "Nk": "seq_len_k"}
#: The fields a configuration (a sweep's base, run_one's cfg) may hold, aliases resolved.
CONFIG_FIELDS = (*WORKLOAD_FIELDS, "sram_elems", "block_m", "block_n", "gpu")
BOUND_KEYS = {"standard": "bound_standard", "flash": "bound_flash", "lower_bound": "bound_lower",
              "saha_ye": "bound_saha_ye"}


def field_of(name: str) -> str:
    """The record field a parameter name stands for (``M`` -> ``sram_elems``, ``N`` -> ``seq_len_q``, ...)."""
    return ALIASES.get(name, name)


def workload_record(w: Workload) -> dict:
    """The workload's fields as a record (the one place a :class:`Workload` becomes a dict):
    ``batch, heads, kv_heads, seq_len_q, seq_len_k, head_dim, dtype, causal``.  ``Workload(**it)``
    gives the workload back (a block mask aside)."""
    return {"batch": w.batch, "heads": w.heads, "kv_heads": w.hkv, "seq_len_q": w.nq, "seq_len_k": w.nk,
            "head_dim": w.d, "dtype": w.dtype, "causal": bool(w.causal)}


def _apply(cfg: dict, param: str, value) -> dict:
    cfg = dict(cfg)
    p = "N" if param == "N" else field_of(param)
    if p == "N":
        cfg["seq_len_q"] = cfg["seq_len_k"] = value
    elif p == "sram_elems":
        cfg["sram_elems"] = value
        # a swept M decides the tiling by the paper's rule
        cfg.pop("block_m", None)
        cfg.pop("block_n", None)
    elif p == "gpu":
        # M (hence the tiling) comes from the preset's shared memory
        cfg["gpu"] = value
        for k in ("sram_elems", "block_m", "block_n"):
            cfg.pop(k, None)
    elif p in WORKLOAD_FIELDS or p in ("block_m", "block_n"):
        cfg[p] = value
    else:
        raise ValueError(f"param={param!r}: not a workload field, 'N', 'M'/'sram_elems', block size or 'gpu'")
    return cfg


def normalise_base(base: dict, name: str = "base") -> dict:
    """``base`` with aliases resolved (``N`` sets both sequence lengths); ValueError naming
    ``name`` when it is not a dict, naming the key for a key that is no configuration field
    (:data:`CONFIG_FIELDS` or an alias of :data:`ALIASES`)."""
    if not isinstance(base, dict):
        raise ValueError(f"{name}={type(base).__name__}: must be a dict of configuration fields "
                         f"({', '.join(CONFIG_FIELDS)}, or an alias: {', '.join(ALIASES)})")
    out: dict = {}
    for k, v in base.items():
        if k == "N":
            out["seq_len_q"] = out["seq_len_k"] = v
        elif isinstance(k, str) and field_of(k) in CONFIG_FIELDS:
            out[field_of(k)] = v
        else:
            raise ValueError(f"{name}[{k!r}]: unknown configuration field; the fields are "
                             f"{', '.join(CONFIG_FIELDS)} (aliases: {', '.join(ALIASES)})")
    return out


def _hardware(gpu, name: str = "gpu") -> Hardware | None:
    """A GPU preset (or its name), or None; ValueError naming ``name`` for anything else."""
    if gpu is None or isinstance(gpu, Hardware):
        return gpu
    if isinstance(gpu, str):
        return get_gpu(gpu)
    raise ValueError(f"{name}={gpu!r}: must be a GPU preset name (e.g. 'h100'), a flashsim Hardware or None")


def _progress_bar(total: int, enabled: bool):
    """A tqdm progress bar on stderr, or None: only when asked for and stderr is a terminal (a
    redirected stderr, a CI log or a notebook cell gets no bar)."""
    if not enabled or not total or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, file=sys.stderr, unit="run", dynamic_ncols=True, leave=False)


def _given_tiling(cfg: dict) -> Tiling | None:
    """Block sizes given in a configuration, or None."""
    if "block_m" in cfg or "block_n" in cfg:
        if not ("block_m" in cfg and "block_n" in cfg):
            raise ValueError("block_m/block_n: give both block sizes, or neither and sram_elems")
        return Tiling(cfg["block_m"], cfg["block_n"])
    return None


def run_one(cfg: dict, algo: str, pass_: str, gpu=None, walk: bool = True) -> dict:
    """One flat record for configuration ``cfg`` (see the module docstring; a key that is no
    configuration field is a ValueError naming it)."""
    cfg = normalise_base(cfg, "cfg")
    wfields = {k: cfg[k] for k in WORKLOAD_FIELDS if k in cfg}
    w = Workload(**wfields)
    g = _hardware(cfg["gpu"], "cfg['gpu']") if "gpu" in cfg else _hardware(gpu)
    m = cfg.get("sram_elems")
    if m is None and g is not None:
        m = g.sram_elems(w.elem_bytes)
    mod = get_algorithm(algo)
    # the algorithm's own M rule decides what M and the given block sizes mean for it
    m = None if m is None else as_size("sram_elems", m)
    tiling, opts = mod.plan(w, m, _given_tiling(cfg) if mod.NEEDS_TILING else None)
    if walk:
        res = simulate(w, algo, pass_, tiling=tiling, **opts)
        io = res.io
        agrees = res.agrees
    else:
        el = closed_form_elements(w, algo, pass_, tiling=tiling, **opts)
        io = from_elements(el, build_schedule(w, algo, pass_, tiling=tiling, **opts).tensors)
        agrees = None
    f = count_flops(w, pass_, algo=algo, tiling=tiling)
    block_m, block_n = mod.blocks(w, tiling, **opts)
    rec: dict = {
        **workload_record(w),
        "block_density": w.block_mask.density if w.block_mask is not None else None,
        "algo": algo, "pass": pass_, "block_m": block_m, "block_n": block_n, "sram_elems": m,
        "hbm_read_bytes": io.read_bytes, "hbm_write_bytes": io.write_bytes, "hbm_bytes": io.bytes,
        "hbm_elements": io.elements, "hbm_sectors": io.sectors if walk else None, "agrees": agrees,
        "flops": f["total"], "matmul_flops": f["matmul"], "nonmatmul_flops": f["nonmatmul"],
    }
    if m is not None:
        b = compute_bounds(w, m)
        for k, key in BOUND_KEYS.items():
            rec[key] = b[k]
            rec[key + "_bytes"] = b[k] * w.elem_bytes
        rec["regime"] = b["regime"]
    else:
        for key in BOUND_KEYS.values():
            rec[key] = rec[key + "_bytes"] = None
        rec["regime"] = None
    if g is not None:
        rl = roofline_from_counts(f["matmul"], f["nonmatmul"], io.bytes, g, w.dtype)
        rec.update(gpu=g.name, time_s=rl["time_s"], compute_s=rl["compute_s"], memory_s=rl["memory_s"],
                   bound=rl["bound"], arithmetic_intensity=rl["arithmetic_intensity"])
    return rec


def _names(name: str, given, known) -> list[str]:
    """``given`` as a list of names out of ``known``; ValueError naming ``name`` otherwise."""
    if isinstance(given, (str, bytes)) or not isinstance(given, Iterable):
        raise ValueError(f"{name}={given!r}: must be a list, e.g. {list(known[:1])}")
    given = list(given)
    bad = [x for x in given if not isinstance(x, str) or x not in known]
    if bad:
        raise ValueError(f"{name}={given!r}: {bad[0]!r} is not one of {list(known)}")
    return given


def sweep(base: dict, param: str, values: Iterable, algos=("standard", "flash1", "flash2"), passes=("fwd",),
          gpu=None, progress: bool = False, walk: bool = True, on_error: str = "skip") -> list[dict]:
    """Simulate every (value, algo, pass) and return one record each.

    ``walk=True`` runs the walker (with sectors, and checks it against the closed form: the
    record's ``agrees``); ``walk=False`` uses only the closed forms (much faster for big sweeps).
    A run the algorithm cannot do (a pass it does not model, a mask it refuses, M < 4d, a module
    not written yet) is skipped with a warning when ``on_error="skip"``, raised with "raise".
    What no run could do is a ValueError naming the field whatever ``on_error`` says: a ``base``
    that is not a dict or holds a key that is no configuration field, an unknown algorithm or
    pass, a ``gpu`` (or, swept, a ``gpu`` value) that is not a preset.
    """
    if on_error not in ("skip", "raise"):
        raise ValueError(f"on_error={on_error!r}: must be 'skip' or 'raise'")
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ValueError(f"values={values!r}: must be a list of values")
    values = list(values)
    base = normalise_base(base)
    algos = _names("algos", algos, ALL_ALGORITHMS)
    passes = _names("passes", passes, PASSES)
    _hardware(gpu)
    if field_of(param) == "gpu":
        for i, v in enumerate(values):
            if not isinstance(v, (str, Hardware)):
                raise ValueError(f"values[{i}]={v!r}: a sweep over gpu takes GPU preset names (e.g. 'h100') "
                                 "or flashsim Hardware")
            _hardware(v)
    jobs = [(v, a, p) for v in values for a in algos for p in passes]
    out = []
    bar = _progress_bar(len(jobs), progress)
    try:
        for v, a, p in jobs:
            if bar is not None:
                bar.set_description(f"{a} {p} {param}={v}"[:40], refresh=False)
            cfg = _apply(base, param, v)
            try:
                rec = run_one(cfg, a, p, gpu=gpu, walk=walk)
            except (ValueError, ImportError) as e:
                if on_error == "raise":
                    raise
                warnings.warn(f"skipped {a} {p} at {param}={v}: {e}", stacklevel=2)
                continue
            finally:
                if bar is not None:
                    bar.update()
            rec["param"] = param
            rec["value"] = v
            out.append(rec)
    finally:
        if bar is not None:
            bar.close()
    return out


# --------------------------------------------------------------------------------------------
# CSV


def write_csv(records: list[dict], path) -> None:
    """Write records as CSV; the header is the union of keys in order of first appearance."""
    keys: dict[str, None] = {}
    for r in records:
        for k in r:
            keys.setdefault(k, None)

    def write(fh):
        wr = csv.DictWriter(fh, fieldnames=list(keys))
        wr.writeheader()
        for r in records:
            wr.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in keys})

    atomic_write(path, write, newline="")


def _parse(s: str):
    if s == "":
        return None
    if s in ("True", "False"):
        return s == "True"
    try:
        return int(s)
    except ValueError:
        pass
    try:
        return float(s)
    except ValueError:
        return s


def read_csv(path) -> list[dict]:
    """Read records written by :func:`write_csv`, turning numbers, booleans and blanks back."""
    with open(path, newline="") as fh:
        return [{k: _parse(v) for k, v in row.items()} for row in csv.DictReader(fh)]


# --------------------------------------------------------------------------------------------
# Exponent fits


def _select(records: list[dict], where) -> list[dict]:
    if where is None:
        return list(records)
    if callable(where):
        return [r for r in records if where(r)]
    if isinstance(where, dict):
        def ok(r):
            for k, v in where.items():
                rv = r.get(field_of(k) if field_of(k) in r else k)
                if callable(v):
                    if not v(rv):
                        return False
                elif isinstance(v, (list, tuple, set)):
                    if rv not in v:
                        return False
                elif rv != v:
                    return False
            return True
        return [r for r in records if ok(r)]
    raise ValueError(f"where={where!r}: must be None, a dict of field -> value, or a callable")


def _loglog(records, xs, y):
    rows = [r for r in records if all(r.get(x) is not None and r[x] > 0 for x in xs)
            and r.get(y) is not None and r[y] > 0]
    X = np.array([[math.log(r[x]) for x in xs] for r in rows], dtype=float).reshape(len(rows), len(xs))
    Y = np.array([math.log(r[y]) for r in rows], dtype=float)
    return X, Y


def _lstsq(X: np.ndarray, Y: np.ndarray):
    """Least squares of Y on [1, X]: (coefficients incl. intercept, standard errors, r²)."""
    n, p = X.shape[0], X.shape[1] + 1
    A = np.column_stack([np.ones(n), X])
    coef, *_ = np.linalg.lstsq(A, Y, rcond=None)
    resid = Y - A @ coef
    rss = float(resid @ resid)
    tss = float(((Y - Y.mean()) ** 2).sum())
    r2 = 1.0 - rss / tss if tss > 0 else 1.0
    if n > p:
        cov = rss / (n - p) * np.linalg.pinv(A.T @ A)
        se = np.sqrt(np.maximum(np.diag(cov), 0.0))
    else:
        se = np.full(p, np.nan)
    return coef, se, r2


def fit_exponent(records: list[dict], x: str, y: str = "hbm_bytes", where=None) -> tuple[float, float, float]:
    """Fit ln y = intercept + slope · ln x by least squares; returns (slope, intercept, r²).

    ``x`` may be a field or an alias (``M``, ``N`` = ``seq_len_q``, ``d``).  ``where`` filters the
    records: a dict of field -> value (or list of values, or predicate), or a predicate on the
    record.  The intercept is natural-log.
    """
    xf = field_of(x)
    X, Y = _loglog(_select(records, where), [xf], y)
    if len(np.unique(X[:, 0])) < 2:
        raise ValueError(f"x={x!r}: need at least two distinct positive values to fit ({len(Y)} records)")
    coef, _, r2 = _lstsq(X, Y)
    return float(coef[1]), float(coef[0]), float(r2)


def fit_exponents(records: list[dict], y: str = "hbm_bytes", xs=("M", "N", "d"), where=None,
                  joint: bool = True, algo: str | None = None, pass_: str | None = None) -> dict:
    """Exponents of ``y`` in each of ``xs`` (e.g. an algorithm's counts against M, N and d).

    ``joint=True``: one multiple regression ln y = a + Σ b_x ln x over all selected records (the
    xs that do not vary are left out and reported as nan); ``stderr`` is each coefficient's
    standard error from the residual variance.  ``joint=False``: each x on its own, within each
    group of records where the other xs are fixed; the exponent is the mean over groups and
    ``stderr`` the standard error of that mean (or, with a single group, the regression's).
    ``algo`` and ``pass_`` restrict the records to one algorithm and pass (on top of ``where``).
    Returns {"exponents", "stderr", "intercept", "r2", "n", "joint"}.
    """
    sel = _select(records, where)
    if algo is not None:
        sel = [r for r in sel if r.get("algo") == algo]
    if pass_ is not None:
        sel = [r for r in sel if r.get("pass") == pass_]
    fields = [field_of(x) for x in xs]
    exps = {x: float("nan") for x in xs}
    ses = {x: float("nan") for x in xs}
    if joint:
        X, Y = _loglog(sel, fields, y)
        vary = [i for i in range(len(xs)) if len(np.unique(X[:, i])) > 1]
        if not vary:
            raise ValueError(f"xs={xs}: none of them varies over the {len(Y)} selected records")
        coef, se, r2 = _lstsq(X[:, vary], Y)
        for k, i in enumerate(vary):
            exps[xs[i]] = float(coef[k + 1])
            ses[xs[i]] = float(se[k + 1])
        return {"exponents": exps, "stderr": ses, "intercept": float(coef[0]), "r2": float(r2), "n": len(Y),
                "joint": True}
    r2s = {}
    for i, x in enumerate(xs):
        others = [f for j, f in enumerate(fields) if j != i]
        groups: dict[tuple, list[dict]] = {}
        for r in sel:
            groups.setdefault(tuple(r.get(f) for f in others), []).append(r)
        slopes, last = [], None
        for grp in groups.values():
            X, Y = _loglog(grp, [fields[i]], y)
            if len(np.unique(X[:, 0])) < 2:
                continue
            last = _lstsq(X, Y)
            slopes.append(float(last[0][1]))
        if not slopes:
            continue
        exps[x] = float(np.mean(slopes))
        if len(slopes) > 1:
            ses[x] = float(np.std(slopes, ddof=1) / math.sqrt(len(slopes)))
        else:
            ses[x] = float(last[1][1])
        r2s[x] = float(last[2])
    return {"exponents": exps, "stderr": ses, "intercept": float("nan"), "r2": r2s, "n": len(sel), "joint": False}


def group_by(records: list[dict], key: str | Callable) -> dict:
    """Records grouped by a field (or a function of the record), in order of first appearance."""
    out: dict = {}
    for r in records:
        out.setdefault(key(r) if callable(key) else r.get(key), []).append(r)
    return out


__all__ = ["sweep", "run_one", "workload_record", "field_of", "write_csv", "read_csv", "fit_exponent",
           "fit_exponents", "group_by", "ALIASES", "BOUND_KEYS"]
