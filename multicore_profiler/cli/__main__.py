"""``python -m multicore_profiler.cli``: the ``mcprof`` command."""

import sys

from multicore_profiler.cli import command

sys.exit(command())
