-- Per-stage statistics of records, and the records the task graph expected.
-- Needs: records.records_ns, records.names.

-- Records each stage should have written, per run, kernel and direction, from the task
-- graphs of the invocations whose kernel handed one over: a compute record per task,
-- plus one per event it waits on and one per event it triggers.
CREATE OR REPLACE VIEW stage_expected AS
SELECT
    i.run_id, i.kernel_name, i.direction, g.desc_id AS stage_desc_id,
    stage_name(i.stage_names, g.desc_id) AS stage,
    sum(1 + (g.wait_event >= 0)::INT + (g.trigger_event >= 0)::INT)::BIGINT AS expected_records
FROM invocations i
JOIN tasks g ON g.run_id = i.run_id AND g.rank = i.rank AND g.config_id = i.config_id
GROUP BY ALL;

-- Per run, kernel, direction and stage: task count, compute and wait times (us), and,
-- where the task graph is known, the records expected and how many the device dropped
-- (counted over the invocations that have a task graph only).
CREATE OR REPLACE VIEW stage_stats AS
WITH measured AS (
    SELECT
        run_id, kernel_name, direction, stage_desc_id, stage,
        count(*) AS records,
        count(*) FILTER (WHERE config_id IS NOT NULL) AS graphed_records,
        count(*) FILTER (WHERE phase = 'compute') AS tasks,
        sum(dur_ns) FILTER (WHERE phase = 'compute') / 1e3 AS compute_total_us,
        quantile_cont(dur_ns, 0.5) FILTER (WHERE phase = 'compute') / 1e3 AS compute_p50_us,
        quantile_cont(dur_ns, 0.99) FILTER (WHERE phase = 'compute') / 1e3 AS compute_p99_us,
        quantile_cont(dur_ns, 0.5) FILTER (WHERE phase = 'wait') / 1e3 AS wait_p50_us,
        quantile_cont(dur_ns, 0.99) FILTER (WHERE phase = 'wait') / 1e3 AS wait_p99_us
    FROM records_ns
    GROUP BY ALL
)
SELECT
    coalesce(m.run_id, e.run_id) AS run_id,
    coalesce(m.kernel_name, e.kernel_name) AS kernel_name,
    coalesce(m.direction, e.direction) AS direction,
    coalesce(m.stage_desc_id, e.stage_desc_id) AS stage_desc_id,
    coalesce(m.stage, e.stage) AS stage,
    coalesce(m.records, 0) AS records,
    coalesce(m.tasks, 0) AS tasks,
    m.compute_total_us, m.compute_p50_us, m.compute_p99_us, m.wait_p50_us, m.wait_p99_us,
    e.expected_records,
    e.expected_records - coalesce(m.graphed_records, 0) AS dropped
FROM measured m
FULL JOIN stage_expected e
    ON m.run_id = e.run_id AND m.kernel_name = e.kernel_name AND m.direction = e.direction
    AND m.stage_desc_id IS NOT DISTINCT FROM e.stage_desc_id
    AND m.stage IS NOT DISTINCT FROM e.stage;
