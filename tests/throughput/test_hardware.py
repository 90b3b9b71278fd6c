"""The hardware table and the measured-machine entry."""

import json

import pytest

from spirelib.throughput import hardware
from spirelib.throughput.hardware import (
    BYTES_PER_VALUE,
    HARDWARE,
    Hardware,
    Machine,
    hardware_table,
    measured_hardware,
    operating_points,
    save_measured,
)


def test_h100_dense_fp8_gives_the_papers_hoi_to_its_rounding():
    hoi = HARDWARE["h100-sxm"].hoi("fp8")
    assert hoi == pytest.approx(1979 / 3.35)
    assert round(hoi, -2) == 600  # the paper quotes 600


def test_narrower_dtypes_are_never_slower_on_any_device():
    for device in HARDWARE.values():
        by_width = sorted(device.peak_flops, key=lambda d: BYTES_PER_VALUE[d])
        peaks = [device.peak_flops[d] for d in by_width]
        assert peaks == sorted(peaks, reverse=True), device.name
        assert 1 < device.hoi(by_width[-1]) <= device.hoi(by_width[0]) < 2000, device.name
    assert HARDWARE["h200"].hoi("fp8") < HARDWARE["h100-sxm"].hoi("fp8")  # same math, more bandwidth


def test_unknown_dtype_and_device_are_refused():
    with pytest.raises(ValueError, match="fp8"):
        HARDWARE["a100-sxm"].hoi("fp8")


def test_entries_validate():
    with pytest.raises(ValueError, match="bandwidth"):
        Hardware("x", {"fp32": 1e12}, 0.0, "test")
    with pytest.raises(ValueError, match="fp4"):
        Hardware("x", {"fp4": 1e12}, 1e12, "test")



def test_a_machine_is_one_device_at_one_dtype_and_refuses_what_is_not_a_rate():
    h100 = HARDWARE["h100-sxm"]
    machine = Machine(h100.peak_flops["fp8"], h100.bandwidth, BYTES_PER_VALUE["fp8"])
    assert machine.hoi == h100.hoi("fp8")
    for bad in ((0.0, 1e12, 4), (1e12, float("inf"), 4), (1e12, 1e12, -2)):
        with pytest.raises(ValueError, match="must be a positive number"):
            Machine(*bad)

def test_measured_entry_round_trips_through_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPIRE_CACHE_DIR", str(tmp_path))
    assert measured_hardware() is None
    assert "this-machine" not in hardware_table()
    path = save_measured({"fp32": 2.4e11}, 1.5e10)
    assert path == tmp_path / "hardware" / "this_machine.json"
    entry = measured_hardware()
    assert entry.hoi("fp32") == pytest.approx(16.0)
    assert hardware_table()["this-machine"] == entry


def test_a_corrupt_measurement_is_refused_with_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("SPIRE_CACHE_DIR", str(tmp_path))
    path = hardware.measured_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"peak_flops": {"fp32": -1}, "bandwidth": 1e10}))
    with pytest.raises(ValueError, match="rerun"):
        measured_hardware()


def test_save_measured_refuses_nonsense(tmp_path, monkeypatch):
    monkeypatch.setenv("SPIRE_CACHE_DIR", str(tmp_path))
    with pytest.raises(ValueError):
        save_measured({"fp32": float("nan")}, 1e10)
    assert not hardware.measured_path().exists()


def test_operating_points_take_each_devices_first_dtypes_in_order():
    points = operating_points(("fp8", "bf16"), per_device=1, table=HARDWARE)
    assert ("h100-sxm fp8", HARDWARE["h100-sxm"].hoi("fp8"), 1) in points
    assert ("a100-sxm bf16", HARDWARE["a100-sxm"].hoi("bf16"), 2) in points  # no fp8 on an A100
    assert len(points) == len(HARDWARE)
    both = operating_points(("fp8", "bf16", "fp32"), per_device=2, table=HARDWARE)
    assert [p[0] for p in both if p[0].startswith("h100-sxm ")] == ["h100-sxm fp8", "h100-sxm bf16"]


def test_the_calibrated_entry_joins_the_table_and_no_other(tmp_path, monkeypatch):
    monkeypatch.setenv("SPIRE_CACHE_DIR", str(tmp_path))
    save_measured({"fp32": 2.4e11}, 1.5e10)
    save_measured({"fp32": 6e10}, 5e9, name="somewhere-else")
    table = hardware_table()
    assert table["this-machine"].hoi("fp32") == pytest.approx(16.0)
    assert set(table) == {*HARDWARE, "this-machine"}
    assert hardware.measured_path() == tmp_path / "hardware" / "this_machine.json"
