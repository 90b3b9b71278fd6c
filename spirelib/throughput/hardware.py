"""Accelerators for the throughput model: peak dense FLOP/s per dtype and memory bandwidth.

The model (method §2) needs one number per device, its operational intensity HOI = peak
FLOP/s / bytes/s, plus the bytes a weight and a KV value take (`BYTES_PER_VALUE`). Figures
are vendor peaks for *dense* math (the "with sparsity" datasheet figures halved). The
paper's HOI = 600 is H100 SXM dense FP8: 1979 TFLOP/s / 3.35 TB/s = 590.7, which the paper
rounds to 600. A `Machine` is one device at one dtype, as the cost models read it. "this
machine, measured" is written by `spirelib.measure.calibrate` via `save_measured` and read back by
`measured_hardware`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from spirelib.paths import cache_dir, write_atomically

BYTES_PER_VALUE = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}
MEASURED_NAME = "this-machine"
#: The workbook's GPU figures (the plan's columns, a training budget's time) are modeled: training
#: at this MFU (torchtitan's Llama runs on H100 report 35-45%), decoding at this fraction of the
#: roofline. Assumptions, stated with every GPU figure.
GPU_MFU = 0.4
GPU_ROOFLINE_FRACTION = 0.5
GPU_DTYPE = "bf16"


@dataclass(frozen=True)
class Hardware:
    """One device: dense peak FLOP/s per dtype, memory bandwidth in bytes/s, and a source."""

    name: str
    peak_flops: dict[str, float] = field(hash=False)
    bandwidth: float
    source: str

    def __post_init__(self):
        if not self.peak_flops:
            raise ValueError(f"{self.name}: peak_flops needs at least one dtype")
        for dtype, flops in self.peak_flops.items():
            if dtype not in BYTES_PER_VALUE:
                raise ValueError(f"{self.name}: unknown dtype {dtype!r}; known: {sorted(BYTES_PER_VALUE)}")
            if not (isinstance(flops, (int, float)) and math.isfinite(flops) and flops > 0):
                raise ValueError(f"{self.name}: peak_flops[{dtype!r}] must be a positive number, got {flops!r}")
        if not (isinstance(self.bandwidth, (int, float)) and math.isfinite(self.bandwidth) and self.bandwidth > 0):
            raise ValueError(f"{self.name}: bandwidth must be a positive number of bytes/s, got {self.bandwidth!r}")

    def hoi(self, dtype: str = "fp8") -> float:
        """Hardware operational intensity in FLOP/byte for math in `dtype`."""
        if dtype not in self.peak_flops:
            raise ValueError(f"{self.name} has no {dtype!r} peak; it has {sorted(self.peak_flops)}")
        return self.peak_flops[dtype] / self.bandwidth


@dataclass(frozen=True)
class Machine:
    """One device as the cost models price a round on it: peak FLOP/s and bandwidth (bytes/s) in
    the dtype it computes in, and the bytes a weight or a KV value takes there. Notebook 09 builds
    this machine's from its calibration (`spirelib.measure.calibrate`); the three travel together."""

    peak_flops: float
    bandwidth: float
    bytes_per_value: float

    def __post_init__(self):
        for name in ("peak_flops", "bandwidth", "bytes_per_value"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"Machine.{name} must be a positive number, got {value!r}")

    @property
    def hoi(self) -> float:
        """Hardware operational intensity, FLOP/byte: peak / bandwidth (method §2)."""
        return self.peak_flops / self.bandwidth


