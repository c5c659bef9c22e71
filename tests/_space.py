"""Labels for the configurations the property tests draw, so that coverage can be counted.

``pytest --hypothesis-show-statistics tests/test_*_schedule.py tests/test_smallcache.py`` prints,
per test, the share of examples with each label: how many of the walker == closed form cases
were causal, block-sparse, ragged, had Nq ≠ Nk, and so on.
"""

from __future__ import annotations

from hypothesis import event


def label(w, block_m: int | None = None, block_n: int | None = None, d_block: int | None = None) -> None:
    """Record the features of workload ``w`` run with blocks ``block_m`` x ``block_n``
    (``d_block``: a tile that also splits the head dimension, as smallcache's s does)."""
    event("Nq != Nk" if w.nq != w.nk else "Nq == Nk")
    if w.causal:
        event("causal")
        if w.nq > w.nk:
            event("causal with Nq > Nk (rows that see no key)")
    if w.block_mask is not None:
        event("block-sparse")
        if w.causal:
            event("block-sparse and causal")
    if w.group > 1:
        event("grouped-query (heads > kv_heads)")
    if 1 in (w.nq, w.nk):
        event("Nq = 1 or Nk = 1")
    ragged = (block_m is not None and w.nq % block_m) or (block_n is not None and w.nk % block_n) \
        or (d_block is not None and w.d % d_block)
    event("ragged (a block does not divide its dimension)" if ragged else "every block divides its dimension")
