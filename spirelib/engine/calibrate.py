"""Measure this machine: fp32 matmul peak and memory bandwidth (the MFU denominator, and the
"this machine, measured" row of the hardware table used by the throughput model, method §2).

`matmul_peak()` times large square fp32 matmuls and keeps the best rate (the machine may be
shared; the spread is reported too). `memory_bandwidth()` times a large tensor copy (bytes
read + written). `calibrate()` runs both and, when `spirelib.modeling.hardware` is present, stores
the result with `hardware.save_measured` so notebooks can compare against it.
"""

from __future__ import annotations

import time

import torch

from spirelib.modeling import hardware


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


def matmul_peak(sizes=(2048, 4096), seconds: float = 0.4, repeats: int = 3, device: str = "cpu",
                dtype: torch.dtype = torch.float32) -> dict:
    """FLOP/s of n x n matmuls in `dtype` (fp32 by default): {"flops": best, "rates": all rates, ...}."""
    dev = torch.device(device)
    rates = []
    for n in sizes:
        gen = torch.Generator(device=dev).manual_seed(0)
        a, b = (torch.randn(n, n, device=dev, generator=gen).to(dtype) for _ in range(2))
        out = torch.empty(n, n, device=dev, dtype=dtype)
        rates += _best_rate(lambda a=a, b=b, out=out: torch.mm(a, b, out=out), 2.0 * n**3, dev, seconds, repeats)
    return {"flops": max(rates), "rates": rates, "sizes": list(sizes), "threads": torch.get_num_threads()}


def memory_bandwidth(mbytes: int = 512, seconds: float = 0.4, repeats: int = 3, device: str = "cpu") -> dict:
    """Bytes/s of copying an fp32 tensor of `mbytes` MB (read + write counted)."""
    dev = torch.device(device)
    src = torch.ones(mbytes * 2**20 // 4, device=dev)
    dst = torch.empty_like(src)
    rates = _best_rate(lambda: dst.copy_(src), 2.0 * src.numel() * 4, dev, seconds, repeats)
    return {"bandwidth": max(rates), "rates": rates}


def calibrate(device: str = "cpu", save: bool = True) -> dict:
    """Measure the fp32 matmul peak and memory bandwidth; store them in the hardware table
    (spirelib.modeling.hardware.save_measured) when that module exists and `save` is set."""
    peak, bw = matmul_peak(device=device), memory_bandwidth(device=device)
    result = {"fp32_flops": peak["flops"], "bandwidth": bw["bandwidth"], "matmul_rates": peak["rates"],
              "bandwidth_rates": bw["rates"], "threads": peak["threads"], "device": device}
    if save:
        result["saved_to"] = str(hardware.save_measured({"fp32": peak["flops"]}, bw["bandwidth"]))
    return result
