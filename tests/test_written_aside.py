"""Files written aside and renamed into place (``export.files``): what each pass of a writer
leaves in the hidden file, plain or gzipped."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from multicore_profiler.errors import ExportError
from multicore_profiler.export.files import aside_sink, written_aside


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_a_second_pass_replaces_all_the_first_one_wrote(tmp_path: Path, gz: bool) -> None:
    """A writer whose first pass found sub-tracks writes the file again from its start (see
    ``chrome_trace._write``): nothing of the longer first pass may remain after it."""
    path = tmp_path / ("trace.json.gz" if gz else "trace.json")
    path.write_bytes(b"an older trace")
    with written_aside(path, ExportError, "the trace") as aside:
        assert aside.read_bytes() == b""
        with aside_sink(aside, gz) as sink:
            sink.write(b'{"traceEvents": [1, 2, 3, 4, 5, 6]}')
        with aside_sink(aside, gz) as sink:
            sink.write(b'{"traceEvents": []}')
        assert path.read_bytes() == b"an older trace"
    written = gzip.decompress(path.read_bytes()) if gz else path.read_bytes()
    assert written == b'{"traceEvents": []}'
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
