-- What each run holds. Needs nothing but the store's views.

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
LEFT JOIN invocations i ON i.run_id = r.run_id
GROUP BY ALL;
