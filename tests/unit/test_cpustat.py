"""CpuSampler and CpuTally: busy and steal fractions from /proc/stat's aggregate line."""
import pytest

from testbed.cpustat import CpuSampler, CpuTally, read_cpu_times


def test_fractions_come_from_the_ticks_between_the_two_reads():
    # user nice system idle iowait irq softirq steal
    reads = iter([[100, 0, 50, 800, 10, 0, 5, 20],
                  [160, 0, 70, 880, 10, 0, 10, 50]])   # +60 +20 +80 idle +5 +30 steal: 195
    s = CpuSampler(read=lambda: next(reads))
    s.sample()
    assert s.busy_fraction() == round(1 - 80 / 195, 3)
    assert s.steal_fraction() == round(30 / 195, 3)


def test_no_ticks_and_no_steal_column_read_as_zero():
    s = CpuSampler(read=lambda: [1, 2, 3, 4])   # a kernel without a steal column
    s.sample()
    assert s.busy_fraction() == 0.0 and s.steal_fraction() == 0.0


def test_this_machine_has_the_aggregate_line():
    assert len(read_cpu_times()) >= 8


def test_a_tally_counts_its_own_intervals_and_not_the_time_between():
    reads = iter([[100, 0, 0, 100, 0, 0, 0, 0], [150, 0, 0, 150, 0, 0, 0, 0],   # 50 busy, 50 idle
                  [150, 0, 0, 950, 0, 0, 0, 0],                                 # (another row's)
                  [150, 0, 0, 950, 0, 0, 0, 0], [250, 0, 0, 950, 0, 0, 0, 100]])  # 100 busy, 100 steal
    t = CpuTally(read=lambda: next(reads))
    t.start()
    t.stop()
    next(reads)   # the 800 idle ticks between the intervals belong to no interval
    t.start()
    t.stop()
    assert t.busy_fraction() == round(1 - 50 / 300, 3)
    assert t.steal_fraction() == round(100 / 300, 3)


def test_a_tally_without_an_interval_reads_zero_and_refuses_a_stop_without_a_start():
    t = CpuTally(read=lambda: [1, 2, 3, 4, 5, 6, 7, 8])
    assert t.busy_fraction() == 0.0 and t.steal_fraction() == 0.0
    with pytest.raises(RuntimeError, match="without start"):
        t.stop()
