"""A run directory's JSON lines are read totally: a hostile line is skipped and said, never a traceback."""
import pytest

from testbed.analysis import raw

pytestmark = pytest.mark.unit


def test_a_deeply_nested_or_oversized_line_is_skipped_and_the_rest_read(tmp_path, monkeypatch):
    monkeypatch.setattr(raw, "MAX_LINE", 4096)
    log = tmp_path / "raw" / "arm" / "seed-1" / "events.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text("[" * 1_900 + "]" * 1_900 + "\n"       # past the parser's recursion limit
                   + '{"event": "x", "pad": "' + "a" * 10_000 + '"}\n'   # over MAX_LINE
                   + '{"event": "no-such-event"}\n')
    problems: list[str] = []
    assert raw._read_jsonl(log, "arm", 1, problems) == []
    assert [p.split(": ", 1)[1] for p in problems] == [
        "not a JSON line, skipped", "a line over 4096 bytes, skipped",
        "unknown event 'no-such-event', skipped"]
    assert [p.split(":")[1] for p in problems] == ["1", "2", "3"]
