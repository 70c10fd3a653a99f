-- One row per kernel launch. An invocation's row is written after its cores and
-- records, so it is what makes them visible; a discarded write hides it again, with
-- any rewrite of it. A writer's row shows while no discard or supersession names its
-- write; a compaction's rewritten row shows while it is its origin's current rewrite.
-- (Two branches rather than one left join: DuckDB plans the records join of each
-- about twice as fast.) Where raw_discards has no file, which is most stores (no writer
-- withdrew a write, no remote store was compacted), the store defines the view as the
-- filter this comes to then, every writer's row and no rewrite:
--     SELECT * FROM raw_invocations WHERE origin_write_id IS NULL
-- which DuckDB plans in a fraction of the time, in every query over invocations, cores
-- or records (Store._point).
CREATE OR REPLACE VIEW invocations AS
SELECT i.* FROM raw_invocations i
ANTI JOIN raw_discards d
    ON i.run_id = d.run_id AND i.rank = d.rank
    AND i.write_id = coalesce(d.origin_write_id, d.write_id)
WHERE i.origin_write_id IS NULL
UNION ALL
SELECT i.* FROM raw_invocations i
JOIN current_rewrite w ON i.run_id = w.run_id AND i.rank = w.rank AND i.write_id = w.write_id
ANTI JOIN raw_discards d
    ON i.run_id = d.run_id AND i.rank = d.rank AND d.replaced_by IS NULL
    AND i.origin_write_id = d.write_id
WHERE i.origin_write_id IS NOT NULL;
