-- The steps of a job's ranks side by side, as msprof-analyze's cluster analysis sets them:
-- rank_steps (each rank's step_trace_time), job_groups, job_stages and rank_parallel_indices
-- (the job's parallel layout), rank_step_breakdown (cluster_step_trace_time), slow_rank_advice
-- (the advisor's slow-rank rule), slow_rank_causes and rank_gaps.
-- Needs: outer_kernels.steps (step_periods), outer_kernels.breakdown (step_time_breakdown).
-- Reads the store's trace_sources (job_id, rank, device, form, parallel, profiler_outputs)
-- once, into job_sources.
--
-- A job's ranks are its sources with a rank (a source without one is no rank of a job and is
-- left out). Times are integer ns; msprof's µs become round(µs * 1000).
--
-- job_sources, rank_steps, job_groups, pipeline_chains, job_stages and rank_parallel_indices
-- are tables, each built here by its statement (in that order: each reads the tables
-- before it) and built again when the committed traces change: the views above them, and
-- cross_rank.communication, read them instead of scanning trace_sources and parsing every
-- source's JSON again (and binding views over views).

-- One row per trace source (with a rank or not): its ids, device and form, and the parts of
-- its JSON that the cross-rank views read, each parsed once: step_trace_time (msprof's
-- step_trace_time rows of a source of form 'outputs', as a list of structs: NULL for the
-- others), communication (its profiler_outputs' communication rows, JSON[]),
-- parallel_group_info and distributed_args (those of its parallel, each where it is a JSON
-- object, else NULL).
CREATE OR REPLACE TABLE job_sources AS
SELECT source_id, job_id, rank, device, form,
    CASE WHEN form = 'outputs' THEN from_json(profiler_outputs->'$.step_trace_time', '[{
        "step": "VARCHAR", "computing_us": "DOUBLE",
        "communication_not_overlapped_us": "DOUBLE", "overlapped_us": "DOUBLE",
        "communication_us": "DOUBLE", "free_us": "DOUBLE", "stage_us": "DOUBLE",
        "bubble_us": "DOUBLE", "communication_not_overlapped_exclude_receive_us": "DOUBLE",
        "preparing_us": "DOUBLE"}]') END AS step_trace_time,
    json_extract(profiler_outputs, '$.communication[*]') AS communication,
    CASE WHEN json_type(parallel, '$.parallel_group_info') = 'OBJECT'
        THEN parallel->'$.parallel_group_info' END AS parallel_group_info,
    CASE WHEN json_type(parallel, '$.distributed_args') = 'OBJECT'
        THEN parallel->'$.distributed_args' END AS distributed_args
FROM trace_sources;

-- One row per job, rank and step: msprof-analyze's step_trace_time columns in ns. A source
-- with trace events takes them from step_time_breakdown (basis 'trace'; step: the step
-- annotation's number, step_periods.step_number; Communication(Not Overlapped and Exclude
-- Receive) is Communication(Not Overlapped) less Bubble, as msprof computes it); a source of
-- msprof's tables alone (form 'outputs') from its profiler_outputs.step_trace_time rows
-- (basis 'msprof'; step: the row's Step as an integer, NULL where msprof wrote none;
-- preparing_ns NULL where the table has no Preparing column, as older msprof writes it).
CREATE OR REPLACE TABLE rank_steps AS
WITH sources AS (
    SELECT source_id, job_id, rank, device, form, step_trace_time
    FROM job_sources
    WHERE rank IS NOT NULL
), written AS (
    SELECT job_id, rank, source_id, device, unnest(step_trace_time) AS r
    FROM sources
    WHERE form = 'outputs'
)
SELECT s.job_id, s.rank, p.step_number AS step, s.source_id, s.device, 'trace' AS basis,
    b.computing_ns, b.communication_not_overlapped_ns, b.overlapped_ns, b.communication_ns,
    b.free_ns, b.stage_ns, b.bubble_ns,
    b.communication_not_overlapped_ns - b.bubble_ns
        AS communication_not_overlapped_exclude_receive_ns,
    b.preparing_ns
FROM step_time_breakdown b
JOIN step_periods p USING (source_id, step_index)
JOIN sources s USING (source_id)
WHERE s.form <> 'outputs'
UNION ALL
SELECT job_id, rank, TRY_CAST(trim(r.step) AS BIGINT) AS step, source_id, device,
    'msprof' AS basis,
    round(r.computing_us * 1000)::BIGINT AS computing_ns,
    round(r.communication_not_overlapped_us * 1000)::BIGINT AS communication_not_overlapped_ns,
    round(r.overlapped_us * 1000)::BIGINT AS overlapped_ns,
    round(r.communication_us * 1000)::BIGINT AS communication_ns,
    round(r.free_us * 1000)::BIGINT AS free_ns,
    round(r.stage_us * 1000)::BIGINT AS stage_ns,
    round(r.bubble_us * 1000)::BIGINT AS bubble_ns,
    round(r.communication_not_overlapped_exclude_receive_us * 1000)::BIGINT
        AS communication_not_overlapped_exclude_receive_ns,
    round(r.preparing_us * 1000)::BIGINT AS preparing_ns
FROM written;

-- The communication groups of each job's parallel_group_info (torch_npu's
-- profiler_metadata.json): its key, its name (pg_name: 'dp', 'pp', ...) and its global
-- ranks, sorted. A group is taken from the lowest rank whose metadata lists it.
CREATE OR REPLACE TABLE job_groups AS
SELECT job_id, group_key, pg_name, ranks
FROM (
    SELECT s.job_id, s.rank, g.key AS group_key, g.value->>'$.group_name' AS pg_name,
        list_sort(list_distinct(list_filter(
            from_json(g.value->'$.global_ranks', '["INTEGER"]'), lambda x: x IS NOT NULL))) AS ranks
    FROM job_sources s, json_each(s.parallel_group_info) g
    WHERE s.rank IS NOT NULL AND s.parallel_group_info IS NOT NULL
)
QUALIFY row_number() OVER (PARTITION BY job_id, group_key ORDER BY rank) = 1;

