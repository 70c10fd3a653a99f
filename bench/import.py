"""Import benchmark: other profilers' files into the store, against a plain decode.

1. Per format, a synthetic file of ``--records`` records written by the format's packer in
   ``tests/`` (the layout the producer writes): ``import_profile`` into a fresh store (read,
   pair, check, write Parquet, commit), and the reader alone (the same, to Arrow record
   chunks, no store), in units of the file per second, against the packer's plain numpy
   decode of the same file (read the words, extract the fields; no pairing, no checks, no
   store). Goal: >= 0.5 of the plain decode's rate.
2. FlashInfer: the same buffer turned into a Perfetto trace by the producer's own writer
   (tg4perfetto, one Python call per event, as FlashInfer's ``export_to_perfetto_trace``
   does), run by ``--tg4perfetto-python`` (an interpreter with tg4perfetto installed; it
   needs protoc to build, so it is not a dependency of this project).
3. Memory: the import's peak RSS in a fresh process, against the same process's RSS before
   the import and the file's size (the records stream: memory follows a chunk, not the file).
4. What aligning per-core clocks costs mcprof's own records (which have none to align):
   ``core_breakdown`` and ``records_ns`` of a run of ``--own-records`` records as the store
   serves them (through ``aligned_raw_records``) to a cursor scoped to the run (as the
   commands read) and to a query over the whole store, against the same views with that
   view replaced by ``raw_records``, in the same cursor.

Medians of ``--repeat`` interleaved repeats, with their spread [min-max].

    .venv/bin/python bench/import.py [--records 2000000] [--repeat 5]
        [--tg4perfetto-python /tmp/tgv/bin/python]
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from export import fill, ratios, spread, timed

from multicore_profiler import open_store
from multicore_profiler.ingest.imports import ImportOptions, import_profile, read_profiles

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

FORMATS = {
    # what: (format, packer module, file suffix, records scale: text files are slow to write)
    "proton buffer": ("proton", "proton_packer", ".bin", 1.0),
    "flashinfer buffer": ("flashinfer", "tagged_packer", ".npy", 1.0),
    "flashinfer trace": ("flashinfer", "tg4perfetto_packer", ".perfetto-trace", 0.1),
    "hazy mkprof": ("hazy", "hazy_packer", ".mkprof", 1.0),
    "simpler json": ("simpler", "simpler_packer", ".json", 0.1),
}
GOAL = 0.5
ALIGNED_SQL = (
    Path(__file__).resolve().parent.parent
    / "multicore_profiler/analysis/sql/records/aligned_records.sql"
)
QUERIES = {
    "core_breakdown": "SELECT sum(compute_ns), count(*) FROM core_breakdown",
    "records_ns": "SELECT sum(dur_ns), max(ts_ns) FROM records_ns",
}

_RSS = """
import re, sys, tempfile
from multicore_profiler import open_store
from multicore_profiler.ingest.imports import import_profile
def peak():  # VmHWM: this process's own peak (ru_maxrss would carry the parent's over exec)
    with open("/proc/self/status") as status:
        return int(re.search(r"VmHWM:\\s+(\\d+) kB", status.read()).group(1))
before = peak()
with tempfile.TemporaryDirectory() as scratch:
    import_profile(open_store(scratch), [sys.argv[1]], format=sys.argv[2])
print(before, peak())
"""

_TG4PERFETTO = """
import sys, time, numpy as np
from tg4perfetto import TraceGenerator
words = np.load(sys.argv[1], mmap_mode="r")
began = time.perf_counter()
nblocks, ngroups = int(words[0] & 0xFFFFFFFF), int(words[0] >> 32)
trace = TraceGenerator(sys.argv[2])
tracks = {}
events = 0
for entry in words[1:].tolist():  # FlashInfer's writer walks the tensor entry by entry
    if entry == 0:
        continue
    tag, timestamp = entry & 0xFFFFFFFF, entry >> 32
    kind, event, block, sm = tag & 3, (tag >> 2) & 0x3FF, (tag >> 12) & 0xFFF, tag >> 24
    key = (sm, block)
    if key not in tracks:
        process = trace.create_group(f"SM_{sm:03d}")
        tracks[key] = process.create_track(f"blk{block}")
    if kind == 0:
        tracks[key].open(timestamp, f"event_{event}")
    elif kind == 1:
        tracks[key].close(timestamp)
    else:
        tracks[key].instant(timestamp, f"event_{event}")
    events += 1
