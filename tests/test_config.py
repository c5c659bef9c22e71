"""Bad values are refused at construction with a ValueError whose message names the field."""

import dataclasses

import numpy as np
import pytest

from flashsim import Workload, get_gpu, simulate
from flashsim.config import GPUS, BlockMask, Tiling

BASE = dict(batch=2, heads=4, seq_len_q=64, head_dim=16)


@pytest.mark.parametrize("field, value, words", [
    ("batch", 0, ["batch=0", "positive"]),
    ("batch", -2, ["batch=-2", "positive"]),
    ("heads", 0, ["heads=0"]),
    ("seq_len_q", 0, ["seq_len_q=0"]),
    ("seq_len_q", -1, ["seq_len_q=-1"]),
    ("seq_len_k", 0, ["seq_len_k=0"]),
    ("head_dim", 0, ["head_dim=0"]),
    ("head_dim", 2.5, ["head_dim=2.5", "integer"]),
    ("seq_len_q", True, ["seq_len_q=True", "integer"]),
    ("kv_heads", 0, ["kv_heads=0"]),
    ("kv_heads", 3, ["kv_heads=3", "divide heads=4"]),
    ("kv_heads", 8, ["kv_heads=8", "divide heads=4"]),
    ("dtype", "fp8", ["dtype='fp8'"]),
    ("causal", 1, ["causal=1", "bool"]),
])
def test_workload_names_the_field(field, value, words):
    with pytest.raises(ValueError) as e:
        Workload(**{**BASE, field: value})
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_block_mask_against_nq_nk_and_tiling():
    bm = BlockMask.from_array(np.ones((4, 4), bool), 16, 16)
    Workload(**BASE, block_mask=bm)
    with pytest.raises(ValueError, match=r"block_mask.shape=\(4, 4\).*seq_len_k=100"):
        Workload(**BASE, seq_len_k=100, block_mask=bm)
    with pytest.raises(ValueError, match="block_mask blocks"):
        simulate(Workload(**BASE, block_mask=bm), "flash2", tiling=Tiling(8, 8))
    for bad, word in ((lambda: BlockMask(0, 4, ((True,),)), "block_m=0"),
                      (lambda: BlockMask(4, 4, ()), "mask shape"),
                      (lambda: BlockMask(4, 4, ((True,), (True, False))), "mask row lengths"),
                      (lambda: BlockMask.from_array(np.ones(3, bool), 4, 4), "mask.ndim=1")):
        with pytest.raises(ValueError, match=word):
            bad()


def test_tiling_and_m():
    for bm, bn, word in ((0, 4, "block_m=0"), (4, -1, "block_n=-1"), (4.0, 4, "block_m=4.0")):
        with pytest.raises(ValueError, match=word):
            Tiling(bm, bn)
    with pytest.raises(ValueError, match=r"sram_elems=63: FlashAttention needs M >= 4\*d = 64"):
        Tiling.from_sram(63, 16)
    with pytest.raises(ValueError, match="sram_bytes=0"):
        Tiling.from_sram_bytes(0, 16, 2)
    w = Workload(**BASE)
    for algo in ("flash1", "flash2"):
        with pytest.raises(ValueError, match="sram_elems=10"):
            simulate(w, algo, sram_elems=10)
        with pytest.raises(ValueError, match="sram_elems=None"):
            simulate(w, algo)
    with pytest.raises(ValueError, match="sram_elems=4"):
        simulate(w, "smallcache", sram_elems=4)
    with pytest.raises(ValueError, match="algo='flash3'"):
        simulate(w, "flash3", sram_elems=1024)
    with pytest.raises(ValueError, match="pass_='up'"):
        simulate(w, "flash2", "up", sram_elems=1024)


def test_gpu_presets():
    for name, g in GPUS.items():
        assert g.source and get_gpu(name) is g
        assert g.sram_elems(2) == g.max_shared_bytes_per_block // 2
    assert get_gpu("A100") is GPUS["a100-40gb"]
    with pytest.raises(ValueError, match="gpu='v100'"):
        get_gpu("v100")
    h = GPUS["h100"]
    for field, value in (("num_sms", 0), ("l2_bytes", -1), ("hbm_bytes_per_s", 0.0), ("hbm_bytes_per_s", float("inf")),
                         ("nonmatmul_flops", -1.0), ("name", ""), ("matmul_flops", {"fp16": 0.0})):
        with pytest.raises(ValueError, match=field):
            dataclasses.replace(h, **{field: value})
    with pytest.raises(dataclasses.FrozenInstanceError):
        h.num_sms = 1  # type: ignore[misc]