-- Connected components of an undirected graph per job (a graph walk, apart from the domain
-- views): each node of the table or view named edges (job_id, a, b; both directions) with
-- the least node it reaches, its label.
CREATE OR REPLACE MACRO _components(edges) AS TABLE
WITH RECURSIVE e AS (
    SELECT job_id, a, b FROM query_table(edges)
), labels(job_id, rank, label) USING KEY (job_id, rank) AS (
    SELECT DISTINCT job_id, a, a FROM e
    UNION
    SELECT l.job_id, e.b, min(l.label)
    FROM labels l
    JOIN e ON e.job_id = l.job_id AND e.a = l.rank
    JOIN recurring.labels now ON now.job_id = l.job_id AND now.rank = e.b
    GROUP BY l.job_id, e.b, now.label
    HAVING min(l.label) < now.label
)
SELECT job_id, rank, label FROM labels;

-- The pipeline chains as msprof-analyze builds them: the groups named pp... (any case) of
-- two ranks or more, merged where they share a rank. One row per rank of a chain, its chain
-- named by its lowest rank. (msprof chains the p2p groups that communication.json shows ops
-- in and parallel_group_info names pp...; a pipeline group of one rank carries no p2p op.)
-- Both pipeline_chains and job_stages find the connected components of a graph of ranks
-- (_components): every rank of a group linked both ways to the group's first rank, then
-- each rank's label, from its own rank, lowered to the lowest label of a rank linked to it
-- until none changes. The edges: each rank of a pipeline group and the group's first rank.
CREATE OR REPLACE VIEW _pipeline_edges AS
SELECT DISTINCT job_id, unnest([rank, ranks[1]]) AS a, unnest([ranks[1], rank]) AS b
FROM (
    SELECT job_id, ranks, unnest(ranks) AS rank FROM job_groups
    WHERE starts_with(lower(pg_name), 'pp') AND len(ranks) >= 2
);

-- pipeline_chains is a table, built before job_stages: DuckDB expands a table macro once
-- per query, and job_stages walks its own graph with the same macro.
CREATE OR REPLACE TABLE pipeline_chains AS
SELECT job_id, rank, label AS chain FROM _components('_pipeline_edges');