HARDWARE: dict[str, Hardware] = {
    # NVIDIA H100 Tensor Core GPU datasheet (SXM5): FP8 3,958 / BF16 1,979 / TF32 989 TFLOPS
    # and INT8 3,958 TOPS, all "with sparsity" (dense = half); FP32 67 TFLOPS; HBM3 3.35 TB/s.
    "h100-sxm": Hardware(
        "h100-sxm",
        {"fp8": 1979e12, "int8": 1979e12, "bf16": 989.5e12, "fp16": 989.5e12, "tf32": 494.5e12, "fp32": 67e12},
        3.35e12,
        "NVIDIA H100 datasheet (SXM5), sparse figures halved",
    ),
    # NVIDIA H200 datasheet (SXM): same tensor peaks as H100 SXM; HBM3e 141 GB at 4.8 TB/s.
    "h200": Hardware(
        "h200",
        {"fp8": 1979e12, "int8": 1979e12, "bf16": 989.5e12, "fp16": 989.5e12, "tf32": 494.5e12, "fp32": 67e12},
        4.8e12,
        "NVIDIA H200 datasheet (SXM), sparse figures halved",
    ),
    # NVIDIA Blackwell datasheet, individual HGX B200 GPU: FP8 9, INT8 9 (POPS), FP16/BF16 4.5,
    # TF32 2.2 PFLOPS, all with sparsity (dense = half); FP32 75 TFLOPS; HBM3e 180 GB at 7.7 TB/s.
    "b200": Hardware(
        "b200",
        {"fp8": 4.5e15, "int8": 4.5e15, "bf16": 2.25e15, "fp16": 2.25e15, "tf32": 1.1e15, "fp32": 75e12},
        7.7e12,
        "NVIDIA Blackwell datasheet (HGX B200, per GPU), sparse figures halved",
    ),
    # NVIDIA A100 datasheet (80GB SXM): BF16/FP16 312, TF32 156 TFLOPS dense, INT8 624 TOPS
    # dense, FP32 19.5 TFLOPS; HBM2e 2,039 GB/s. No FP8.
    "a100-sxm": Hardware(
        "a100-sxm",
        {"int8": 624e12, "bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
        2.039e12,
        "NVIDIA A100 datasheet (80GB SXM), dense figures",
    ),
    # Google Cloud TPU v5e documentation, per chip: 197 TFLOPS BF16, 394 TOPS INT8;
    # 16 GB HBM2 at 819 GB/s.
    "tpu-v5e": Hardware(
        "tpu-v5e",
        {"int8": 394e12, "bf16": 197e12},
        0.819e12,
        "Google Cloud TPU v5e documentation, per chip",
    ),
}


def measured_path(name: str = MEASURED_NAME) -> Path:
    """Where `save_measured` keeps a measured entry of this machine."""
    return cache_dir() / "hardware" / f"{name.replace('-', '_')}.json"


def save_measured(peak_flops_by_dtype: dict[str, float], bandwidth: float, *, name: str = MEASURED_NAME,
                  source: str = "measured by spirelib.measure.calibrate") -> Path:
    """Store this machine's measured matmul peaks (FLOP/s per dtype) and memory bandwidth (bytes/s)
    as the hardware table's entry `name` (default: "this-machine", `MEASURED_NAME`)."""
    entry = Hardware(name, {k: float(v) for k, v in peak_flops_by_dtype.items()}, float(bandwidth), source)
    path = measured_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"name": entry.name, "peak_flops": entry.peak_flops, "bandwidth": entry.bandwidth,
              "source": entry.source, "measured_at": datetime.now(UTC).isoformat(timespec="seconds")}
    return write_atomically(path, lambda tmp: tmp.write_text(json.dumps(record, indent=2)))


def measured_hardware(name: str = MEASURED_NAME) -> Hardware | None:
    """The saved entry `name` ("this machine", calibrated), or None when none has been saved."""
    path = measured_path(name)
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        return Hardware(name, dict(record["peak_flops"]), record["bandwidth"],
                        f"{record.get('source', 'measured')} at {record.get('measured_at', '?')}")
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path} is not a valid hardware measurement ({err}); delete it and rerun "
                         "the calibration (spirelib.measure.calibrate) to measure this machine again") from err


def hardware_table() -> dict[str, Hardware]:
    """Every named device, plus "this-machine" (calibrated, `measure.calibrate`) when it has been
    saved. (The profiled cost model pins the same calibrated rates: it adds no entry of its own.)"""
    table = dict(HARDWARE)
    measured = measured_hardware(MEASURED_NAME)
    if measured is not None:
        table[MEASURED_NAME] = measured
    return table


def operating_points(dtypes=("fp8", "bf16", "fp32"), per_device: int = 2,
                     table: dict[str, Hardware] | None = None) -> list[tuple[str, float, int]]:
    """("device dtype", HOI, bytes per value) for the first `per_device` of `dtypes` (in that
    order) that each device of `table` (default: `hardware_table()`) has: the hardware rows the
    throughput model is evaluated on (method §2: HOI and the bytes per value are all it needs)."""
    points = []
    for name, device in (table if table is not None else hardware_table()).items():
        for dtype in [d for d in dtypes if d in device.peak_flops][:per_device]:
            points.append((f"{name} {dtype}", device.hoi(dtype), BYTES_PER_VALUE[dtype]))
    return points
