"""Rules of the outer-kernel views over outer traces: kernel families, steps, layers, segments.

"Outer kernels" are the CUDA / NPU kernels of an outer (torch.profiler / kineto, torch_npu)
trace, not the MegaKernel. ``OuterKernelRules`` holds their rules: an ordered list of
(family, regex on the kernel name), first match wins and anything else is ``rest``; the
regex of the step annotations, whose named groups become step details; the family sequence
of a layer; which families make a compute segment between collectives ``moe``, ``attn``
and so on; and how the last step of a trace ends (``LAST_STEP_RULES``).
``OuterKernelRules.load`` reads them from a TOML file. They are the setting of the SQL
module ``outer_kernel_rules`` (see ``analysis/registry.py``): a store applies them with
``Store.use_kernel_rules`` (``store.configure("outer_kernel_rules", rules)``).

The rules live in the store's DuckDB as tables (``kernel_family_rules``,
``layer_sequence``, ``segment_kind_rules``), the last-step rule is the macro
``last_step_rule()``, and the regexes are compiled into two generated pieces of SQL: the
macro ``kernel_family(name)`` and the view ``step_annotations``;
``OuterKernelRules.install`` creates these and nothing else. The
views over them (``device_ops``, ``kernels``, ``steps``, ...) are the SQL modules of
``analysis/sql/outer_kernels/``. Constant regexes are compiled once by DuckDB; joining
names to a table of pattern strings would compile each pattern again for every row (about
60x slower).
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from multicore_profiler.errors import RulesError
from multicore_profiler.storage.sql_text import sql_string

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

_ASCEND_ELEMENTWISE = (
    "add|adds|addcdiv|addcmul|axpy|mul|muls|sub|div|divs|realdiv|sqrt|rsqrt|exp|log|neg|abs|"
    "maximum|minimum|pow|select|equal|less|greater|zeroslike|oneslike|logicalnot|logicaland|"
    "sin|cos|reciprocal|square|sign|floor|ceil|round|clip|clamp|where"
)

DEFAULT_FAMILIES: tuple[tuple[str, str], ...] = (
    (
        "collective",
        r"(?i)nccl|rccl|hccl|hcom|deep_?ep|all_?reduce|all_?gather|reduce_?scatter|"
        r"all_?to_?all|send_?recv|cross_device_reduce",
    ),
    ("memset", r"(?i)memset"),
    ("moe_topk", r"(?i)top_?k_?gating|topk_?softmax|gating_?top_?k|grouped_?top_?k|moe_?gating"),
    ("moe_router", r"(?i)router|moe_?gate_?(proj|linear|gemm)"),
    (
        "moe_dispatch",
        r"(?i)moe_?(align|sort|permute|unpermute|sum|init_?routing|finalize_?routing|"
        r"token|scatter|gather)|count_and_sort_expert|expert_?(map|count|index)|"
        r"permute_?tokens|unpermute",
    ),
    (
        "moe_expert",
        r"(?i)fused_?moe|moe_?(gemm|mlp|ffn|expert)|experts?_?(gemm|mlp|ffn)|"
        r"grouped_?(gemm|matmul|mm)|m_grouped|cutlass_?moe|fused_?experts",
    ),
    (
        "attention",
        r"(?i)flash|fmha|attention|attn|(^|[^a-z])mla([^a-z]|$)|sdpa",
    ),
    (
        "copy",
        r"(?i)memcpy|copy|transdata|tensormove|transpose|"
        r"(^|_)(concat[a-z]*|slice|stridedslice[a-z]*|identity)(v\d+)?\d*$",
    ),
    ("conv", r"(?i)conv|winograd|fprop|dgrad|wgrad"),
    (
        "gemm",
        r"(?i)gemm|gemv|cutlass|cublas|nvjet|xmma|matmul|^triton_tem_fused_(addmm|bmm|mm)",
    ),
    ("triton", r"(?i)^triton"),
    (
        "reduce",
        r"(?i)reduce|reduction|softmax|norm_|_norm|layernorm|rmsnorm|groupnorm|batchnorm|"
        r"argmax|argmin|cumsum|scan|topk|sort|pool|welford",
    ),
    (
        "elementwise",
        r"(?i)elementwise|pointwise|functor|fill|activation|silu|gelu|relu|act_and_mul|swiglu|"
        rf"sigmoid|tanh|dropout|cast|(^|_)({_ASCEND_ELEMENTWISE})(v\d+)?\d*$",
    ),
)
"""Kernel families in order, first match wins: CUDA/ROCm kernel names (cutlass, cuBLAS,
nvjet, flash attention, NCCL/RCCL, ATen elementwise and reduce kernels, Triton), MoE kernels
(vLLM/SGLang fused MoE, grouped GEMMs, DeepEP) and Ascend op types as torch_npu names its
device tasks (``aclnnMm_MatMulCommon_MatMulV2``, ``hcom_allReduce_``, ``TransData``)."""

REST = "rest"
"""The family of a kernel no rule matches."""

COLLECTIVE = "collective"
"""The family whose kernels are the collectives (views ``collectives`` and ``segments``)."""

STEP_PATTERNS: dict[str, str] = {
    "profiler": r"^ProfilerStep#(?P<step>\d+)$",
    "vllm": (
        r"^execute_context_(?P<context_requests>\d+)\((?P<context_tokens>\d+)\)"
        r"_generation_(?P<generation_requests>\d+)\((?P<generation_tokens>\d+)\)"
    ),
}
"""Step annotation patterns by name: torch.profiler's ``ProfilerStep#N``, and vLLM's
per-step ``execute_context_<requests>(<tokens>)_generation_<requests>(<tokens>)``."""

LAST_STEP_RULES: dict[str, str] = {
    "auto": "own_end in a trace with a single step annotation (a one-step capture), else drop",
    "own_end": "the last step ends at the end of its own last device op",
    "drop": "the last step is left out (no next step ends its period)",
}
"""How the period of a trace's last step (the one no later step follows) ends, by rule
name. A period otherwise ends at the next step's first device activity (``next_step``).
``auto``, the default, gives a one-step capture (torch_npu's documented habit) its step and
keeps the ``drop`` rule of multi-step traces."""

DEFAULT_LAYER_SEQUENCE: tuple[str, ...] = ("moe_router", "moe_topk", "moe_expert", "moe_expert")
"""router -> top-k -> expert gate/up -> expert down: the first expert launch of a layer is
its gate/up projection, the later ones its down projection."""

DEFAULT_SEGMENT_KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("moe", ("moe_*",)),
    ("attn", ("attention",)),
)
"""A segment takes the first kind one of whose family globs matches a family it holds;
else ``compute`` when it holds kernels, ``idle`` when it holds none."""

_FAMILY_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")


def _family_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not _FAMILY_NAME.match(name):
        raise RulesError(
            f"{where}: family name {name!r} must start with a letter and hold only "
            "letters, digits, '_', '.' or '-'"
        )
    return name


@dataclass(frozen=True)
class OuterKernelRules:
    """What the outer-kernel views need to know beyond the trace: see the module's doc.

    ``families``: (family, regex) pairs in order, first match wins (RE2 syntax, searched
    anywhere in the name unless anchored). ``steps``: the regex of step annotations, or a
    name in ``STEP_PATTERNS``; named groups become step details (``step``, ``phase``,
    ``*_tokens``, ``*_requests``). ``layers``: the family sequence of one layer (its first
    family starts a layer and appears once; empty: no layers); by default
    ``DEFAULT_LAYER_SEQUENCE`` where the families define its families. ``segments``: (kind,
    family globs) in order. ``last_step``: how the last step of a trace ends, a name in
    ``LAST_STEP_RULES``.
    """

    families: tuple[tuple[str, str], ...] = DEFAULT_FAMILIES
    steps: str = STEP_PATTERNS["profiler"]
    layers: tuple[str, ...] | None = None
    segments: tuple[tuple[str, tuple[str, ...]], ...] = DEFAULT_SEGMENT_KINDS
    last_step: str = "auto"

    def __post_init__(self) -> None:
        families = tuple((str(f), str(p)) for f, p in self.families)
        for index, (family, _) in enumerate(families):
            _family_name(family, f"family rule {index}")
        object.__setattr__(self, "families", families)
        object.__setattr__(self, "steps", STEP_PATTERNS.get(self.steps, self.steps))
        known = {family for family, _ in families} | {REST}
        if self.layers is None:
            # The default sequence, where the families define it; else no layers.
            defined = set(DEFAULT_LAYER_SEQUENCE) <= known
            object.__setattr__(self, "layers", DEFAULT_LAYER_SEQUENCE if defined else ())
        layers = tuple(self.layers)
        if layers and len(layers) < 2:
            raise RulesError(f"a layer sequence needs at least two families, got {layers!r}")
        unknown = [family for family in layers if family not in known]
        if unknown:
            raise RulesError(
                f"layer sequence {layers!r} names {unknown!r}, which no family rule defines"
            )
        if layers and layers.count(layers[0]) > 1:
            raise RulesError(
                f"layer sequence {layers!r}: its first family {layers[0]!r} starts each layer, "
                "so it cannot appear again in the sequence"
            )
        object.__setattr__(self, "layers", layers)
        segments = tuple((str(kind), tuple(globs)) for kind, globs in self.segments)
        for kind, globs in segments:
            if not globs or not all(isinstance(g, str) and g for g in globs):
                raise RulesError(f"segment kind {kind!r} needs a list of family globs")
        object.__setattr__(self, "segments", segments)
        if self.last_step not in LAST_STEP_RULES:
            raise RulesError(
                f"last_step must be one of {sorted(LAST_STEP_RULES)}, got {self.last_step!r}"
            )
        self._step_groups()

    def _step_groups(self) -> dict[str, int]:
        """The step pattern's named groups and their numbers (as RE2 numbers them too)."""
        try:
            return dict(re.compile(self.steps).groupindex)
        except re.error as exc:
            raise RulesError(
                f"step pattern {self.steps!r} is not a valid regular expression: {exc}"
            ) from exc

    def with_families(self, families: Iterable[tuple[str, str]]) -> OuterKernelRules:
        """These rules with ``families`` matched first, before the current ones."""
        return dataclasses.replace(self, families=(*families, *self.families))

    @classmethod
    def load(cls, path: Path | str) -> OuterKernelRules:
        """Read rules from a TOML file (see ``docs/kernels.md``): ``[[family]]`` tables
        (``name``, ``pattern``) matched before the defaults (unless ``default_families =
        false``), and optional ``steps``, ``layers``, ``last_step`` and ``[[segment]]``
        (``kind``, ``families``)."""
        path = Path(path)
        try:
            document = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise RulesError(f"{path}: cannot read the rules file: {exc.strerror or exc}") from exc
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise RulesError(f"{path}: not a TOML rules file: {exc}") from exc
        return cls.from_mapping(document, where=str(path))

    @classmethod
    def from_mapping(cls, document: Mapping[str, Any], *, where: str = "rules") -> OuterKernelRules:
        """Rules from the parsed form of a rules file (see ``load``)."""
        allowed = {"family", "default_families", "steps", "layers", "segment", "last_step"}
        extra = sorted(set(document) - allowed)
        if extra:
            raise RulesError(
                f"{where}: unknown key(s) {extra}; a rules file holds {sorted(allowed)}"
            )
        families = []
        for index, entry in enumerate(_tables(document, "family", where)):
            spot = f"{where}: [[family]] {index + 1}"
            if set(entry) != {"name", "pattern"} or not isinstance(entry["pattern"], str):
                raise RulesError(f"{spot} needs exactly a name and a pattern string, got {entry}")
            families.append((_family_name(entry["name"], spot), entry["pattern"]))
        keep = document.get("default_families", True)
        if not isinstance(keep, bool):
            raise RulesError(f"{where}: default_families must be true or false, got {keep!r}")
        changes: dict[str, Any] = {"families": (*families, *(DEFAULT_FAMILIES if keep else ()))}
        if "steps" in document:
            if not isinstance(document["steps"], str):
                raise RulesError(f"{where}: steps must be a pattern string")
            changes["steps"] = document["steps"]
        if "last_step" in document:
            if not isinstance(document["last_step"], str):
                raise RulesError(f"{where}: last_step must be a string")
            changes["last_step"] = document["last_step"]
        if "layers" in document:
            layers = document["layers"]
            if not isinstance(layers, list) or not all(isinstance(f, str) for f in layers):
                raise RulesError(f"{where}: layers must be a list of family names")
            changes["layers"] = tuple(layers)
        if "segment" in document:
            segments = []
            for index, entry in enumerate(_tables(document, "segment", where)):
                spot = f"{where}: [[segment]] {index + 1}"
                globs = entry.get("families")
                if set(entry) != {"kind", "families"} or not isinstance(globs, list):
                    raise RulesError(f"{spot} needs a kind and a list of families, got {entry}")
                segments.append((str(entry["kind"]), tuple(globs)))
            changes["segments"] = tuple(segments)
        try:
            return cls(**changes)
        except RulesError as exc:
            raise RulesError(f"{where}: {exc}") from exc

    def check(self, con: duckdb.DuckDBPyConnection) -> None:
        """Raise ``RulesError`` naming the first pattern DuckDB (RE2) cannot compile. Every
        pattern is compiled in one statement (a statement costs about half a millisecond,
        and a store installs the rules on its first outer-kernel query); only where that
        fails, one by one, to name the pattern."""
        patterns = [
            (pattern, f"family rule {index} ({family!r})")
            for index, (family, pattern) in enumerate(self.families)
        ]
        patterns.append((self.steps, "step pattern"))
        compiled = ", ".join(f"regexp_matches('', {sql_string(p)})" for p, _ in patterns)
        try:
            con.execute(f"SELECT {compiled}").fetchall()
        except duckdb.Error as exc:
            for pattern, what in patterns:
                _check_regex(con, pattern, what)
            raise RulesError(f"the rules' patterns cannot be compiled: {exc}") from exc

    def install(self, con: duckdb.DuckDBPyConnection) -> None:
        """Create or replace, on ``con``, the rules tables, the macros ``last_step_rule`` and
        ``kernel_family`` and the view ``step_annotations`` (the modules of
        ``analysis/sql/outer_kernels/`` read them), in one script."""
        self.check(con)
        tables = (
            _table(
                "kernel_family_rules",
                "priority INTEGER, family VARCHAR, pattern VARCHAR",
                [(i, f, p) for i, (f, p) in enumerate(self.families)],
            ),
            _table("layer_sequence", "position INTEGER, family VARCHAR", enumerate(self.layers)),
            _table(
                "segment_kind_rules",
                "priority INTEGER, kind VARCHAR, family_glob VARCHAR",
                [(i, kind, g) for i, (kind, globs) in enumerate(self.segments) for g in globs],
            ),
        )
        con.execute(
            ";\n".join(
                [
                    *tables,
                    f"CREATE OR REPLACE MACRO last_step_rule() AS {sql_string(self.last_step)}",
                    self._family_macro(),
                    self._step_view(),
                ]
            )
        )

    def _family_macro(self) -> str:
        arms = " ".join(
            f"WHEN regexp_matches(name, {sql_string(p)}) THEN {sql_string(f)}"
            for f, p in self.families
        )
        body = f"CASE {arms} ELSE {sql_string(REST)} END" if arms else sql_string(REST)
        return f"CREATE OR REPLACE MACRO kernel_family(name) AS {body}"

    def _step_view(self) -> str:
        groups = self._step_groups()
        pattern = sql_string(self.steps)

        def text(name: str) -> str:
            return f"nullif(regexp_extract(name, {pattern}, {groups[name]}), '')"

        def number(name: str) -> str:
            return f"TRY_CAST({text(name)} AS BIGINT)"

        def total(suffix: str) -> str:
            names = [g for g in groups if g == suffix or g.endswith("_" + suffix)]
            return " + ".join(number(g) for g in names) if names else "NULL::BIGINT"

        if "phase" in groups:
            phase = text("phase")
        elif {"context_requests", "generation_requests"} <= set(groups):
            context, generation = number("context_requests"), number("generation_requests")
            phase = (
                f"CASE WHEN {context} > 0 AND {generation} > 0 THEN 'mixed' "
                f"WHEN {context} > 0 THEN 'prefill' WHEN {generation} > 0 THEN 'decode' END"
            )
        else:
            phase = "NULL::VARCHAR"
        entries = ", ".join(f"{{'key': {sql_string(g)}, 'value': {text(g)}}}" for g in groups)
        details = f"map_from_entries([{entries}])" if entries else "MAP()::MAP(VARCHAR, VARCHAR)"
        step = number("step") if "step" in groups else "NULL::BIGINT"
        return f"""
CREATE OR REPLACE VIEW step_annotations AS
SELECT source_id, rank, event_index, name, pid, tid, ts_ns, coalesce(dur_ns, 0) AS dur_ns,
    {step} AS step_number, {phase} AS phase, {total("tokens")} AS tokens,
    {total("requests")} AS requests, {details} AS details
FROM trace_events
WHERE ph = 'X' AND ts_ns IS NOT NULL AND is_host_event(cat, task_type)
    AND regexp_matches(name, {pattern})"""


KernelRules = OuterKernelRules
"""The former name of ``OuterKernelRules`` (``multicore_profiler.KernelRules``), kept as an
alias: it is the same class."""

RULES_NAMES = (
    "kernel_family_rules",
    "layer_sequence",
    "segment_kind_rules",
    "last_step_rule",
    "kernel_family",
    "step_annotations",
)
"""What ``OuterKernelRules.install`` creates: the rules tables, the macros and the view."""


def check_setting(con: duckdb.DuckDBPyConnection, rules: Any) -> None:
    """Refuse (``RulesError``) a setting of the ``outer_kernel_rules`` module that is not an
    ``OuterKernelRules`` or holds a pattern DuckDB cannot compile."""
    if not isinstance(rules, OuterKernelRules):
        raise RulesError(f"outer-kernel rules must be OuterKernelRules, got {rules!r}")
    rules.check(con)


def install_setting(con: duckdb.DuckDBPyConnection, rules: OuterKernelRules) -> None:
    """Install a setting of the ``outer_kernel_rules`` module (see ``OuterKernelRules.install``)."""
    rules.install(con)


def _tables(document: Mapping[str, Any], key: str, where: str) -> Sequence[Mapping[str, Any]]:
    entries = document.get(key, [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise RulesError(f"{where}: {key} must be an array of tables ([[{key}]])")
    return entries


def _table(name: str, columns: str, rows: Iterable[tuple[int | str, ...]]) -> str:
    """The statements that create or replace the table ``name`` of ``columns`` holding
    ``rows``, as literals: a script runs at once, parameters one row at a time."""
    values = ", ".join(
        "(" + ", ".join(str(v) if isinstance(v, int) else sql_string(v) for v in row) + ")"
        for row in rows
    )
    create = f"CREATE OR REPLACE TABLE {name} ({columns})"
    return f"{create};\nINSERT INTO {name} VALUES {values}" if values else create


def _check_regex(con: duckdb.DuckDBPyConnection, pattern: str, what: str) -> None:
    try:
        con.execute(f"SELECT regexp_matches('', {sql_string(pattern)})").fetchall()
    except duckdb.Error as exc:
        raise RulesError(
            f"{what}: {pattern!r} is not a valid RE2 regular expression: {exc}"
        ) from exc
