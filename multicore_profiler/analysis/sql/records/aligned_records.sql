-- Records on their invocation's common clock.
-- Needs: clock_correction (the table _clock_corrections, a store setting).
--
-- hyper-parallel's cores (and most producers' SMs) read one counter shared by the chip:
-- their records' cycles are already comparable, and they pass through unchanged. Some
-- imported producers count on a clock of each core's own (Proton's SM cycles) and place
-- each core on a common clock by an anchor (Proton's per-CTA globaltimer): the import
-- stores that core's offset in cores.clock_offset_cycles (and the interval it may lie in,
-- clock_low_cycles .. clock_high_cycles), chosen so that every shifted cycle is >= 0.
-- A clock correction (--clock-correction: offsets estimated from the records' causality,
-- see records/clock_sanity.sql and analysis/clock_offsets.py) adds its offset per core on
-- top. Every analysis that compares cycles of different cores reads these views, not the
-- raw ones; records and raw_records keep the cycles exactly as they were recorded.

-- The cores of each invocation whose cycles are shifted, and by how much: the anchor's
-- offset (none but imported ones have one) plus the applied correction's.
CREATE OR REPLACE VIEW _core_clock_offsets AS
SELECT
    run_id, step, rank, invocation_id, write_id, core_type, block_id,
    sum(offset_cycles)::BIGINT AS clock_offset_cycles
FROM (
    SELECT
        run_id, step, rank, invocation_id, write_id, core_type, block_id,
        clock_offset_cycles AS offset_cycles
    FROM raw_cores
    WHERE clock_offset_cycles IS NOT NULL
    UNION ALL
    SELECT run_id, step, rank, invocation_id, write_id, core_type, block_id, offset_cycles
    FROM _clock_corrections
)
GROUP BY ALL;

-- A raw cycle of a core on its invocation's common clock (the core's offset added).
CREATE OR REPLACE MACRO aligned_cycle(cycle, offset_cycles) AS
CASE WHEN offset_cycles IS NULL THEN cycle
     ELSE (cycle::HUGEINT + offset_cycles)::UBIGINT END;

-- Whether any invocation the cursor sees has clock offsets (or a correction is applied). A constant, so that DuckDB drops
-- the branch of aligned_raw_records that does not apply: records with nothing to align
-- cost no join. A cursor scoped to runs (what the commands read through) sets it as a
-- temporary macro from the invocations of those runs (analysis/registry.py); a query over
-- the whole store, which reads only the files its filters reach, keeps this default and
-- always joins (the run filter reaches the offsets' files too).
CREATE OR REPLACE MACRO _clock_offsets_present() AS true;

-- raw_records with start_cycle and end_cycle on the invocation's common clock.
CREATE OR REPLACE VIEW aligned_raw_records AS
SELECT * FROM raw_records WHERE NOT _clock_offsets_present()
UNION ALL
SELECT r.* REPLACE (
    aligned_cycle(r.start_cycle, o.clock_offset_cycles) AS start_cycle,
    aligned_cycle(r.end_cycle, o.clock_offset_cycles) AS end_cycle)
FROM raw_records r
LEFT JOIN _core_clock_offsets o
    ON o.run_id = r.run_id AND o.step = r.step AND o.rank = r.rank
    AND o.invocation_id = r.invocation_id AND o.write_id = r.write_id
    AND o.core_type = r.core_type AND o.block_id = r.block_id
WHERE _clock_offsets_present();

-- The records view (committed invocations only) on the invocation's common clock.
CREATE OR REPLACE VIEW aligned_records AS
SELECT r.* FROM aligned_raw_records r
JOIN invocations i
    ON r.run_id = i.run_id AND r.rank = i.rank AND r.invocation_id = i.invocation_id
    AND r.write_id = i.write_id;
