-- Layers of each step, from the layer sequence: layer_stages, layer_spans.
-- Needs: outer_kernel_rules (the table layer_sequence), outer_kernels.steps.

-- Per layer of each step and position of layer_sequence: the launches placed there. A
-- layer starts at each launch of the sequence's first family; in a layer, the n-th
-- launch of a family takes the n-th position holding that family (later ones its last).
CREATE OR REPLACE VIEW layer_stages AS
WITH seq AS (
    SELECT position, family,
        row_number() OVER (PARTITION BY family ORDER BY position) AS occurrence,
        count(*) OVER (PARTITION BY family) AS occurrences
    FROM layer_sequence
), opened AS (
    SELECT k.*,
        sum((k.family = (SELECT family FROM layer_sequence ORDER BY position LIMIT 1))::INTEGER)
            OVER (PARTITION BY source_id, step_index ORDER BY ts_ns, event_index
                  ROWS UNBOUNDED PRECEDING) AS layer
    FROM kernels k
    WHERE k.step_index IS NOT NULL AND k.family IN (SELECT family FROM layer_sequence)
), counted AS (
    SELECT *,
        row_number() OVER (
            PARTITION BY source_id, step_index, layer, family ORDER BY ts_ns, event_index) AS nth
    FROM opened
    WHERE layer > 0
), placed AS (
    SELECT c.*, s.position
    FROM counted c
    JOIN seq s ON s.family = c.family AND s.occurrence = least(c.nth, s.occurrences)
)
SELECT source_id, rank, step_index, step_name, (layer - 1)::BIGINT AS layer_index, position,
    family,
    count(*) AS launches, min(ts_ns) AS start_ns, max(end_ns) AS end_ns,
    sum(dur_ns)::BIGINT AS kernel_ns
FROM placed
GROUP BY ALL;

-- One row per layer of each step: its span (first start to last end), its launches, whether
-- every position of the sequence has a launch, and its tail: the end of the last position
-- minus the end of the one before (by default: expert down after expert gate/up).
CREATE OR REPLACE VIEW layer_spans AS
WITH sequence AS (
    SELECT max(position) AS last, count(*) AS positions FROM layer_sequence
)
SELECT source_id, rank, step_index, step_name, layer_index,
    min(start_ns) AS start_ns, max(end_ns) AS end_ns, max(end_ns) - min(start_ns) AS span_ns,
    sum(launches)::BIGINT AS launches, sum(kernel_ns)::BIGINT AS kernel_ns,
    count(*) = any_value(q.positions) AS complete,
    max(end_ns) FILTER (WHERE position = q.last)
        - max(end_ns) FILTER (WHERE position = q.last - 1) AS tail_ns
FROM layer_stages, sequence q
GROUP BY source_id, rank, step_index, step_name, layer_index;
