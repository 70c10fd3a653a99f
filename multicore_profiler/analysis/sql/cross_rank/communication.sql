-- Communication across the ranks of a job: communication_ops, communication_totals,
-- collective_instances, collective_waits, slow_ranks, rank_clock_offsets, and the macros
-- hccl_group_hash, dixon_critical_995 and is_p2p_op_name they use.
-- Needs: outer_kernels.steps (step_periods, kernels), outer_kernels.collectives (collectives),
-- outer_kernels.hccl_ops (hccl_op_times), cross_rank.steps (job_sources: job_id, rank and
-- the communication rows of each source; job_groups). Reads the store's trace_events (the
-- args of NCCL kernels).
--
-- Times are the ranks' own clocks, raw: rank_clock_offsets estimates how far apart they
-- are and nothing here applies it. A job is the ranks of one ingest (trace_sources.job_id).
-- collective_instances is a table, built here and built again by its statement when the
-- committed traces change: the three views above it read it instead of computing it again.

-- msprof-analyze's double_hash of an HCCL group name, as text: two 32-bit polynomial hashes
-- of its code points (primes 29 and 131, each wrapped to 32 bits), the first the high word.
-- communication.json keys an op's group by the hash of its parallel_group_info key.
CREATE OR REPLACE MACRO hccl_group_hash(name) AS (
    list_reduce(list_transform(string_split(name, ''), lambda c: unicode(c)::BIGINT),
        lambda h, c: (h * 29 + c) % 4294967296, 0::BIGINT)::HUGEINT * 4294967296
    + list_reduce(list_transform(string_split(name, ''), lambda c: unicode(c)::BIGINT),
        lambda h, c: (h * 131 + c) % 4294967296, 0::BIGINT)
)::VARCHAR;

