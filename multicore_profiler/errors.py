"""Typed errors: every failure a user can cause names what is wrong and where."""

from __future__ import annotations


class ProfileError(Exception):
    """Base of every error multicore_profiler raises on bad input or state."""


class ArgumentError(ProfileError, ValueError):
    """An argument outside the range it can take (a rank past 32 bits, a NaN age, a frequency
    of 1e-320 MHz): the message names the argument, its value and the range."""


class LayoutError(ProfileError):
    """A buffer layout or capacity plan that the ABI does not allow."""


class DecodeError(ProfileError):
    """A device profile buffer that does not match its planned layout."""


class BufferSizeError(DecodeError):
    """The buffer's byte size is not the size of its planned layout."""


class FrequencyError(DecodeError):
    """A cycle frequency that is not a positive finite number."""


class SlotError(DecodeError):
    """A slot whose header or records contradict the planned layout.

    ``buffer`` is the buffer's index in a decoded batch, ``slot`` the slot's index in
    the buffer, ``field`` the header or record field that is wrong (``None`` where the
    whole slot is).
    """

    def __init__(self, message: str, *, slot: int, field: str | None, buffer: int = 0) -> None:
        super().__init__(message)
        self.buffer = buffer
        self.slot = slot
        self.field = field


class RecordError(SlotError):
    """A record inside a slot that cannot be a real measurement."""

    def __init__(
        self, message: str, *, slot: int, field: str, record: int, buffer: int = 0
    ) -> None:
        super().__init__(message, slot=slot, field=field, buffer=buffer)
        self.record = record


class GenerationError(SlotError):
    """A slot that the ABI generation its layout names cannot have written: a capacity above
    generation a's 256 records. ``slot`` and ``field`` name it, as for ``SlotError``."""


class EmptyBufferError(DecodeError):
    """A buffer in which no slot holds a single record."""


class StoreError(ProfileError):
    """A store that cannot be opened, written or compacted as asked."""


class IntegrityError(StoreError):
    """A store file that fails a check: a page checksum, its schema, or counts that disagree
    with the rows it holds. The message names the file."""


class QueryError(StoreError):
    """SQL that the store cannot run; the message carries DuckDB's reason."""


class StatementError(QueryError, ValueError):
    """SQL that the read-only policy refuses before it runs: more than one statement, a
    statement that writes or changes settings (named by its type), or a condition that is
    not one expression."""


class ExportError(ProfileError):
    """A trace that cannot be exported as asked: an empty selection, a query without the
    record columns, an invocation with no usable frequency, a path that cannot be written."""


class TraceFormatError(ProfileError):
    """A trace file that is not a Chrome trace the store can hold: not JSON of the Trace
    Event Format, truncated, or with a field that cannot be read exactly (the message
    names the file and the byte or event)."""


class FuseError(ProfileError):
    """A fusion that cannot be done safely as asked: no or too few outer kernels to align
    to, host-only candidates without ``allow_host_alignment``, ranks that cannot be
    paired, or an output that cannot be written."""


class AnalysisError(ProfileError):
    """An analysis that cannot answer as asked: a what-if change naming no stage, core type,
    owner or task of the selection, a replay whose dependencies form a cycle or that cannot
    reproduce the observed makespan closely enough to predict (the message names the
    invocation), or a selection without the records or task graph the analysis needs."""


class RulesError(ProfileError, ValueError):
    """Kernel-view rules that cannot be applied: a family pattern or step pattern that is
    not a valid regular expression, a layer sequence or segment kind naming no family of
    the rules, or a rules file that cannot be read (the message names the file and entry)."""


class SelectorError(ProfileError, ValueError):
    """A run selector that cannot be read (an unknown key, a bad time or count) or that
    selects no run of the store."""


class ScheduleError(ProfileError, ValueError):
    """Profiler schedule arguments that cannot describe a schedule."""


class ConfigError(ProfileError, ValueError):
    """A kernel configuration that cannot run: a bad task graph (core type, event, count),
    a bad kernel argument, or config bytes a kernel cannot read."""


class SpecError(ProfileError):
    """A kernel's profile spec that cannot be applied: a bad stage or a task matching two."""


class SessionError(ProfileError):
    """The capture API used out of order: a nested session, ``step()`` outside one, a call
    prepared in one session and completed in another."""


class CaptureError(ProfileError):
    """Captured buffers that could not be drained or written to the store."""


class BackendError(ProfileError):
    """A device backend that cannot serve: its library or device is missing."""


class ImportFormatError(ProfileError):
    """Another profiler's file that cannot be imported as the format it was named: a
    truncated file, a header that contradicts its data, a record that cannot be real, or a
    file of another format. The message names the file and where in it."""


class DroppedRecordsWarning(UserWarning):
    """The device dropped records because a slot was full; the rest are kept."""


class ClockAnchorWarning(UserWarning):
    """An imported core's records do not fit between its anchors at the frequency used (its
    clock runs faster than that), or cores sharing a counter disagree on its offset: the
    core's offset interval is empty and its offset is the anchor's lower bound."""


class ClockError(ProfileError):
    """Records whose clocks cannot be reconciled: causal edges that contradict each other
    around a cycle no per-core offset can fix (the message names the invocation and the
    edges), or a correction that would move a core's records before cycle 0."""
