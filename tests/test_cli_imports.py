"""What a fresh process imports: the command line imports only what its command uses, and
the first store still finds every SQL module and method of the rooms above storage."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

HEAVY = (
    "duckdb",
    "numpy",
    "pandas",
    "pyarrow",
    "pyarrow.compute",
    "pyarrow.dataset",
    "torch",
    "tqdm",
    "multicore_profiler.analysis",
    "multicore_profiler.export",
    "multicore_profiler.ingest",
    "multicore_profiler.storage.compact",
    "multicore_profiler.storage.retention",
    "multicore_profiler.storage.store",
)
"""Libraries and rooms that neither ``import multicore_profiler.cli`` nor ``mcprof --help``
may load (each costs tens to hundreds of milliseconds of start-up), and modules that only
the store's maintenance uses (``compact``, ``gc``). A process off a terminal never imports
tqdm (see ``progress``)."""

STORE_COMMAND_MODULES = [
    "duckdb",
    "multicore_profiler.analysis",
    "multicore_profiler.storage.store",
    "numpy",
    "pyarrow",
]
"""What of ``HEAVY`` a command that reads the store loads: no pandas, no exporters."""


def loaded_after(code: str) -> dict:
    """What a fresh interpreter reports as JSON after running ``code`` (``modules``: the
    ``HEAVY`` modules it loaded; any other keys the code adds to ``report``)."""
    script = (
        "import contextlib, io, json, sys\n"
        "from pathlib import Path\n"
        "report = {}\n"
        f"{code}\n"
        f"report['modules'] = sorted(m for m in {HEAVY!r} if m in sys.modules)\n"
        "print(json.dumps(report))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.splitlines()[-1])


def buffer_command(folder: Path, command: str) -> list[str]:
    """The arguments of ``command`` (``ingest-buffer``, ``trace-buffer``) for a buffer of
    one record, written to ``folder``, with its layout."""
    from golden import AIC, TASK7, Slot, pack

    buffer = folder / "dump.bin"
    buffer.write_bytes(pack(1, 1, 16, 16, [Slot(AIC, 0, 100, TASK7)]))
    layout = ["--aic-slots", "1", "--aiv-slots", "1", "--aic-capacity", "16", "--aiv-capacity"]
    return [command, str(buffer), *layout, "16", "--freq-mhz", "50"]


def test_importing_the_cli_loads_no_library_or_room():
    assert loaded_after("import multicore_profiler.cli") == {"modules": []}


def test_help_loads_no_library_or_room_and_lists_every_command():
    report = loaded_after(
        "from multicore_profiler.cli import main\n"
        "listing = io.StringIO()\n"
        "with contextlib.redirect_stdout(listing):\n"
        "    try:\n"
        "        main(['--help'])\n"
        "    except SystemExit as exc:\n"
        "        report['status'] = exc.code\n"
        "report['commands'] = [line.split()[0] for line in listing.getvalue().splitlines()\n"
        "    if line.startswith('    ') and not line.startswith('     ')]"
    )
    assert report == {
        "status": 0,
        "commands": [
            "runs",
            "query",
            "compare",
            "report",
            "analyze",
            "ranks",
            "kernels",
            "ingest-buffer",
            "ingest-trace",
            "import",
            "check",
            "compact",
            "gc",
            "export",
            "trace-buffer",
            "fuse",
            "demo",
        ],
        "modules": [],
    }


def test_runs_loads_neither_pandas_nor_pyarrow_dataset(tmp_path, capsys):
    """Listing the runs of a store checks its few new files as ``ParquetFile`` s (every
    page against its checksum), records them as checked and converts no Python value with
    pyarrow, which would import pandas. Saving that record takes ``pyarrow.compute``; the
    next listing, which trusts the record, loads it no more."""
    from multicore_profiler.cli import main

    store = str(tmp_path / "store")
    assert main([*buffer_command(tmp_path, "ingest-buffer"), "--store", store]) == 0
    listing = (
        "from multicore_profiler.cli import main\n"
        "from multicore_profiler.storage import verified\n"
        "verified.RACY_NS = -1  # the files just written count as old enough to record\n"
        "listing = io.StringIO()\n"
        "with contextlib.redirect_stdout(listing):\n"
        f"    report['status'] = main(['runs', '--store', {store!r}])\n"
        "report['rows'] = sum('complete' in line for line in listing.getvalue().splitlines())\n"
        f"report['recorded'] = len(verified.VerifiedRecord(Path({store!r}))._read())"
    )
    first = {"status": 0, "rows": 1, "recorded": 4}
    assert loaded_after(listing) == {
        **first,
        "modules": sorted([*STORE_COMMAND_MODULES, "pyarrow.compute"]),
    }
    assert loaded_after(listing) == {**first, "modules": STORE_COMMAND_MODULES}


def test_importing_the_package_loads_nothing_until_a_name_is_used():
    report = loaded_after(
        "import multicore_profiler\n"
        "report['before'] = sorted(m for m in sys.modules if m.startswith('multicore_profiler.'))\n"
        "multicore_profiler.ProfileError\n"
        "report['after'] = sorted(m for m in sys.modules if m.startswith('multicore_profiler.'))"
    )
    assert report == {
        "before": ["multicore_profiler.extension"],
        "after": ["multicore_profiler.errors", "multicore_profiler.extension"],
        "modules": [],
    }


def test_the_synthetic_kernel_and_the_specs_load_no_torch_until_a_backend_is_named():
    """The kernels package imports its names on first use: a process that simulates
    launches (the scale tests' writer processes) or writes specs pays no torch."""
    report = loaded_after(
        "from multicore_profiler.kernels.synthetic import SimulatedMoeKernel\n"
        "from multicore_profiler.kernels import ProfileSpec\n"
        f"report['before'] = sorted(m for m in {HEAVY!r} if m in sys.modules)\n"
        "from multicore_profiler.kernels import CpuBackend\n"
        "report['backend'] = CpuBackend.__module__"
    )
    assert report["before"] == ["numpy", "pyarrow"]
    assert report["backend"] == "multicore_profiler.kernels.backend"
    assert "torch" in report["modules"]


def test_the_first_store_finds_every_sql_module_and_method_of_the_rooms_above(tmp_path):
    """A process that imports only the store module still gets the analysis room's SQL
    modules once it opens a store, and ``Store.compare`` / ``Store.check``, whose modules
    are imported when the methods are first looked up; the export
    handlers wait for the first capture session (they are not a store's); opening and querying an
    empty store loads neither pandas nor ``pyarrow.dataset``."""
    report = loaded_after(
        "from multicore_profiler.storage.store import open_store\n"
        "from multicore_profiler.storage.sql_modules import REGISTRY\n"
        "report['registered_before'] = len(REGISTRY._modules)\n"
        f"store = open_store({str(tmp_path / 'store')!r}, create=True)\n"
        "report['stages'] = store.sql('SELECT count(*) AS n FROM stage_stats').column(0)"
        ".to_pylist()\n"
        "deferred = [f'multicore_profiler.analysis.{m}' for m in ('compare', 'clock_check')]\n"
        "report['deferred_before'] = [name in sys.modules for name in deferred]\n"
        "report['methods'] = [callable(getattr(store, name)) for name in ('compare', 'check')]\n"
        "report['deferred_after'] = [name in sys.modules for name in deferred]\n"
        "from multicore_profiler.extension import _EXTENDERS\n"
        "report['extenders'] = {name: list(modules) for name, modules in _EXTENDERS.items()}"
    )
    assert report == {
        "registered_before": 0,
        "stages": [0],
        "deferred_before": [False, False],
        "methods": [True, True],
        "deferred_after": [True, True],
        "extenders": {
            "multicore_profiler.storage.store.Store": ["multicore_profiler.analysis"],
            "multicore_profiler.ingest.session.MegaKernelProfile": [
                "multicore_profiler.export.handlers"
            ],
        },
        # Store.check, looked up above, imports the maintenance it reports on: compact,
        # which computes with pyarrow (and draws its progress on a terminal only).
        "modules": sorted(
            [*STORE_COMMAND_MODULES, "multicore_profiler.storage.compact", "pyarrow.compute"]
        ),
    }


def test_the_first_capture_session_finds_its_export_methods():
    report = loaded_after(
        "import multicore_profiler\n"
        "from multicore_profiler.ingest.session import MegaKernelProfile\n"
        "report['before'] = hasattr(MegaKernelProfile, 'export_chrome_trace')\n"
        "multicore_profiler.mega_kernel_profile()\n"
        "report['after'] = [hasattr(MegaKernelProfile, name) for name in "
        "('export_chrome_trace', 'export_trace')]"
    )
    assert {k: report[k] for k in ("before", "after")} == {"before": False, "after": [True, True]}


def pandas_refused_report(code: str) -> dict:
    """``loaded_after(code)``, with ``pandas`` in the report: whether the process could
    import it after ``code`` ran."""
    return loaded_after(
        f"{code}\n"
        "try:\n"
        "    import pandas  # noqa: F401\n"
        "    report['pandas'] = 'imported'\n"
        "except ModuleNotFoundError as exc:\n"
        "    report['pandas'] = str(exc)"
    )


def test_the_command_runs_without_pandas_and_main_leaves_its_process_alone(tmp_path):
    """``mcprof`` (``cli.command``) refuses pandas, which pyarrow would import on its first
    conversion of a value (a fifth of a second, about 40 MB) and mcprof never uses;
    ``main``, which programs and tests call beside their own code, changes nothing."""
    args = buffer_command(tmp_path, "trace-buffer")
    command = pandas_refused_report(
        "from multicore_profiler.cli import command\n"
        f"sys.argv = ['mcprof', *{args!r}, '-o', {str(tmp_path / 'command.json')!r}]\n"
        "report['status'] = command()"
    )
    assert (command["status"], command["pandas"]) == (
        0,
        "No module named 'pandas': mcprof's own processes run without pandas",
    )
    assert "pandas" not in command["modules"]
    library = pandas_refused_report(
        "from multicore_profiler.cli import main\n"
        f"report['status'] = main([*{args!r}, '-o', {str(tmp_path / 'main.json')!r}])"
    )
    assert (library["status"], library["pandas"]) == (0, "imported")


def test_the_demo_runs_in_the_program_that_refuses_pandas(tmp_path):
    """``mcprof demo`` runs torch (and torch.profiler) in the command's process, where
    torch's compiler probes pandas with ``importlib.util.find_spec``: the probe must not
    fail."""
    store = str(tmp_path / "store")
    report = pandas_refused_report(
        "from multicore_profiler.cli import command\n"
        f"sys.argv = ['mcprof', 'demo', '--steps', '3', '--launches', '1', '--store', {store!r}]\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    report['status'] = command()"
    )
    assert (report["status"], report["pandas"]) == (
        0,
        "No module named 'pandas': mcprof's own processes run without pandas",
    )


def mapped_pandas(pid: int) -> list[str]:
    """The files of pandas that process ``pid`` has mapped (its extension modules)."""
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return sorted({line.split()[-1] for line in maps if "/pandas/" in line})


def test_the_writer_and_trace_workers_run_without_pandas():
    """The children a capture session or the trace reader starts refuse pandas too; each
    is looked at once it has said it is ready, after its warm-up's first conversions."""
    from multicore_profiler.ingest.child_process import start_child
    from multicore_profiler.ingest.writer import WriterProcess

    writer = WriterProcess.start()
    try:
        assert mapped_pandas(writer.process.pid) == []
    finally:
        writer.stop()
    worker, ours = start_child("multicore_profiler.ingest.trace_workers:serve")
    try:
        ours.settimeout(60)
        assert ours.recv(1, socket.MSG_PEEK)  # its ready message: the warm-up is done
        assert mapped_pandas(worker.pid) == []
    finally:
        ours.close()
        worker.wait(timeout=60)


def test_buffers_to_a_trace_off_a_terminal_load_neither_tqdm_nor_arrow_datasets(tmp_path):
    """``trace-buffer`` (ingest into a temporary store, then export) in a process whose
    standard error is not a terminal draws no progress bar, so it never imports tqdm, and
    the timeline groups its few invocations in Python, not with Arrow's query engine
    (``pyarrow.acero``, which imports ``pyarrow.dataset``)."""
    args = buffer_command(tmp_path, "trace-buffer")
    report = loaded_after(
        "from multicore_profiler.cli import command\n"
        f"sys.argv = ['mcprof', *{args!r}, '-o', {str(tmp_path / 'trace.json')!r}]\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    report['status'] = command()\n"
        "report['acero'] = 'pyarrow.acero' in sys.modules"
    )
    assert report == {
        "status": 0,
        "acero": False,
        "modules": sorted(
            [
                *STORE_COMMAND_MODULES,
                "multicore_profiler.export",
                "multicore_profiler.ingest",
                "pyarrow.compute",
            ]
        ),
    }