-- The critical values of the one-sided Dixon test at 99.5 % for n = 3..100 values
-- (msprof-analyze's slow_rank table); NULL outside that range.
CREATE OR REPLACE MACRO dixon_critical_995(n) AS CASE WHEN n BETWEEN 3 AND 100 THEN ([
    0.994, 0.920, 0.823, 0.744, 0.680, 0.723, 0.676, 0.638, 0.707, 0.675,
    0.649, 0.672, 0.649, 0.629, 0.611, 0.595, 0.580, 0.568, 0.556, 0.545,
    0.536, 0.526, 0.519, 0.510, 0.503, 0.496, 0.489, 0.484, 0.478, 0.473,
    0.468, 0.463, 0.458, 0.454, 0.450, 0.446, 0.442, 0.439, 0.435, 0.432,
    0.429, 0.425, 0.423, 0.420, 0.417, 0.414, 0.412, 0.409, 0.407, 0.405,
    0.402, 0.400, 0.398, 0.396, 0.394, 0.392, 0.391, 0.388, 0.387, 0.385,
    0.383, 0.382, 0.380, 0.379, 0.377, 0.376, 0.374, 0.372, 0.371, 0.370,
    0.368, 0.368, 0.366, 0.365, 0.364, 0.363, 0.361, 0.360, 0.359, 0.358,
    0.356, 0.356, 0.355, 0.353, 0.352, 0.352, 0.351, 0.350, 0.349, 0.348,
    0.347, 0.346, 0.345, 0.344, 0.344, 0.343, 0.341, 0.341]::DOUBLE[])[n - 2] END;

-- Whether slow_rank leaves an op out as point-to-point: msprof-analyze's rule, literally
-- (case-sensitive): its name holds 'send' or 'receive' (torch_npu's hcom_send_,
-- hcom_receive_). hcom_batchSendRecv and NCCL's SendRecv kernels stay, as they do there.
CREATE OR REPLACE MACRO is_p2p_op_name(name) AS
contains(name, 'send') OR contains(name, 'receive');

-- One row per communication op and rank of torch_npu's ranks, with basis saying where it
-- comes from:
-- - 'trace': the ranks loaded from a trace, their hcom ops' times from the HCCL task stream
--   (hccl_op_times; group_name as it names the group);
-- - 'msprof': the ranks loaded from output folders without a trace (form 'outputs'),
--   msprof's communication.json rows (profiler_outputs.communication): times in ns rounded
--   from msprof's µs (start) and ms (the rest), but for a row that carries exact start_ns
--   and end_ns (the DB export's COMMUNICATION_OP), whose elapse is end - start.
-- step is the step number (msprof's "step13" gives 13).
CREATE OR REPLACE VIEW communication_ops AS
WITH traced AS (
    SELECT s.job_id, h.rank, h.step_number AS step, h.group_name, h.op_name, h.start_ns,
        h.elapse_ns, h.transit_ns, h.wait_ns, h.sync_ns, h.idle_ns, h.wait_ratio,
        h.sync_ratio, 'trace' AS basis
    FROM hccl_op_times h JOIN job_sources s USING (source_id)
), rows AS (
    SELECT job_id, rank, unnest(communication) AS op
    FROM job_sources
    WHERE form = 'outputs'
), ms AS (
    SELECT job_id, rank,
        TRY_CAST(regexp_extract(op->>'step', '(\d+)$', 1) AS BIGINT) AS step,
        op->>'group_name' AS group_name, op->>'op_name' AS op_name,
        coalesce(TRY_CAST(op->>'start_ns' AS BIGINT),
            round(TRY_CAST(op->>'start_us' AS DECIMAL(38, 6)) * 1000)::BIGINT) AS start_ns,
        coalesce(TRY_CAST(op->>'end_ns' AS BIGINT) - TRY_CAST(op->>'start_ns' AS BIGINT),
            round(TRY_CAST(op->>'elapse_ms' AS DOUBLE) * 1e6)::BIGINT) AS elapse_ns,
        round(TRY_CAST(op->>'transit_ms' AS DOUBLE) * 1e6)::BIGINT AS transit_ns,
        round(TRY_CAST(op->>'wait_ms' AS DOUBLE) * 1e6)::BIGINT AS wait_ns,
        round(TRY_CAST(op->>'sync_ms' AS DOUBLE) * 1e6)::BIGINT AS sync_ns,
        round(TRY_CAST(op->>'idle_ms' AS DOUBLE) * 1e6)::BIGINT AS idle_ns,
        TRY_CAST(op->>'wait_ratio' AS DOUBLE) AS wait_ratio,
        TRY_CAST(op->>'sync_ratio' AS DOUBLE) AS sync_ratio
    FROM rows
)
SELECT * FROM traced
UNION ALL
SELECT job_id, rank, step, group_name, op_name, start_ns, elapse_ns, transit_ns, wait_ns,
    sync_ns, idle_ns, wait_ratio, sync_ratio, 'msprof' AS basis
FROM ms;

-- msprof's "Total Op Info" of each rank's communication per group and step: the ops
-- counted, their elapse, transit, wait, synchronization and idle summed, and the ratios
-- recomputed from the sums (wait / (wait + transit), sync / (sync + transit), rounded to 4
-- places, 0 where the denominator is 0), as msprof sums them; NULL sums where no op of the
-- group has them (a Level0 capture's ops).
CREATE OR REPLACE VIEW communication_totals AS
SELECT job_id, rank, step, group_name, count(*) AS ops,
    sum(elapse_ns)::BIGINT AS elapse_ns, sum(transit_ns)::BIGINT AS transit_ns,
    sum(wait_ns)::BIGINT AS wait_ns, sum(sync_ns)::BIGINT AS sync_ns,
    sum(idle_ns)::BIGINT AS idle_ns,
    CASE WHEN count(wait_ns) > 0 THEN
        round(coalesce(sum(wait_ns) / nullif(sum(wait_ns) + sum(transit_ns), 0), 0), 4)
    END AS wait_ratio,
    CASE WHEN count(sync_ns) > 0 THEN
        round(coalesce(sum(sync_ns) / nullif(sum(sync_ns) + sum(transit_ns), 0), 0), 4)
    END AS sync_ratio
FROM communication_ops
GROUP BY ALL;

-- Every collective op of every rank of a job, as one rank's part of a collective instance,
-- keyed as msprof-analyze's cluster_time_summary keys them: instance is unique within
-- (job_id, group_name), and its rows are the ranks' parts of one collective.
-- - Ascend (communication_ops; keyed_by 'op_name'): the group (group_name) and the op's
--   name within its step: '<step>/<op_name>'.
-- - kineto (the NCCL kernels of collectives; group_name the kernel's args
--   "Process Group Name"): 'seq <Seq>' where the kernel's args carry "Seq" (keyed_by
--   'seq'), else the kernel's name and its place among the kernels of that name and group
--   in its step: '<step>/<name>#<k>', k from 0 in order of start (keyed_by 'order').
-- The group's ranks (group_ranks) are those of its parallel_group_info entry (job_groups:
-- the entry whose key is the group name or hashes to it, see hccl_group_hash), else the
-- ranks of the job that hold any op of the group. An instance is
-- complete when each of its group's ranks has exactly one part in it and no other rank has
-- one; incomplete instances (a rank missing, or ops that do not pair one to one) are listed
-- here and left out of collective_waits and rank_clock_offsets.
CREATE OR REPLACE TABLE collective_instances AS
WITH ascend AS (
    SELECT job_id, rank, step, group_name, op_name,
        coalesce(step::VARCHAR, '') || '/' || op_name AS instance, 'op_name' AS keyed_by,
        start_ns, start_ns + elapse_ns AS end_ns, elapse_ns AS dur_ns
    FROM communication_ops
), nccl AS (
    SELECT s.job_id, c.rank, p.step_number AS step, c.source_id, c.step_index, c.name,
        c.ts_ns, c.end_ns, c.dur_ns, c.event_index,
        json_extract_string(e.args, '$."Process Group Name"') AS group_name,
        json_extract_string(e.args, '$.Seq') AS seq
    FROM collectives c
    SEMI JOIN (SELECT source_id, event_index FROM kernels WHERE kind = 'kernel') k
        USING (source_id, event_index)
    JOIN job_sources s USING (source_id)
    JOIN step_periods p USING (source_id, step_index)
    JOIN (SELECT source_id, event_index, args FROM trace_events WHERE cat = 'kernel') e
        USING (source_id, event_index)
), kineto AS (
    SELECT job_id, rank, step, group_name, name AS op_name,
        CASE WHEN seq IS NOT NULL THEN 'seq ' || seq
             ELSE coalesce(step::VARCHAR, '') || '/' || name || '#'
                 || row_number() OVER (
                     PARTITION BY source_id, step_index, group_name, name, seq IS NULL
                     ORDER BY ts_ns, event_index) - 1
        END AS instance,
        CASE WHEN seq IS NOT NULL THEN 'seq' ELSE 'order' END AS keyed_by,
        ts_ns AS start_ns, end_ns, dur_ns
    FROM nccl
), parts AS (
    SELECT * FROM ascend UNION ALL SELECT * FROM kineto
), groups AS (
    SELECT DISTINCT job_id, group_name FROM parts
), declared_members AS (
    SELECT DISTINCT g.job_id, g.group_name, unnest(j.ranks) AS rank
    FROM groups g
    JOIN job_groups j
        ON j.job_id = g.job_id
        AND (j.group_key = g.group_name OR hccl_group_hash(j.group_key) = g.group_name)
), members AS (
    SELECT job_id, group_name, rank FROM declared_members
    UNION ALL
    SELECT DISTINCT job_id, group_name, rank FROM parts
    ANTI JOIN declared_members USING (job_id, group_name)
), sizes AS (
    SELECT job_id, group_name, count(*) AS group_ranks FROM members GROUP BY ALL
), counted AS (
    SELECT p.*, z.group_ranks,
        count(*) OVER i AS parts,
        count(*) FILTER (m.rank IS NOT NULL) OVER i AS member_parts,
        count(DISTINCT p.rank) FILTER (m.rank IS NOT NULL) OVER i AS member_ranks
    FROM parts p
    LEFT JOIN members m
        ON m.job_id = p.job_id AND m.group_name IS NOT DISTINCT FROM p.group_name
        AND m.rank = p.rank
    JOIN sizes z ON z.job_id = p.job_id AND z.group_name IS NOT DISTINCT FROM p.group_name
    WINDOW i AS (PARTITION BY p.job_id, p.group_name, p.instance)
)
SELECT job_id, group_name, instance, rank, step, op_name, start_ns, end_ns, dur_ns,
    keyed_by, group_ranks, parts,
    parts = group_ranks AND member_parts = group_ranks AND member_ranks = group_ranks
        AS complete
FROM counted;

-- msprof-analyze's cluster_time_summary split of each rank's collective time per step:
-- for each complete collective instance (see collective_instances), transmit is the
-- shortest duration over its ranks and a rank's wait its duration minus that; both summed
-- per (job_id, rank, step), the rank's own step. A job with one rank holding collectives
-- has 0 and 0, as there. One row per rank and step holding any collective part;
-- collectives counts the complete instances summed, unmatched the parts left out (those
-- of incomplete instances).
CREATE OR REPLACE VIEW collective_waits AS
WITH timed AS (
    SELECT *,
        complete AND count(DISTINCT rank) OVER (PARTITION BY job_id) > 1 AS counted,
        min(dur_ns) OVER (PARTITION BY job_id, group_name, instance) AS transmit
    FROM collective_instances
)
SELECT job_id, rank, step,
    coalesce(sum(dur_ns - transmit) FILTER (counted), 0)::BIGINT AS wait_ns,
    coalesce(sum(transmit) FILTER (counted), 0)::BIGINT AS transmit_ns,
    count(*) FILTER (complete) AS collectives,
    count(*) FILTER (NOT complete) AS unmatched
FROM timed
GROUP BY ALL;

-- msprof-analyze's slow_rank vote. The instances tested are those of every group of a job
-- whose instances all have the same number of parts (slow_rank drops a whole group
-- otherwise), but point-to-point ops (is_p2p_op_name). For each, over its n durations
-- sorted x1 <= ... <= xn:
-- - n <= 100: one-sided Dixon test at 99.5 %, of the low tail: r = (x2-x1)/(xn-x1) for
--   n <= 7, (x2-x1)/(x(n-1)-x1) for n <= 10, (x3-x1)/(x(n-1)-x1) for n <= 13,
--   (x3-x1)/(x(n-2)-x1) otherwise (0 where the denominator is 0); no test for n < 3 or
--   3 or fewer distinct durations. r > dixon_critical_995(n) votes for the rank with the
--   shortest duration (it arrived last; the lowest rank of a tie).
-- - n > 100: every rank below mean - 3 sigma (population sigma) votes, and the rank with
--   the shortest duration too when the longest is above mean + 3 sigma.
-- One row per (job_id, step, rank) holding a tested instance: votes of the rank's parts
-- in that step (0 where none).
CREATE OR REPLACE VIEW slow_ranks AS
WITH tested AS (
    SELECT * FROM collective_instances
    WHERE NOT is_p2p_op_name(op_name)
    QUALIFY count(DISTINCT parts) OVER (PARTITION BY job_id, group_name) = 1
), stats AS (
    SELECT job_id, group_name, instance, count(*) AS n,
        count(DISTINCT dur_ns) AS distinct_durations,
        list(dur_ns ORDER BY dur_ns) AS x,
        arg_min(rank, (dur_ns, rank)) AS shortest_rank,
        avg(dur_ns) AS mean, stddev_pop(dur_ns) AS sigma, max(dur_ns) AS longest
    FROM tested
    GROUP BY ALL
), dixon AS (
    SELECT *,
        coalesce(CASE
            WHEN n <= 7 THEN (x[2] - x[1]) / nullif(x[n] - x[1], 0)
            WHEN n <= 10 THEN (x[2] - x[1]) / nullif(x[n - 1] - x[1], 0)
            WHEN n <= 13 THEN (x[3] - x[1]) / nullif(x[n - 1] - x[1], 0)
            ELSE (x[3] - x[1]) / nullif(x[n - 2] - x[1], 0)
        END, 0) AS r
    FROM stats
), voted AS (
    SELECT t.job_id, t.step, t.rank,
        CASE
            WHEN d.n <= 100 THEN d.n >= 3 AND d.distinct_durations > 3
                AND d.r > dixon_critical_995(d.n) AND t.rank = d.shortest_rank
            ELSE t.dur_ns < d.mean - 3 * d.sigma
                OR (d.longest > d.mean + 3 * d.sigma AND t.rank = d.shortest_rank)
        END AS vote
    FROM tested t
    JOIN dixon d
        ON d.job_id = t.job_id AND d.group_name IS NOT DISTINCT FROM t.group_name
        AND d.instance = t.instance
)
SELECT job_id, step, rank, count(*) FILTER (vote) AS votes
FROM voted
GROUP BY ALL;

-- Each rank's clock against the job's lowest rank (reference_rank), assuming a
-- collective's ranks all end it at once (msprof-analyze's communication_bottleneck clock
-- shift, MindStudio Insight's tail alignment): offset_ns is the median over the complete
-- instances the two ranks share of (the rank's end - the reference rank's end), the mean
-- of the two middle differences rounded down to the ns where their count is even;
-- collectives counts them and spread_ns is the largest difference minus the smallest (how
-- far the instances disagree). A rank sharing none has a NULL offset. Shown, never applied.
CREATE OR REPLACE VIEW rank_clock_offsets AS
WITH ranks AS (
    SELECT DISTINCT job_id, rank FROM job_sources WHERE rank IS NOT NULL
), reference AS (
    SELECT job_id, min(rank) AS reference_rank FROM ranks GROUP BY ALL
), complete AS (
    SELECT * FROM collective_instances WHERE complete
), differences AS (
    SELECT r.job_id, r.rank, list(r.end_ns - f.end_ns ORDER BY r.end_ns - f.end_ns) AS d
    FROM complete r
    JOIN reference USING (job_id)
    JOIN complete f
        ON f.job_id = r.job_id AND f.group_name IS NOT DISTINCT FROM r.group_name
        AND f.instance = r.instance AND f.rank = reference.reference_rank
    GROUP BY ALL
)
SELECT k.job_id, k.rank, f.reference_rank,
    d.d[(len(d.d) + 1) // 2] + (d.d[len(d.d) // 2 + 1] - d.d[(len(d.d) + 1) // 2]) // 2
        AS offset_ns,
    coalesce(len(d.d), 0) AS collectives,
    d.d[len(d.d)] - d.d[1] AS spread_ns
FROM ranks k
JOIN reference f USING (job_id)
LEFT JOIN differences d USING (job_id, rank);
