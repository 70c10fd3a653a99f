-- What each run holds. Needs nothing but the store's views.

-- One row per run with what it holds: invocations, ranks, steps, records, dropped. The
-- invocations are summed per run first, distinct values as lists: DuckDB plans DISTINCT
-- aggregates over a join as a subplan per aggregate, a quarter of the query's time.
CREATE OR REPLACE VIEW run_summary AS
WITH held AS (
    SELECT run_id,
        count(invocation_id) AS invocations,
        len(list_distinct(list(rank))) AS ranks,
        len(list_distinct(list(step))) AS steps,
        sum(record_count) AS records,
        sum(dropped_count) AS dropped,
        list_sort(list_distinct(list(kernel_name))) AS kernels
    FROM invocations
    GROUP BY run_id
)
SELECT
    r.run_id, r.status, r.label, r.commit, r.branch, r.host, r.start_time, r.end_time,
    coalesce(h.invocations, 0) AS invocations,
    coalesce(h.ranks, 0) AS ranks,
    coalesce(h.steps, 0) AS steps,
    coalesce(h.records, 0)::BIGINT AS records,
    coalesce(h.dropped, 0)::BIGINT AS dropped,
    CASE WHEN len(h.kernels) > 0 THEN array_to_string(h.kernels, ', ') END AS kernels
FROM runs r
LEFT JOIN held h ON h.run_id = r.run_id;
