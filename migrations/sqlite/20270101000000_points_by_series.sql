-- Points are stored and found by (series, step) only, and `seq` is numbered per run from
-- `runs.point_seq`; live catch-up finds a run's points through `metric_writes`, one row per
-- stored batch (the Postgres migration of the same name says why). Seqs already handed out
-- keep their values, so a client's live position stays valid across the upgrade. The points
-- table is rebuilt: `seq` was its rowid, which per-run numbering cannot be, and clustered by
-- (series, step) it is one b-tree instead of a table and an index.

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
) WITHOUT ROWID;

-- The points stored so far, as if written in blocks of 1,024 seqs: the blocks' seq ranges do
-- not overlap, and each covers the steps written at the time, so catching up on a long run
-- reads a page's worth of points per page, not the whole run.
INSERT INTO metric_writes (run_id, first_seq, last_seq, first_step, last_step, count)
SELECT s.run_id, MIN(p.seq), MAX(p.seq), MIN(p.step), MAX(p.step), COUNT(*)
FROM metric_points p JOIN metric_series s ON s.id = p.series_id
GROUP BY s.run_id, p.seq / 1024;

UPDATE runs SET point_seq = COALESCE(
    (SELECT MAX(w.last_seq) FROM metric_writes w WHERE w.run_id = runs.id), 0);

CREATE TABLE metric_points_by_series (
    series_id INTEGER NOT NULL REFERENCES metric_series(id) ON DELETE CASCADE,
    step      BIGINT NOT NULL,
    value     REAL NOT NULL,
    time      BIGINT NOT NULL,
    seq       BIGINT NOT NULL,
    PRIMARY KEY (series_id, step)
) WITHOUT ROWID;

INSERT INTO metric_points_by_series (series_id, step, value, time, seq)
SELECT series_id, step, value, time, seq FROM metric_points;

DROP TABLE metric_points;
ALTER TABLE metric_points_by_series RENAME TO metric_points;
