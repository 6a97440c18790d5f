"""CpuSampler: busy and steal fractions from /proc/stat's aggregate line."""
from testbed.cpustat import CpuSampler, read_cpu_times


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