trace.flush()
print(events, time.perf_counter() - began)
"""


def read_once(path: Path, format_name: str) -> int:
    """Read ``path``'s launches to Arrow record chunks, as an import does, without a store;
    return the record count."""
    records = 0
    for launch in read_profiles([path], ImportOptions(format=format_name)):
        records += sum(chunk.num_rows for chunk in launch.records)
    return records


def import_once(path: Path, format_name: str) -> int:
    """Import ``path`` into a fresh store; return its record count."""
    with tempfile.TemporaryDirectory() as scratch, open_store(scratch) as store:
        return import_profile(store, [path], format=format_name).records


def formats(root: Path, records: int, repeat: int) -> None:
    print(f"1. import vs a plain numpy decode of the same file (goal >= {GOAL}), units per second")
    print(
        "file                 units  import (to the store)      reader (to Arrow)          "
        "plain numpy decode         reader/plain        import/plain"
    )
    for what, (format_name, module, suffix, scale) in FORMATS.items():
        packer = importlib.import_module(module)
        path = root / f"{what.replace(' ', '-')}{suffix}"
        count = packer.write_synthetic(path, int(records * scale))
        ours, reader, plain = timed(
            [
                lambda p=path, f=format_name: import_once(p, f),
                lambda p=path, f=format_name: read_once(p, f),
                lambda p=path, m=packer: m.numpy_decode(p),
            ],
            repeat,
        )
        assert reader.result == ours.result, (what, reader.result, ours.result)
        # Rates per unit of the file as its packer counts them (a Proton or HazyResearch
        # record, a FlashInfer slot: half a span, a simpler row), for all three alike.
        rates = {
            name: [count / s for s in timed_.seconds]
            for name, timed_ in (("import", ours), ("reader", reader), ("plain", plain))
        }
        print(
            f"{what:<18} {count:>8}  "
            + "  ".join(f"{spread([r / 1e6 for r in rates[n]], ' M/s'):<25}" for n in rates)
            + f"  {spread(ratios(rates['reader'], rates['plain']), 'x', 2):<18}"
            + f"  {spread(ratios(rates['import'], rates['plain']), 'x', 2)}"
        )
        print(f"{'':<18} {ours.result} records imported")
        rss(path, format_name)


def rss(path: Path, name: str) -> None:
    """The import's peak RSS in a fresh process, against its start and the file's size."""
    done = subprocess.run(
        [sys.executable, "-c", _RSS, str(path), name], capture_output=True, text=True, check=True
    )
    before, after = (int(v) / 1024 for v in done.stdout.split())
    print(
        f"{'':<18} peak RSS {after:.0f} MiB (started at {before:.0f} MiB) for a "
        f"{path.stat().st_size / 2**20:.0f} MiB file"
    )


def producer_writer(root: Path, python: str | None, repeat: int) -> None:
    print("\n2. FlashInfer: the producer's own Perfetto writer (tg4perfetto) on the same buffer")
    path = root / "flashinfer-buffer.npy"
    if python is None:
        print("   not measured: give --tg4perfetto-python (an interpreter with tg4perfetto)")
        return
    theirs = []
    for _ in range(repeat):
        done = subprocess.run(
            [python, "-c", _TG4PERFETTO, str(path), str(root / "theirs.perfetto-trace")],
            capture_output=True,
            text=True,
            check=True,
        )
        events, seconds = done.stdout.split()
        theirs.append(int(events) / float(seconds))
    imported = timed([lambda: import_once(path, "flashinfer")], repeat)[0]
    ours = [imported.result / s for s in imported.seconds]
    events = [2 * r for r in ours]  # a record is a begin and an end event of the buffer
    print(
        f"   tg4perfetto {spread([r / 1e6 for r in theirs], ' M events/s')}, "
        f"ours {spread([r / 1e6 for r in events], ' M events/s')}: "
        f"{spread(ratios(events, theirs), 'x', 1)} (not interleaved: theirs runs in another "
        "interpreter)"
    )


def alignment(root: Path, records: int, repeat: int) -> None:
    print("\n4. aligning per-core clocks, on mcprof's own records (nothing to align)")
    aligned = ALIGNED_SQL.read_text()
    flag = "CREATE OR REPLACE TEMP MACRO _clock_offsets_present() AS {}"
    variants = {
        # what a command reads through: a cursor scoped to its runs, which knows none is
        # anchored; a query over the whole store, which always joins; no alignment at all
        "scoped": aligned + flag.format("false"),
        "whole store": aligned + flag.format("true"),
        "unaligned": "CREATE OR REPLACE VIEW aligned_raw_records AS SELECT * FROM raw_records",
    }
    with open_store(root / "own") as store:
        run_id, count = fill(store, records)
        modules = ("records.core_breakdown", "records.records_ns")
        with store.reading(modules=modules, runs=[run_id]) as con:
            for name, sql in QUERIES.items():
                seconds: dict[str, list[float]] = {v: [] for v in variants}
                results = set()
                for _ in range(repeat + 1):  # the first round warms the caches
                    for variant, views in variants.items():
                        con.execute(views)
                        began = time.perf_counter()
                        results.add(tuple(con.execute(sql).fetchall()))
                        seconds[variant].append(time.perf_counter() - began)
                assert len(results) == 1, results
                timed_ = {v: s[1:] for v, s in seconds.items()}
                print(
                    f"   {name} ({count} records): scoped {spread(timed_['scoped'], ' s')}, "
                    f"whole store {spread(timed_['whole store'], ' s')}, "
                    f"unaligned {spread(timed_['unaligned'], ' s')}; ratios to unaligned: "
                    f"scoped {spread(ratios(timed_['scoped'], timed_['unaligned']), 'x', 2)}, "
                    f"whole store "
                    f"{spread(ratios(timed_['whole store'], timed_['unaligned']), 'x', 2)}"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--own-records", type=int, default=5_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--tg4perfetto-python")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        formats(root, args.records, args.repeat)
        producer_writer(root, args.tg4perfetto_python, args.repeat)
        alignment(root, args.own_records, args.repeat)
    print(json.dumps({"records": args.records, "repeat": args.repeat}))


if __name__ == "__main__":
    main()
