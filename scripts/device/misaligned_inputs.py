"""On the GPU machine: a torch input whose data pointer is not 16-byte aligned (a view two bytes
into its storage) runs the reference kernel under ``impl="auto"``, gets one ValueError naming it
under ``impl="fast"``, and still runs the reference kernel after prepared (replayed) calls of the
same shapes with aligned inputs.  Prints the errors against SDPA in float32.

    python3 scripts/device/misaligned_inputs.py > misalign.log
"""

import torch

import kernels

torch.manual_seed(0)
for dt in (torch.float16, torch.bfloat16):
    base = torch.randn(1 * 2 * 256 * 64 + 8, device="cuda", dtype=dt)
    q = base[1:1 + 2 * 256 * 64].view(1, 2, 256, 64)  # 2-byte offset: not 16-byte aligned
    k = torch.randn(1, 2, 256, 64, device="cuda", dtype=dt)
    v = torch.randn_like(k)
    print(dt, "q ptr % 16 =", q.data_ptr() % 16)
    o = kernels.flash_attention(q, k, v)  # auto -> reference
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
    print("auto: rel err", ((o.float() - ref).norm() / ref.norm()).item())
    try:
        kernels.flash_attention(q, k, v, impl="fast")
        print("fast: NO ERROR (bad)")
    except ValueError as e:
        print("fast: ValueError:", e)
    for _ in range(3):  # prepared replay after aligned calls, then a misaligned one
        kernels.flash_attention(q.clone(), k, v)
    o2 = kernels.flash_attention(q, k, v)
    print("after prepared calls, misaligned: rel err", ((o2.float() - ref).norm() / ref.norm()).item())
torch.cuda.synchronize()
print("ok")
