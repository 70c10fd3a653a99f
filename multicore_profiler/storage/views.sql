-- Named views and macros over the store's raw_<table> file views.
-- Raw cycles and ids come from the files; times in ns and names are derived here.

-- Convert a cycle count (or difference) to nanoseconds at a frequency in Hz.
CREATE OR REPLACE MACRO cycles_to_ns(cycles, frequency_hz) AS cycles * 1e9 / frequency_hz;

-- One row per run: its latest state (a run's row is written again as it progresses).
CREATE OR REPLACE VIEW runs AS
SELECT * FROM raw_runs
QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY updated_at DESC) = 1;

-- One row per kernel launch. An invocation's row is written after its cores and
-- records, so it is what makes them visible.
CREATE OR REPLACE VIEW invocations AS
SELECT * FROM raw_invocations;

-- One row per slot that was not idle, of committed invocations only.
CREATE OR REPLACE VIEW cores AS
SELECT c.* FROM raw_cores c
SEMI JOIN raw_invocations i
    ON c.run_id = i.run_id AND c.rank = i.rank AND c.invocation_id = i.invocation_id
    AND c.write_id = i.write_id;

-- One row per device record, raw, of committed invocations only.
CREATE OR REPLACE VIEW records AS
SELECT r.* FROM raw_records r
SEMI JOIN raw_invocations i
    ON r.run_id = i.run_id AND r.rank = i.rank AND r.invocation_id = i.invocation_id
    AND r.write_id = i.write_id;

-- Records with times in ns from their invocation's anchor cycle and frequency, the
-- kernel, and the stage of the record's task (a wait or trigger record takes the
-- stage of its task's compute record). stage is NULL where the kernel bound no name.
CREATE OR REPLACE VIEW records_ns AS
WITH task_stage AS (
    SELECT run_id, rank, invocation_id, write_id, task_id, min(desc_id) AS stage_desc_id
    FROM raw_records
    WHERE phase = 'compute'
    GROUP BY ALL
)
SELECT
    r.run_id, r.step, r.rank, i.device, r.invocation_id, i.kernel_name, i.direction,
    r.core_type,
    CASE r.core_type WHEN 1 THEN 'AIC' WHEN 2 THEN 'AIV' END AS core,
    r.block_id, r.record_index, r.task_id, r.desc_id, r.stage_task_index, r.owner_id,
    r.phase,
    CASE WHEN r.phase = 'compute' THEN r.desc_id ELSE t.stage_desc_id END AS stage_desc_id,
    i.stage_names[CASE WHEN r.phase = 'compute' THEN r.desc_id ELSE t.stage_desc_id END] AS stage,
    r.start_cycle, r.end_cycle,
    cycles_to_ns(r.start_cycle::HUGEINT - i.anchor_cycle, i.frequency_hz) AS ts_ns,
    cycles_to_ns(r.end_cycle - r.start_cycle, i.frequency_hz) AS dur_ns
FROM raw_records r
JOIN raw_invocations i
    ON r.run_id = i.run_id AND r.rank = i.rank AND r.invocation_id = i.invocation_id
    AND r.write_id = i.write_id
LEFT JOIN task_stage t
    ON r.phase <> 'compute' AND t.run_id = r.run_id AND t.rank = r.rank
    AND t.invocation_id = r.invocation_id AND t.write_id = r.write_id AND t.task_id = r.task_id;

-- Per run, kernel, direction and stage: task count, compute and wait times (us).
CREATE OR REPLACE VIEW stage_stats AS
SELECT
    run_id, kernel_name, direction, stage_desc_id, stage,
    count(*) AS records,
    count(*) FILTER (WHERE phase = 'compute') AS tasks,
    sum(dur_ns) FILTER (WHERE phase = 'compute') / 1e3 AS compute_total_us,
    quantile_cont(dur_ns, 0.5) FILTER (WHERE phase = 'compute') / 1e3 AS compute_p50_us,
    quantile_cont(dur_ns, 0.99) FILTER (WHERE phase = 'compute') / 1e3 AS compute_p99_us,
    quantile_cont(dur_ns, 0.5) FILTER (WHERE phase = 'wait') / 1e3 AS wait_p50_us,
    quantile_cont(dur_ns, 0.99) FILTER (WHERE phase = 'wait') / 1e3 AS wait_p99_us
FROM records_ns
GROUP BY ALL;

-- One row per run with what it holds: invocations, ranks, steps, records, dropped.
CREATE OR REPLACE VIEW run_summary AS
SELECT
    r.run_id, r.status, r.label, r.commit, r.branch, r.host, r.start_time, r.end_time,
    count(i.invocation_id) AS invocations,
    count(DISTINCT i.rank) AS ranks,
    count(DISTINCT i.step) AS steps,
    coalesce(sum(i.record_count), 0)::BIGINT AS records,
    coalesce(sum(i.dropped_count), 0)::BIGINT AS dropped,
    string_agg(DISTINCT i.kernel_name, ', ' ORDER BY i.kernel_name) AS kernels
FROM runs r
LEFT JOIN raw_invocations i ON i.run_id = r.run_id
GROUP BY ALL;
