"""Measure this machine: matmul peak and memory bandwidth (the MFU denominator, and the
"this machine, measured" row of the hardware table used by the throughput model, method §2).

`matmul_peak()` times large square matmuls in a dtype and keeps the best rate (the machine may be
shared; the spread is reported too), labelled with the precision they ran in (`precision`: an fp32
matmul on a GPU is TF32 where torch allows it, and the engine allows it on import). `memory_bandwidth()` times a large tensor copy (bytes
read + written). `calibrate()` runs both and, when `spirelib.throughput.hardware` is present, stores
the result with `hardware.save_measured` so notebooks can compare against it.
"""

from __future__ import annotations

import time

import torch

from spirelib.throughput import hardware


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best_rate(fn, work: float, device: torch.device, seconds: float, repeats: int) -> list[float]:
    """Rates (work / s) of `repeats` timed batches of calls, each batch lasting about `seconds`."""
    fn()
    _sync(device)
    t = time.perf_counter()
    fn()
    _sync(device)
    calls = max(1, int(seconds / max(time.perf_counter() - t, 1e-6)))
    rates = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        _sync(device)
        rates.append(work * calls / (time.perf_counter() - t))
    return rates


PRECISIONS = {torch.float64: "fp64", torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def precision(dtype: torch.dtype, device: torch.device | str) -> str:
    """The hardware table's name for the precision a `dtype` matmul on `device` computes in: "tf32"
    for fp32 on a GPU while TF32 matmuls are allowed (`torch.backends.cuda.matmul.allow_tf32`)."""
    if dtype not in PRECISIONS:
        raise ValueError(f"no matmul precision for {dtype}; use one of {sorted(map(str, PRECISIONS))}")
    if dtype == torch.float32 and torch.device(device).type == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return PRECISIONS[dtype]


#: The n of the n x n matmuls timed where none are given, by device type. A CPU's BLAS runs a
#: 2048 matmul at its peak already: on the 2-core CI machine (2026-12-07) 4096 measured the same
#: best rate, 67 against 70 GFLOP/s on one thread and 110 against 110 on two, at 8x the seconds
#: (9.5 s against 1.2 s on one thread). A GPU needs larger ones to fill its SMs.
SIZES = {"cpu": (2048,), "cuda": (2048, 4096)}


def matmul_peak(sizes: tuple[int, ...] | None = None, seconds: float = 0.4, repeats: int = 3, device: str = "cpu",
                dtype: torch.dtype = torch.float32) -> dict:
    """FLOP/s of n x n matmuls in `dtype` (fp32 by default), n in `sizes` (default: the device's
    `SIZES`): {"flops": best, "rates": all rates, "precision": `precision(dtype, device)`, ...}."""
    dev = torch.device(device)
    sizes = sizes or SIZES.get(dev.type, SIZES["cuda"])
    rates = []
    for n in sizes:
        gen = torch.Generator(device=dev).manual_seed(0)
        a, b = (torch.randn(n, n, device=dev, generator=gen).to(dtype) for _ in range(2))
        out = torch.empty(n, n, device=dev, dtype=dtype)
        rates += _best_rate(lambda a=a, b=b, out=out: torch.mm(a, b, out=out), 2.0 * n**3, dev, seconds, repeats)
    return {"flops": max(rates), "rates": rates, "sizes": list(sizes), "threads": torch.get_num_threads(),
            "precision": precision(dtype, dev)}


def memory_bandwidth(mbytes: int = 512, seconds: float = 0.4, repeats: int = 3, device: str = "cpu") -> dict:
    """Bytes/s of copying an fp32 tensor of `mbytes` MB (read + write counted)."""
    dev = torch.device(device)
    src = torch.ones(mbytes * 2**20 // 4, device=dev)
    dst = torch.empty_like(src)
    rates = _best_rate(lambda: dst.copy_(src), 2.0 * src.numel() * 4, dev, seconds, repeats)
    return {"bandwidth": max(rates), "rates": rates}


def calibrate(device: str = "cpu", dtype: torch.dtype = torch.float32, save: bool = True) -> dict:
    """Measure the matmul peak in `dtype` (the models' dtype: bf16 for a bf16 model) and the memory
    bandwidth; store them in the hardware table (spirelib.throughput.hardware.save_measured) under the
    precision the matmuls ran in (`precision`) when `save` is set."""
    peak, bw = matmul_peak(device=device, dtype=dtype), memory_bandwidth(device=device)
    result = {"peak_flops": peak["flops"], "precision": peak["precision"], "bandwidth": bw["bandwidth"],
              "matmul_rates": peak["rates"], "bandwidth_rates": bw["rates"], "threads": peak["threads"],
              "device": device}
    if save:
        result["saved_to"] = str(hardware.save_measured({peak["precision"]: peak["flops"]}, bw["bandwidth"]))
    return result


def quick(device: str = "cpu", dtype: torch.dtype = torch.float32, size: int = 512, mbytes: int = 64,
          seconds: float = 0.05, repeats: int = 3) -> dict:
    """{"peak_flops", "bandwidth"} from small matmuls and copies, in about half a second: not the
    machine's peak (`calibrate` measures that), but the same work every time, so that two quick
    calibrations compare. The plan checks its timings against one made in the same call: a machine
    shared with other work shows it here first (`spirelib.workbook.probe`)."""
    return {"peak_flops": matmul_peak((size,), seconds, repeats, device, dtype)["flops"],
            "bandwidth": memory_bandwidth(mbytes, seconds, repeats, device)["bandwidth"]}