-- Each job's pipeline stages as msprof-analyze's StageInfoAnalysis derives them from its
-- groups, in a job with pipeline chains (none without): the groups holding at most one rank
-- of each chain, merged where they share a rank. One row per rank of a stage, with the
-- stage's ranks (sorted).
CREATE OR REPLACE VIEW _stage_edges AS
WITH members AS (
    SELECT m.job_id, m.group_key, m.ranks, m.rank, c.chain
    FROM (SELECT *, unnest(ranks) AS rank FROM job_groups) AS m
    LEFT JOIN pipeline_chains c USING (job_id, rank)
    WHERE m.job_id IN (SELECT job_id FROM pipeline_chains)
), bounding AS (
    SELECT job_id, group_key FROM members
    GROUP BY ALL
    HAVING count(chain) = count(DISTINCT chain)
)
SELECT DISTINCT job_id, unnest([rank, ranks[1]]) AS a, unnest([ranks[1], rank]) AS b
FROM members SEMI JOIN bounding USING (job_id, group_key);

CREATE OR REPLACE TABLE job_stages AS
SELECT job_id, list(rank ORDER BY rank) OVER (PARTITION BY job_id, label) AS stage, rank
FROM _components('_stage_edges');

-- A size of a job's distributed_args (the JSON object args): its integer value, 1 where
-- absent, NULL where it is anything but an integer (msprof-analyze refuses the layout then).
CREATE OR REPLACE MACRO _parallel_size(args, key) AS
CASE
    WHEN json_type(args, '$.' || key) IS NULL THEN 1
    WHEN json_type(args, '$.' || key) IN ('BIGINT', 'UBIGINT')
        THEN TRY_CAST(args->>('$.' || key) AS BIGINT)
END;

-- Each rank's DP, PP and TP index as msprof-analyze's ParallelStrategyCalculator (Megatron
-- order) computes them from the job's distributed_args (those of its lowest rank that has
-- them): with sizes T (tensor_model_parallel_size), P (pipeline_...), D (data_...), E
-- (expert_...), each 1 where absent or 0, C (context_parallel_size, 1 where absent) and W
-- (world_size, 1 where absent): dp = (rank mod T*D) div T, pp = rank div T*D, tp = rank mod T.
-- NULL where msprof writes none or fails: a size that is not an integer or is below 1, C
-- other than 1, W other than T*P*D, D or D*C not a multiple of E, more ranks than W, a rank
-- of W or above.
CREATE OR REPLACE TABLE rank_parallel_indices AS
WITH args AS (
    SELECT job_id, distributed_args AS a FROM job_sources
    WHERE rank IS NOT NULL AND distributed_args IS NOT NULL
    QUALIFY row_number() OVER (PARTITION BY job_id ORDER BY rank) = 1
), written AS (
    SELECT job_id,
        _parallel_size(a, 'tensor_model_parallel_size') AS t,
        _parallel_size(a, 'pipeline_model_parallel_size') AS p,
        _parallel_size(a, 'data_parallel_size') AS d,
        _parallel_size(a, 'expert_model_parallel_size') AS e,
        _parallel_size(a, 'context_parallel_size') AS c,
        _parallel_size(a, 'world_size') AS w
    FROM args
), layout AS (
    SELECT job_id, if(t = 0, 1, t) AS t, if(p = 0, 1, p) AS p, if(d = 0, 1, d) AS d,
        if(e = 0, 1, e) AS e, c, w
    FROM written
), ranks AS (
    SELECT job_id, rank, count(*) OVER (PARTITION BY job_id) AS ranks
    FROM (SELECT DISTINCT job_id, rank FROM rank_steps)
)
SELECT r.job_id, r.rank,
    CASE WHEN valid THEN (r.rank % (l.t * l.d)) // l.t END::INTEGER AS dp_index,
    CASE WHEN valid THEN r.rank // (l.t * l.d) END::INTEGER AS pp_index,
    CASE WHEN valid THEN r.rank % l.t END::INTEGER AS tp_index
FROM ranks r
JOIN layout l USING (job_id),
LATERAL (
    SELECT least(l.t, l.p, l.d, l.e) >= 1 AND l.c = 1 AND l.w = l.t * l.p * l.d
        AND l.d % l.e = 0 AND (l.d * l.c) % l.e = 0 AND r.ranks <= l.w AND r.rank < l.w AS valid
);

