"""Nsight Compute: the command line we run and the reader for what it writes.

We drive the ``ncu`` command line and read its CSV export (``--csv --page raw --print-units
base``), rather than its Python module ``ncu_report``: that module ships inside the Nsight
Compute installation and is absent from the CPU machines where CI and the notebooks read the
recorded data, while the CSV is plain text that any machine reads.  The reader is tested on a
recorded export (tests/data/ncu_raw_sample.csv).

Metrics (per kernel launch):

* ``l1tex__t_bytes_pipe_lsu_mem_global_op_{ld,st}.sum``: global-memory bytes requested through
  the load/store unit, in whole 32-byte sectors.  This is the level the IO model counts: each
  tile requested from global memory, whether L2 or DRAM serves it.
* ``lts__t_sectors_srcunit_tex_op_{read,write}.sum``: 32-byte sectors the SMs asked of L2.
* ``dram__bytes_{read,write}.sum``: what reached HBM after the L2.
* ``gpu__time_duration.sum``: kernel time (ns) under the profiler, with clocks left as they
  are (``--clock-control none``) and caches flushed before each replay pass
  (``--cache-control all``, the default; recorded in the data as ``cache_control``).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence

METRICS = (
    "l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum",
    "l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum",
    "lts__t_sectors_srcunit_tex_op_read.sum",
    "lts__t_sectors_srcunit_tex_op_write.sum",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "gpu__time_duration.sum",
)

#: short names used in our data files
SHORT = {
    "l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum": "lsu_ld_bytes",
    "l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum": "lsu_st_bytes",
    "lts__t_sectors_srcunit_tex_op_read.sum": "l2_read_sectors",
    "lts__t_sectors_srcunit_tex_op_write.sum": "l2_write_sectors",
    "dram__bytes_read.sum": "dram_read_bytes",
    "dram__bytes_write.sum": "dram_write_bytes",
    "gpu__time_duration.sum": "time_ns",
}

#: Optional metrics in bytes (read where the export has them; part of :data:`OPTIONAL_METRICS`):
#: the bytes of global reductions (``red``) and atomics (``atom``) through the LSU, and of
#: cp.async's global-to-shared loads (LDGSTS) that go through L1.
EXTRA_METRICS = {
    "l1tex__t_bytes_pipe_lsu_mem_global_op_red.sum": "lsu_red_bytes",
    "l1tex__t_bytes_pipe_lsu_mem_global_op_atom.sum": "lsu_atom_bytes",
    "l1tex__t_bytes_pipe_lsu_mem_global_op_ldgsts_cache_access.sum": "lsu_ldgsts_access_bytes",
}

#: the unit we require for each metric (``--print-units base``)
UNITS = {"lsu_ld_bytes": "byte", "lsu_st_bytes": "byte", "l2_read_sectors": "sector",
         "l2_write_sectors": "sector", "dram_read_bytes": "byte", "dram_write_bytes": "byte", "time_ns": "ns"}


#: Metrics recorded beside :data:`METRICS` when the installed ncu knows them (issue 15; see
#: :func:`available_metrics`), in 32-byte sectors (and, :data:`EXTRA_METRICS`, in bytes): global
#: reductions (``red``, e.g. the dQ atomics of FlashAttention-2's backward) and atomics at the
#: LSU and L2 levels, and the ``cp.async`` (LDGSTS) global-to-shared loads at the LSU level.  A
#: record may lack them (older records, or an ncu without them); readers treat an absent column
#: as not measured.
OPTIONAL_METRICS = {
    "l1tex__t_sectors_pipe_lsu_mem_global_op_red.sum": "lsu_red_sectors",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_atom.sum": "lsu_atom_sectors",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts_cache_access.sum": "lsu_ldgsts_access_sectors",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts_cache_bypass.sum": "lsu_ldgsts_bypass_sectors",
    "lts__t_sectors_srcunit_tex_op_red.sum": "l2_red_sectors",
    "lts__t_sectors_srcunit_tex_op_atom.sum": "l2_atom_sectors",
    # the sectors L2 sends to the SMs (through the crossbar into L1TEX's M stage: loads, cp.async
    # and TMA loads, one per receiving SM), and those of TMA loads alone.  L2's own read count
    # above (lts__t_sectors_srcunit_tex_op_read) is taken after Hopper's L2 request coalescer, which
    # merges reads of one sector by several SMs arriving together: fewer, by a share that depends
    # on timing (scripts/device/tma_l2_probe.sh)
    "l1tex__m_xbar2l1tex_read_sectors.sum": "xbar_read_sectors",
    "l1tex__m_xbar2l1tex_read_sectors_mem_global_op_tma_ld.sum": "xbar_tma_read_sectors",
    **EXTRA_METRICS,
}


def available_metrics(candidates=OPTIONAL_METRICS, query: str | None = None) -> list[str]:
    """Those of ``candidates`` whose base name (without ``.sum``) the installed ncu lists
    (``ncu --query-metrics``, or ``query``, its output, given); none when ncu cannot be asked.
    An unknown metric would make ncu refuse the whole run, so optional ones are asked for only
    when listed."""
    if query is None:
        import subprocess

        try:
            query = subprocess.run(["ncu", "--query-metrics"], capture_output=True, text=True, timeout=120).stdout
        except (OSError, subprocess.SubprocessError):
            return []
    listed = set(query.split())
    return [m for m in candidates if m.rsplit(".", 1)[0] in listed]


def ncu_command(program: Sequence[str], export: str | None = None, metrics: Sequence[str] = METRICS,
                cache_control: str = "all", profile_from_start: bool = True) -> list[str]:
    """The ``ncu`` command that profiles every kernel launch of ``program`` for ``metrics``."""
    cmd = ["ncu", "--clock-control", "none", "--cache-control", cache_control,
           "--metrics", ",".join(metrics), "--csv", "--page", "raw", "--print-units", "base"]
    if not profile_from_start:
        cmd += ["--profile-from-start", "off"]
    if export:
        cmd += ["--log-file", export]
    return cmd + list(program)


def _number(text: str) -> float:
    t = text.strip().replace(",", "")
    if t in ("", "n/a"):
        return float("nan")
    return float(t)


def parse_raw_csv(text: str) -> list[dict]:
    """Parse ``ncu --csv --page raw --print-units base`` output into one dict per kernel launch.

    Lines ncu prints before the table (``==PROF==`` notes, the program's own output) are skipped.
    The row after the header holds the units; each metric must be in its base unit, otherwise
    ``ValueError`` (a scaled unit such as "Kbyte" would silently break every comparison).
    """
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        raise ValueError("no ncu CSV table found (expected a header line starting with \"ID\")")
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header, units, data = rows[0], rows[1], rows[2:]
    col = {name: i for i, name in enumerate(header)}
    missing = [m for m in SHORT if m not in col]
    if missing:
        raise ValueError(f"metrics missing from the ncu table: {missing}")
    for long, short in SHORT.items():
        unit = units[col[long]]
        if unit != UNITS[short]:
            raise ValueError(f"{long}: unit {unit!r}, expected {UNITS[short]!r} (use --print-units base)")
    out = []
    for r in data:
        if len(r) != len(header) or not r[col["ID"]].strip():
            continue
        rec = {"launch_id": int(r[col["ID"]]), "kernel": r[col["Kernel Name"]],
               "grid": r[col["Grid Size"]] if "Grid Size" in col else "",
               "block": r[col["Block Size"]] if "Block Size" in col else ""}
        for long, short in SHORT.items():
            v = _number(r[col[long]])
            rec[short] = int(v) if short != "time_ns" and v == v else v
        for long, short in OPTIONAL_METRICS.items():
            if long in col:
                unit = "byte" if short.endswith("_bytes") else "sector"
                if units[col[long]] != unit:
                    raise ValueError(f"{long}: unit {units[col[long]]!r}, expected {unit!r} (use --print-units base)")
                v = _number(r[col[long]])
                rec[short] = int(v) if v == v else None
        rec["lsu_bytes"] = rec["lsu_ld_bytes"] + rec["lsu_st_bytes"]
        rec["dram_bytes"] = rec["dram_read_bytes"] + rec["dram_write_bytes"]
        out.append(rec)
    return out


MARKER = "flashsim_marker"


def split_by_marker(launches: list[dict]) -> list[list[dict]]:
    """Group the launches of each configuration.  The worker profiles only the measured call of
    each configuration (cuProfilerStart/Stop around it, ncu ``--profile-from-start off``) and
    launches one marker kernel right after it, so the launches before the k-th marker are
    configuration k's."""
    groups, cur = [], []
    for rec in launches:
        if MARKER in rec["kernel"]:
            groups.append(cur)
            cur = []
        else:
            cur.append(rec)
    if cur:
        raise ValueError(f"{len(cur)} launches after the last marker: the run did not finish")
    return groups
