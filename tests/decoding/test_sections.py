"""A generation's sections timed (spirelib.decoding.sections): on the CPU each section's wall time
adds up under its name; `no_timer` times nothing. (On a GPU, CUDA events and one wait at the end:
tests/system/test_hot_loops.py.)"""

import time

from spirelib.decoding.sections import SectionTimer, no_timer


def test_each_sections_time_adds_up_under_its_name():
    timer = SectionTimer()
    for _ in range(3):
        with timer("draft"):
            time.sleep(0.01)
    with timer("verify"):
        pass
    seconds = timer.seconds
    assert set(seconds) == {"draft", "verify"} and seconds["draft"] >= 0.03 > seconds["verify"]
    assert timer.finished_seconds() == seconds  # the CPU's are final when read
    with no_timer("draft"):
        pass
    assert timer.seconds == seconds
