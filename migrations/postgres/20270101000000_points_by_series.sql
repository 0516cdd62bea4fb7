-- Points are stored and found by (series, step) only. The index on `seq` that live catch-up
-- walked cost a second b-tree insertion per point (a fifth to a sixth of ingest throughput,
-- docs/benchmarks.md). Catch-up now finds a run's points through `metric_writes`, one row per
-- stored batch, and `seq` is numbered per run from `runs.point_seq` (one counter update per
-- batch instead of a sequence call per point). Seqs already handed out keep their values, so a
-- client's live position stays valid across the upgrade.

ALTER TABLE runs ADD COLUMN point_seq BIGINT NOT NULL DEFAULT 0;

-- One row per write that stored points: the run's seqs it used and the steps it touched. The
-- seq ranges of a run's rows never overlap, which is what lets catch-up page through them.
CREATE TABLE metric_writes (
    run_id     TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    first_seq  BIGINT NOT NULL,
    last_seq   BIGINT NOT NULL,
    first_step BIGINT NOT NULL,
    last_step  BIGINT NOT NULL,
    count      BIGINT NOT NULL,
    PRIMARY KEY (run_id, first_seq)
);

-- The points stored so far, as if written in blocks of 1,024 seqs: the blocks' seq ranges do
-- not overlap, and each covers the steps written at the time, so catching up on a long run
-- reads a page's worth of points per page, not the whole run.
INSERT INTO metric_writes (run_id, first_seq, last_seq, first_step, last_step, count)
SELECT s.run_id, MIN(p.seq), MAX(p.seq), MIN(p.step), MAX(p.step), COUNT(*)
FROM metric_points p JOIN metric_series s ON s.id = p.series_id
GROUP BY s.run_id, p.seq / 1024;

UPDATE runs SET point_seq = w.last_seq
FROM (SELECT run_id, MAX(last_seq) AS last_seq FROM metric_writes GROUP BY run_id) w
WHERE w.run_id = runs.id;

ALTER TABLE metric_points DROP CONSTRAINT metric_points_pkey;
ALTER TABLE metric_points ALTER COLUMN seq DROP DEFAULT;
DROP SEQUENCE metric_points_seq_seq;