-- msprof-analyze's cluster_step_trace_time, in ns: per job and step, a 'rank' row per rank of
-- rank_steps, and where the job has pipeline stages (job_stages) a 'stage' row per stage,
-- each column the largest of the stage's ranks in that step (the ranks in no stage make the
-- stage [], as msprof's "()"). index is an INTEGER[]: [rank] in a rank row, the stage's ranks
-- (sorted, as job_stages lists them, present in the store or not) in a stage row. The DP, PP
-- and TP indices are rank_parallel_indices' (NULL in stage rows, msprof's NA).
CREATE OR REPLACE VIEW rank_step_breakdown AS
WITH staged AS (
    SELECT r.*, CASE WHEN j.job_id IS NOT NULL THEN coalesce(s.stage, []::INTEGER[]) END AS stage
    FROM rank_steps r
    LEFT JOIN job_stages s USING (job_id, rank)
    LEFT JOIN (SELECT DISTINCT job_id FROM job_stages) j USING (job_id)
)
SELECT s.job_id, s.step, 'rank' AS type, [s.rank] AS index,
    s.computing_ns, s.communication_not_overlapped_ns, s.overlapped_ns, s.communication_ns,
    s.free_ns, s.stage_ns, s.bubble_ns, s.communication_not_overlapped_exclude_receive_ns,
    s.preparing_ns, i.dp_index, i.pp_index, i.tp_index
FROM staged s
LEFT JOIN rank_parallel_indices i USING (job_id, rank)
UNION ALL
SELECT job_id, step, 'stage' AS type, stage AS index,
    max(computing_ns), max(communication_not_overlapped_ns), max(overlapped_ns),
    max(communication_ns), max(free_ns), max(stage_ns), max(bubble_ns),
    max(communication_not_overlapped_exclude_receive_ns), max(preparing_ns),
    NULL::INTEGER, NULL::INTEGER, NULL::INTEGER
FROM staged
WHERE stage IS NOT NULL
GROUP BY job_id, step, stage;

-- msprof-analyze advisor's slow-rank rule, per job and step: for each dimension (Computing,
-- Communication: Communication(Not Overlapped), Free) the largest and smallest value over
-- the step's ranks and the ranks holding them, their difference (spread_ns), the mean step
-- (mean_step_ns: the mean over the ranks of Computing + Communication(Not Overlapped) +
-- Free), spread_ratio = spread_ns / mean_step_ns (0 where the mean is 0) and flagged =
-- spread_ratio > 0.05. (The advisor takes the csv's rank rows of every step together; over
-- one step, as here, the two agree.)
CREATE OR REPLACE VIEW slow_rank_advice AS
WITH dimensions AS (
    SELECT job_id, step, rank,
        computing_ns + communication_not_overlapped_ns + free_ns AS step_ns,
        unnest(['Computing', 'Communication', 'Free']) AS dimension,
        unnest([computing_ns, communication_not_overlapped_ns, free_ns]) AS ns
    FROM rank_steps
), spread AS (
    SELECT *, max(ns) OVER w AS max_ns, min(ns) OVER w AS min_ns,
        avg(step_ns) OVER w AS mean_step_ns
    FROM dimensions
    WINDOW w AS (PARTITION BY job_id, step, dimension)
)
SELECT job_id, step, dimension, count(*) AS ranks,
    max_ns, list(rank ORDER BY rank) FILTER (WHERE ns = max_ns) AS max_ranks,
    min_ns, list(rank ORDER BY rank) FILTER (WHERE ns = min_ns) AS min_ranks,
    max_ns - min_ns AS spread_ns, mean_step_ns,
    coalesce((max_ns - min_ns) / nullif(mean_step_ns, 0), 0) AS spread_ratio,
    coalesce((max_ns - min_ns) / nullif(mean_step_ns, 0), 0) > 0.05 AS flagged
FROM spread
GROUP BY job_id, step, dimension, max_ns, min_ns, mean_step_ns;

