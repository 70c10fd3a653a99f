"""Progress bars: tqdm's on a terminal, nothing (and no tqdm import) anywhere else."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

from multicore_profiler.progress import Quiet, progress

ROOT = Path(__file__).resolve().parent.parent
BAR = (
    "import sys\n"
    "from multicore_profiler.progress import progress\n"
    "with progress(total=3, desc='checking', unit='file') as bar:\n"
    "    bar.update(2)\n"
    "    bar.total += 2\n"
    "    bar.refresh()\n"
    "    bar.update(3)\n"
    "items = list(progress(range(4), desc='runs', unit='run'))\n"
    "print(items, 'tqdm' in sys.modules)\n"
)
"""A bar updated by hand (its total grown on the way, as the JSON writer's is when it
learns its arrows) and one over an iterable, in a fresh process."""


def test_off_a_terminal_the_bar_draws_nothing_and_passes_the_items_through(capsys):
    with progress(total=3, desc="checking") as bar:
        assert isinstance(bar, Quiet)
        bar.update(2)
        bar.total += 2
        bar.refresh()
        assert bar.total == 5
    assert list(progress(range(4), desc="runs")) == [0, 1, 2, 3]
    assert list(progress(desc="nothing to iterate")) == []
    assert capsys.readouterr() == ("", "")


def test_a_process_off_a_terminal_never_imports_tqdm():
    done = subprocess.run(
        [sys.executable, "-c", BAR], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert (done.stdout, done.stderr) == ("[0, 1, 2, 3] False\n", "")


def test_on_a_terminal_tqdm_draws_the_bars():
    leader, follower = pty.openpty()
    # tqdm sizes its bar to the terminal: 24 rows of 100 columns (termios.tcsetwinsize does
    # this from Python 3.11 on; the project supports 3.10)
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    try:
        done = subprocess.run(
            [sys.executable, "-c", BAR],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=follower,
            text=True,
            check=True,
        )
        os.close(follower)
        follower = -1
        drawn = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the terminal's other side is closed and read out
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    assert done.stdout == "[0, 1, 2, 3] True\n"
    lines = drawn.decode().split("\r\n")  # each bar redrawn after a \r, ended by a newline
    final = [line.rsplit("\r", 1)[-1] for line in lines if line]
    assert [line.split("|")[0] + line.split("|")[2].split("[")[0] for line in final] == [
        "checking: 100% 5/5 ",
        "runs: 100% 4/4 ",
    ]