-- Per job and step, its slowest rank and where its extra time went. A rank's step time is
-- Stage + Preparing (step_ns; Preparing 0 where msprof wrote none); the slowest rank has the
-- largest (the lowest rank of a tie). Each *_excess_ns is the slowest rank's value less the
-- median of that column over the step's ranks (the mean of the two middle values for an even
-- count); recoverable_ns is its step time less the median step time: what the step would
-- gain if its slowest rank were a median one.
CREATE OR REPLACE VIEW slow_rank_causes AS
WITH timed AS (
    SELECT *, stage_ns + coalesce(preparing_ns, 0) AS step_ns FROM rank_steps
), medians AS (
    SELECT job_id, step, count(*) AS ranks, median(step_ns) AS median_step_ns,
        median(computing_ns) AS computing_ns, median(free_ns) AS free_ns,
        median(coalesce(preparing_ns, 0)) AS preparing_ns,
        median(communication_not_overlapped_ns) AS communication_not_overlapped_ns
    FROM timed
    GROUP BY ALL
), slowest AS (
    SELECT * FROM timed
    QUALIFY row_number() OVER (PARTITION BY job_id, step ORDER BY step_ns DESC, rank) = 1
)
SELECT s.job_id, s.step, m.ranks, s.rank, s.source_id, s.step_ns, m.median_step_ns,
    s.step_ns - m.median_step_ns AS recoverable_ns,
    s.computing_ns - m.computing_ns AS computing_excess_ns,
    s.free_ns - m.free_ns AS free_excess_ns,
    coalesce(s.preparing_ns, 0) - m.preparing_ns AS preparing_excess_ns,
    s.communication_not_overlapped_ns - m.communication_not_overlapped_ns
        AS communication_not_overlapped_excess_ns
FROM slowest s
JOIN medians m ON m.job_id = s.job_id AND m.step IS NOT DISTINCT FROM s.step;

-- What a job lacks for its ranks to be compared: one row per gap, for callers to warn or
-- refuse, naming it. kind 'missing_step': a rank of the job in the store has no row in
-- rank_steps for a step that other ranks of the job have (step and the rank's source_id
-- given). kind 'absent_rank': a rank that the job's parallel_group_info groups list, or that
-- lies below its distributed_args' world_size, has no source in the job. detail says it in
-- words.
CREATE OR REPLACE VIEW rank_gaps AS
WITH ranks AS (
    SELECT job_id, rank, source_id FROM job_sources WHERE rank IS NOT NULL
), steps AS (
    SELECT job_id, step, list(rank ORDER BY rank) AS ranks FROM rank_steps GROUP BY ALL
), world AS (
    SELECT job_id, TRY_CAST(distributed_args->>'$.world_size' AS BIGINT) AS world_size
    FROM job_sources
    WHERE rank IS NOT NULL AND distributed_args IS NOT NULL
    QUALIFY row_number() OVER (PARTITION BY job_id ORDER BY rank) = 1
), listed AS (
    SELECT job_id, unnest(ranks) AS rank, pg_name, NULL AS world_size FROM job_groups
    UNION ALL
    SELECT job_id, unnest(range(world_size)) AS rank, NULL AS pg_name, world_size
    FROM world
    WHERE world_size > 0
)
SELECT r.job_id, 'missing_step' AS kind, r.rank, s.step, r.source_id,
    format('rank {} (source {}) has no step {}, which ranks {} of job {} have', r.rank,
        r.source_id, coalesce(s.step::VARCHAR, '(unnumbered)'), s.ranks, r.job_id) AS detail
FROM ranks r
JOIN steps s USING (job_id)
WHERE NOT EXISTS (
    SELECT 1 FROM rank_steps x
    WHERE x.job_id = r.job_id AND x.rank = r.rank AND x.step IS NOT DISTINCT FROM s.step)
UNION ALL
SELECT job_id, 'absent_rank' AS kind, rank, NULL AS step, NULL AS source_id,
    format('rank {} of job {} is not in the store, though {}', rank, job_id, concat_ws(' and ',
        'its parallel_group_info groups ' || string_agg(DISTINCT pg_name, ', ' ORDER BY pg_name)
            || ' list it',
        'its world_size ' || max(world_size) || ' counts it')) AS detail
FROM listed l
WHERE NOT EXISTS (SELECT 1 FROM ranks r WHERE r.job_id = l.job_id AND r.rank = l.rank)
GROUP BY job_id, rank;
