#!/usr/bin/env python3
"""MLflow client compatibility scenario for Trainyard's MLflow tracking API.

Run it with the python of the pinned MLflow venv (scripts/mlflow-venv.sh):

    target/mlflow-venv/bin/python server/tests/mlflow/scenario.py BASE_URL

The script drives the official MLflow client (fluent API and MlflowClient) against BASE_URL, which
it sets as MLFLOW_TRACKING_URI. For each case that passes it prints one line. On the first failure
it exits non-zero with the reason. Every name it creates carries a random suffix, so the script
can run any number of times against the same server. Credentials come from the standard
MLFLOW_TRACKING_TOKEN, or from MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD, which the
client reads by itself.

Live mode for browser tests:

    scenario.py BASE_URL --live RUN_NAME [--steps N] [--delay S]

This starts a run named RUN_NAME in the Default experiment ("0") and prints `RUN_ID <id>`
(flushed). It then logs `train/loss` for N steps, sleeping S seconds between them, and ends the
run.
"""

import argparse
import json
import math
import os
import re
import sys
import tempfile
import time
import traceback
import uuid


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base_url", help="server root, e.g. http://127.0.0.1:8080")
    parser.add_argument("--live", metavar="RUN_NAME", help="live mode: log one run slowly")
    parser.add_argument("--steps", type=int, default=60, help="live mode: number of steps")
    parser.add_argument("--delay", type=float, default=0.5, help="live mode: seconds per step")
    return parser.parse_args()


ARGS = parse_args()
BASE = ARGS.base_url.rstrip("/")
os.environ["MLFLOW_TRACKING_URI"] = BASE
# Never send telemetry to the internet from a test.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")
# The client retries 408/429/5xx seven times with backoff (about 4 minutes). A compatible server
# never returns those for a client error, so the test does not retry: a wrong status fails at
# once instead of hanging.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "60")

import mlflow  # noqa: E402  (imported after the environment is set)
from mlflow import MlflowClient  # noqa: E402
from mlflow.entities import Metric, Param, RunTag, ViewType  # noqa: E402
from mlflow.exceptions import MlflowException  # noqa: E402
from mlflow.utils.credentials import get_default_host_creds  # noqa: E402
from mlflow.utils.rest_utils import http_request, verify_rest_response  # noqa: E402
import mlflow.utils.request_utils as _request_utils  # noqa: E402
from urllib3.util.retry import Retry  # noqa: E402

# A pooled keep-alive connection can be closed by the server (its idle timeout) just as the
# client reuses it; every HTTP client retries such a request on a fresh connection (MLflow's
# default retries do). With retries at 0 above, the client would report that as a failure, so
# connection errors alone are retried here, a few times; statuses are never retried, so a wrong
# status still fails at once. (Metric and tag writes are idempotent, so a retried POST is safe.)
_CONNECTION_RETRY = Retry(
    total=3, connect=3, read=3, status=0, other=0, redirect=0,
    allowed_methods=None, raise_on_status=False, backoff_factor=0.05,
)
_session_for = _request_utils._get_request_session


def _session_retrying_connections(*args, **kwargs):
    session = _session_for(*args, **kwargs)
    for adapter in session.adapters.values():
        adapter.max_retries = _CONNECTION_RETRY
    return session


_request_utils._get_request_session = _session_retrying_connections

# The client checks run IDs against this pattern (mlflow/utils/validation.py).
RUN_ID_RE = re.compile(r"^[a-zA-Z0-9][\w\-]{0,255}$")
RETRIED_STATUSES = {408, 429, 500, 502, 503, 504}
SUFFIX = uuid.uuid4().hex[:8]
BASE_TS = 1_700_000_000_000  # a fixed epoch-millisecond timestamp

client = MlflowClient()


def expect_error(code, fn, *args, **kwargs):
    """Calls fn and checks that it raises an MlflowException carrying `code`."""
    try:
        fn(*args, **kwargs)
    except MlflowException as e:
        assert e.error_code == code, f"expected error_code {code}, got {e.error_code}: {e}"
        return e
    raise AssertionError(f"expected MlflowException {code}, but the call succeeded")


def raw(method, endpoint, **kwargs):
    """One HTTP request through the client's own transport (same headers and auth), no retries."""
    try:
        return http_request(get_default_host_creds(BASE), endpoint, method, max_retries=0, **kwargs)
    except MlflowException as e:
        raise AssertionError(
            f"{method} {endpoint}: the request failed in transport; the server may have "
            f"answered with a status the client retries {sorted(RETRIED_STATUSES)}: {e}"
        ) from e


def history(run_id, key):
    return client.get_metric_history(run_id, key)


def tags_of(run_id):
    return client.get_run(run_id).data.tags


def ids(runs):
    return [r.info.run_id for r in runs]


def search_all(experiment_ids, filter_string="", order_by=None, view=ViewType.ACTIVE_ONLY):
    runs = client.search_runs(
        experiment_ids, filter_string, run_view_type=view, max_results=1000, order_by=order_by
    )
    assert runs.token is None, f"expected one page, got a next_page_token {runs.token!r}"
    return list(runs)


class Scenario:
    def __init__(self):
        self.exp_name = f"compat-{SUFFIX}"
        self.exp_id = None
        self.parent_id = None
        self.search_exp = None
        self.search_runs = []  # run ids r0..r4

    # --- experiments used by the run cases ------------------------------------------------------

    def default_experiment(self):
        exp = client.get_experiment("0")
        assert exp.experiment_id == "0", f"experiment_id {exp.experiment_id!r}"
        assert exp.name == "Default", f"experiment 0 is named {exp.name!r}, expected 'Default'"
        assert exp.lifecycle_stage == "active", f"lifecycle_stage {exp.lifecycle_stage!r}"
        by_name = client.get_experiment_by_name("Default")
        assert by_name is not None, "get_experiment_by_name('Default') returned None"
        assert by_name.experiment_id == "0", f"'Default' has id {by_name.experiment_id!r}"

    def set_experiment(self):
        created = mlflow.set_experiment(self.exp_name)  # get-by-name 404, create, get
        assert created.name == self.exp_name, f"name {created.name!r}"
        assert created.lifecycle_stage == "active", f"lifecycle_stage {created.lifecycle_stage!r}"
        again = mlflow.set_experiment(self.exp_name)  # get-by-name 200
        assert again.experiment_id == created.experiment_id, (
            f"set_experiment twice gave ids {created.experiment_id!r} and {again.experiment_id!r}"
        )
        self.exp_id = created.experiment_id

    # --- one run, logged through the fluent API -------------------------------------------------

    def start_run_with_name_and_tags(self):
        run = mlflow.start_run(run_name=f"parent-{SUFFIX}", tags={"team": "ml", "purpose": "compat"})
        rid = run.info.run_id
        assert RUN_ID_RE.match(rid), f"run id {rid!r} does not match {RUN_ID_RE.pattern}"
        self.parent_id = rid
        got = client.get_run(rid)
        assert got.info.run_id == rid, f"get_run returned run_id {got.info.run_id!r}"
        assert got.info.experiment_id == self.exp_id, f"experiment_id {got.info.experiment_id!r}"
        assert got.info.run_name == f"parent-{SUFFIX}", f"run_name {got.info.run_name!r}"
        assert got.info.status == "RUNNING", f"status {got.info.status!r}"
        assert got.info.lifecycle_stage == "active", f"lifecycle_stage {got.info.lifecycle_stage!r}"
        assert got.info.start_time and got.info.start_time > 1_500_000_000_000, (
            f"start_time {got.info.start_time!r} is not epoch milliseconds"
        )
        assert got.info.end_time is None, f"end_time {got.info.end_time!r} on a running run"
        assert got.info.artifact_uri, "run.info.artifact_uri is empty"
        tags = got.data.tags
        assert tags.get("team") == "ml" and tags.get("purpose") == "compat", f"tags {tags}"
        assert tags.get("mlflow.runName") == f"parent-{SUFFIX}", f"mlflow.runName tag: {tags}"

    def log_params(self):
        mlflow.log_params({"lr": 0.001, "optimizer": "adam", "layers": 4})
        mlflow.log_param("batch size", 32)
        params = client.get_run(self.parent_id).data.params
        want = {"lr": "0.001", "optimizer": "adam", "layers": "4", "batch size": "32"}
        assert params == want, f"params {params}, expected {want}"

    def params_are_write_once(self):
        mlflow.log_param("optimizer", "adam")  # the same value again is accepted
        mlflow.log_params({"optimizer": "adam", "layers": 4})
        expect_error("INVALID_PARAMETER_VALUE", mlflow.log_param, "optimizer", "sgd")
        expect_error("INVALID_PARAMETER_VALUE", mlflow.log_params, {"layers": 5})
        params = client.get_run(self.parent_id).data.params
        assert params["optimizer"] == "adam", f"optimizer changed to {params['optimizer']!r}"
        assert params["layers"] == "4", f"layers changed to {params['layers']!r}"

    def log_metrics_over_many_steps(self):
        steps = 200
        for step in range(steps):
            mlflow.log_metrics({"train/loss": 4.0 / (step + 1), "train/acc": step / steps}, step=step)
        loss = history(self.parent_id, "train/loss")
        acc = history(self.parent_id, "train/acc")
        assert len(loss) == steps, f"train/loss has {len(loss)} points, expected {steps}"
        assert len(acc) == steps, f"train/acc has {len(acc)} points, expected {steps}"
        by_step = {m.step: m.value for m in loss}
        assert sorted(by_step) == list(range(steps)), "train/loss steps are not 0..199"
        for step in range(steps):
            assert by_step[step] == 4.0 / (step + 1), (
                f"train/loss at step {step} is {by_step[step]!r}, expected {4.0 / (step + 1)!r}"
            )
        latest = client.get_run(self.parent_id).data.metrics
        assert latest["train/loss"] == 4.0 / steps, (
            f"run.data.metrics['train/loss'] = {latest['train/loss']!r}: not the latest step's value"
        )
        assert latest["train/acc"] == (steps - 1) / steps, f"train/acc latest {latest['train/acc']}"

    def log_metric_with_explicit_timestamps(self):
        points = [  # (step, timestamp, value); int64 values beyond 2**32 on purpose
            (0, BASE_TS, 0.5),
            (1, BASE_TS + 1_000, 0.25),
            (2, BASE_TS + 2_500, 0.125),
            (10, BASE_TS + 60_000, -3.75),
            (2**40, BASE_TS + 3_600_000, 1e-300),
        ]
        for step, ts, value in points:
            mlflow.log_metric("eval/loss", value, step=step, timestamp=ts)
        got = sorted((m.step, m.timestamp, m.value) for m in history(self.parent_id, "eval/loss"))
        assert got == points, f"eval/loss history {got}, expected {points}"

    def non_finite_metric_values(self):
        # The client sends these as the JSON strings "NaN", "Infinity" and "-Infinity".
        mlflow.log_metric("odd/nan", float("nan"), step=0, timestamp=BASE_TS)
        mlflow.log_metric("odd/nan", 1.0, step=1, timestamp=BASE_TS + 1)
        mlflow.log_metric("odd/nan", float("nan"), step=2, timestamp=BASE_TS + 2)
        mlflow.log_metric("odd/inf", float("inf"), step=0, timestamp=BASE_TS)
        mlflow.log_metric("odd/inf", float("-inf"), step=1, timestamp=BASE_TS + 1)
        # A NaN is stored and comes back as NaN (the server writes it as the string "NaN").
        nan = sorted((m.step, m.timestamp, m.value) for m in history(self.parent_id, "odd/nan"))
        assert [(s, t) for s, t, _ in nan] == [(0, BASE_TS), (1, BASE_TS + 1), (2, BASE_TS + 2)], (
            f"odd/nan history {nan}"
        )
        assert math.isnan(nan[0][2]) and nan[1][2] == 1.0 and math.isnan(nan[2][2]), (
            f"odd/nan values {[v for _, _, v in nan]}"
        )
        # Trainyard's search finds runs with a NaN point (`IS NAN`; MLflow has no such test).
        found = ids(search_all([self.exp_id], "metrics.`odd/nan` IS NAN"))
        assert self.parent_id in found, f"IS NAN found {found}"
        assert self.parent_id not in ids(search_all([self.exp_id], "metrics.`odd/inf` IS NAN"))
        # The run's latest value of the key is its latest finite one.
        latest = client.get_run(self.parent_id).data.metrics.get("odd/nan")
        assert latest == 1.0, f"latest odd/nan is {latest!r}"
        inf = sorted((m.step, m.value) for m in history(self.parent_id, "odd/inf"))
        # MLflow's own SQL store clamps +/-Infinity to +/-1.7976931348623157e308 (the largest
        # double), and so does Trainyard.
        big = sys.float_info.max
        assert [s for s, _ in inf] == [0, 1], f"odd/inf history {inf}"
        assert inf[0][1] in (math.inf, big), f"+Infinity came back as {inf[0][1]!r}"
        assert inf[1][1] in (-math.inf, -big), f"-Infinity came back as {inf[1][1]!r}"

    def get_metric_history_paging(self):
        full = history(self.parent_id, "train/loss")
        # The client pages with max_results=25000 internally. Drive its store with small pages so
        # the server's next_page_token is followed several times.
        store = client._tracking_client.store
        seen, token, pages = [], None, 0
        while True:
            page = store.get_metric_history(
                self.parent_id, "train/loss", max_results=50, page_token=token
            )
            pages += 1
            assert len(page) <= 50, f"page {pages} has {len(page)} points with max_results=50"
            seen.extend((m.step, m.timestamp, m.value) for m in page)
            token = page.token
            if not token:
                break
            assert pages < 100, "get-history paging does not terminate"
        assert pages >= 4, f"200 points with max_results=50 came in {pages} page(s)"
        assert len(seen) == len(set(seen)) == 200, f"{len(seen)} points, {len(set(seen))} distinct"
        assert sorted(seen) == sorted((m.step, m.timestamp, m.value) for m in full), (
            "paged history differs from the full history"
        )
        assert history(self.parent_id, "no/such/key") == [], "unknown key should give []"

    def set_tags(self):
        mlflow.set_tags({"stage": "dev", "owner": "scenario"})
        mlflow.set_tag("transient", "yes")
        mlflow.set_tag("stage", "test")  # tags may change
        tags = tags_of(self.parent_id)
        assert tags.get("stage") == "test", f"stage tag {tags.get('stage')!r}"
        assert tags.get("owner") == "scenario", f"owner tag {tags.get('owner')!r}"
        assert tags.get("transient") == "yes", f"transient tag {tags.get('transient')!r}"
        mlflow.delete_tag("transient")
        assert "transient" not in tags_of(self.parent_id), "delete_tag left the tag"

    def artifacts(self):
        rid = self.parent_id
        work = tempfile.mkdtemp(prefix="mlflow-compat-")
        text_file = os.path.join(work, "hello.txt")
        with open(text_file, "w", encoding="utf-8") as f:
            f.write("hello from the scenario ✓\n")
        blob_file = os.path.join(work, "blob.bin")
        blob = bytes(range(256)) * 64
        with open(blob_file, "wb") as f:
            f.write(blob)
        mlflow.log_artifact(text_file)
        mlflow.log_artifact(blob_file, artifact_path="nested/dir")
        config = {"lr": 0.001, "layers": [64, 64], "name": "compat"}
        mlflow.log_dict(config, "config/params.json")
        mlflow.log_text("line one\nline two\n", "notes/readme.txt")
        expected_root = {
            ("config", True),
            ("hello.txt", False),
            ("nested", True),
            ("notes", True),
        }
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            fig = plt.figure()
            plt.plot([0, 1, 2], [3, 1, 2])
            mlflow.log_figure(fig, "plots/curve.png")
            plt.close(fig)
            expected_root.add(("plots", True))
        except ImportError:
            pass

        root = client.list_artifacts(rid)
        got_root = {(f.path, f.is_dir) for f in root}
        assert got_root == expected_root, f"root listing {sorted(got_root)}, expected {sorted(expected_root)}"
        sizes = {f.path: f.file_size for f in root}
        assert sizes["hello.txt"] == len("hello from the scenario ✓\n".encode()), (
            f"hello.txt file_size {sizes['hello.txt']!r}"
        )
        sub = client.list_artifacts(rid, "config")
        assert [(f.path, f.is_dir) for f in sub] == [("config/params.json", False)], f"config/: {sub}"
        deep = client.list_artifacts(rid, "nested/dir")
        assert [(f.path, f.file_size) for f in deep] == [("nested/dir/blob.bin", len(blob))], (
            f"nested/dir/: {deep}"
        )
        assert client.list_artifacts(rid, "hello.txt") == [], "listing a file should give []"

        dst = tempfile.mkdtemp(prefix="mlflow-compat-dl-")
        path = client.download_artifacts(rid, "config/params.json", dst)
        with open(path, encoding="utf-8") as f:
            assert json.load(f) == config, "config/params.json changed in the round trip"
        path = client.download_artifacts(rid, "hello.txt", dst)
        with open(path, encoding="utf-8") as f:
            assert f.read() == "hello from the scenario ✓\n", "hello.txt changed in the round trip"
        path = client.download_artifacts(rid, "nested", dst)  # a directory, downloaded recursively
        with open(os.path.join(path, "dir", "blob.bin"), "rb") as f:
            assert f.read() == blob, "nested/dir/blob.bin changed in the round trip"
        assert mlflow.artifacts.load_text(f"runs:/{rid}/notes/readme.txt") == "line one\nline two\n"
        assert mlflow.artifacts.load_dict(f"runs:/{rid}/config/params.json") == config
        if ("plots", True) in expected_root:
            png = client.download_artifacts(rid, "plots/curve.png", dst)
            with open(png, "rb") as f:
                assert f.read(8) == b"\x89PNG\r\n\x1a\n", "plots/curve.png is not a PNG"

    def nested_runs(self):
        child = mlflow.start_run(run_name=f"child-{SUFFIX}", nested=True)
        child_id = child.info.run_id
        mlflow.log_metric("child/metric", 1.0, step=0)
        mlflow.end_run()
        assert mlflow.active_run().info.run_id == self.parent_id, "the parent is no longer active"
        tags = tags_of(child_id)
        assert tags.get("mlflow.parentRunId") == self.parent_id, (
            f"child's mlflow.parentRunId = {tags.get('mlflow.parentRunId')!r}, expected {self.parent_id}"
        )
        assert client.get_run(child_id).info.status == "FINISHED"
        for filt in (
            f"tags.mlflow.parentRunId = '{self.parent_id}'",
            f"tags.`mlflow.parentRunId` = '{self.parent_id}'",
        ):
            found = ids(search_all([self.exp_id], filt))
            assert found == [child_id], f"search {filt!r} gave {found}, expected [{child_id}]"

    def end_run_with_each_status(self):
        mlflow.end_run()  # the parent, FINISHED by default
        info = client.get_run(self.parent_id).info
        assert info.status == "FINISHED", f"parent status {info.status!r}"
        assert info.end_time is not None and info.end_time >= info.start_time, (
            f"end_time {info.end_time!r} vs start_time {info.start_time!r}"
        )
        for status in ("FINISHED", "FAILED", "KILLED"):
            run = mlflow.start_run(run_name=f"status-{status}-{SUFFIX}")
            mlflow.end_run(status=status)
            got = client.get_run(run.info.run_id).info
            assert got.status == status, f"end_run({status!r}) left status {got.status!r}"
            assert got.end_time is not None, f"end_run({status!r}) left end_time unset"
        try:
            with mlflow.start_run(run_name=f"status-raises-{SUFFIX}") as run:
                raise ValueError("boom")
        except ValueError:
            pass
        got = client.get_run(run.info.run_id).info.status
        assert got == "FAILED", f"a run whose block raised has status {got!r}, expected FAILED"
        run = client.create_run(self.exp_id, run_name=f"status-client-{SUFFIX}")
        client.set_terminated(run.info.run_id, "KILLED")
        got = client.get_run(run.info.run_id).info.status
        assert got == "KILLED", f"set_terminated(KILLED) left status {got!r}"

    # --- search over a dedicated experiment with known runs -------------------------------------

    def build_search_fixture(self):
        self.search_exp = client.create_experiment(f"compat-{SUFFIX}-search")
        statuses = ["FINISHED", "FINISHED", "FAILED", "FINISHED", None]  # r4 stays RUNNING
        for i in range(5):
            run = client.create_run(
                self.search_exp,
                start_time=BASE_TS + i * 1_000,
                run_name=f"alpha-{i}" if i < 3 else f"beta-{i}",
                tags={"t": f"t{i}", "my.tag": "yes" if i in (0, 2) else "no"},
            )
            rid = run.info.run_id
            client.log_batch(
                rid,
                metrics=[
                    Metric("x", float(i * 10), BASE_TS + i, 0),
                    Metric("val/loss", 1.0 / (i + 1), BASE_TS + i, 0),
                ],
                params=[Param("p", f"v{i % 2}")],
            )
            if statuses[i]:
                client.set_terminated(rid, statuses[i], end_time=BASE_TS + i * 1_000 + 500)
            self.search_runs.append(rid)

    def search_runs_filters(self):
        r = self.search_runs
        cases = [
            ("metrics.x > 15", {r[2], r[3], r[4]}),
            ("params.p = 'v1'", {r[1], r[3]}),
            ("tags.t = 't2'", {r[2]}),
            ("attributes.status = 'FINISHED'", {r[0], r[1], r[3]}),
            ("attributes.status = 'RUNNING'", {r[4]}),
            ("attributes.run_name LIKE 'alpha-%'", {r[0], r[1], r[2]}),
            (f"attributes.run_id IN ('{r[1]}', '{r[3]}')", {r[1], r[3]}),
            ("metrics.`val/loss` < 0.3", {r[3], r[4]}),
            ("tags.`my.tag` = 'yes'", {r[0], r[2]}),
            ("metrics.x >= 10 AND params.p = 'v0'", {r[2], r[4]}),
            ("metrics.x >= 10 AND params.p = 'v0' AND attributes.status = 'RUNNING'", {r[4]}),
            ("", set(r)),
        ]
        for filt, want in cases:
            got = ids(search_all([self.search_exp], filt))
            assert len(got) == len(set(got)), f"search {filt!r} returned duplicates {got}"
            assert set(got) == want, (
                f"search {filt!r} gave {sorted(got)}, expected {sorted(want)}"
            )
        frame = mlflow.search_runs([self.search_exp], filter_string="metrics.x > 15")
        assert sorted(frame["metrics.x"].tolist()) == [20.0, 30.0, 40.0], (
            f"fluent search_runs metrics.x column {frame['metrics.x'].tolist()}"
        )

    def search_runs_order_and_paging(self):
        r = self.search_runs
        got = ids(search_all([self.search_exp], order_by=["metrics.x DESC"]))
        assert got == [r[4], r[3], r[2], r[1], r[0]], f"order_by metrics.x DESC gave {got}"
        got = ids(search_all([self.search_exp], order_by=["attributes.start_time ASC"]))
        assert got == r, f"order_by attributes.start_time ASC gave {got}"
        got = ids(search_all([self.search_exp]))
        assert got == r[::-1], f"default order (start_time DESC) gave {got}"
        collected, token, pages = [], None, 0
        while True:
            page = client.search_runs(
                [self.search_exp], "", max_results=2, order_by=["metrics.x DESC"], page_token=token
            )
            pages += 1
            assert len(page) <= 2, f"page {pages} has {len(page)} runs with max_results=2"
            collected.extend(ids(page))
            token = page.token
            if not token:
                break
            assert pages < 20, "search_runs paging does not terminate"
        assert collected == [r[4], r[3], r[2], r[1], r[0]], f"paged search gave {collected}"
        assert pages == 3, f"5 runs in pages of 2 came in {pages} pages"

    def delete_and_restore_run(self):
        r = self.search_runs
        victim = r[4]
        client.delete_run(victim)
        active = ids(search_all([self.search_exp]))
        assert victim not in active and len(active) == 4, f"after delete, active search {active}"
        deleted = ids(search_all([self.search_exp], view=ViewType.DELETED_ONLY))
        assert deleted == [victim], f"DELETED_ONLY search gave {deleted}"
        every = ids(search_all([self.search_exp], view=ViewType.ALL))
        assert set(every) == set(r), f"ALL search gave {every}"
        stage = client.get_run(victim).info.lifecycle_stage
        assert stage == "deleted", f"deleted run has lifecycle_stage {stage!r}"
        client.restore_run(victim)
        stage = client.get_run(victim).info.lifecycle_stage
        assert stage == "active", f"restored run has lifecycle_stage {stage!r}"
        assert victim in ids(search_all([self.search_exp])), "restored run missing from search"
        assert ids(search_all([self.search_exp], view=ViewType.DELETED_ONLY)) == []

    # --- MlflowClient experiment operations -----------------------------------------------------

    def experiment_operations(self):
        prefix = f"compat-{SUFFIX}-exp-"
        made = {}
        for letter in ("b", "a", "c"):
            made[letter] = client.create_experiment(prefix + letter, tags={"letter": letter, "k": "v"})
        exp = client.get_experiment(made["a"])
        assert exp.name == prefix + "a", f"get_experiment name {exp.name!r}"
        assert exp.tags.get("letter") == "a" and exp.tags.get("k") == "v", f"tags {exp.tags}"
        assert exp.lifecycle_stage == "active", f"lifecycle_stage {exp.lifecycle_stage!r}"
        exp = client.get_experiment_by_name(prefix + "b")
        assert exp is not None and exp.experiment_id == made["b"], f"get_experiment_by_name: {exp}"
        assert client.get_experiment_by_name(f"compat-{SUFFIX}-absent") is None
        expect_error("RESOURCE_ALREADY_EXISTS", client.create_experiment, prefix + "a")

        like = f"name LIKE '{prefix}%'"
        found = [e.name for e in client.search_experiments(filter_string=like, order_by=["name ASC"])]
        assert found == [prefix + x for x in "abc"], f"search name ASC gave {found}"
        found = [e.name for e in client.search_experiments(filter_string=like, order_by=["name DESC"])]
        assert found == [prefix + x for x in "cba"], f"search name DESC gave {found}"
        collected, token, pages = [], None, 0
        while True:
            page = client.search_experiments(
                max_results=1, filter_string=like, order_by=["name ASC"], page_token=token
            )
            pages += 1
            collected.extend(e.name for e in page)
            token = page.token
            if not token:
                break
            assert pages < 10, "search_experiments paging does not terminate"
        assert collected == [prefix + x for x in "abc"], f"paged search_experiments gave {collected}"

        client.rename_experiment(made["c"], prefix + "renamed")
        assert client.get_experiment(made["c"]).name == prefix + "renamed"
        assert client.get_experiment_by_name(prefix + "c") is None, "old name still resolves"

        client.set_experiment_tag(made["a"], "note", "hello")
        assert client.get_experiment(made["a"]).tags.get("note") == "hello"
        client.delete_experiment_tag(made["a"], "note")
        assert "note" not in client.get_experiment(made["a"]).tags, "delete_experiment_tag left it"

        client.delete_experiment(made["b"])
        assert client.get_experiment(made["b"]).lifecycle_stage == "deleted"
        active = [e.name for e in client.search_experiments(filter_string=like)]
        assert prefix + "b" not in active, f"deleted experiment in the default search: {active}"
        gone = [e.name for e in client.search_experiments(view_type=ViewType.DELETED_ONLY, filter_string=like)]
        assert gone == [prefix + "b"], f"DELETED_ONLY search gave {gone}"
        client.restore_experiment(made["b"])
        assert client.get_experiment(made["b"]).lifecycle_stage == "active"
        active = [e.name for e in client.search_experiments(filter_string=like)]
        assert prefix + "b" in active, f"restored experiment missing from search: {active}"

    # --- errors and limits ----------------------------------------------------------------------

    def missing_run_error(self):
        missing = "0" * 32
        e = expect_error("RESOURCE_DOES_NOT_EXIST", client.get_run, missing)
        assert missing in str(e) or "not found" in str(e).lower() or "exist" in str(e).lower(), str(e)
        expect_error("RESOURCE_DOES_NOT_EXIST", client.log_metric, missing, "m", 1.0)
        expect_error("RESOURCE_DOES_NOT_EXIST", client.get_experiment, "987654321")
        resp = raw("GET", "/api/2.0/mlflow/runs/get", params={"run_id": missing})
        assert resp.status_code == 404, f"missing run: HTTP {resp.status_code}, expected 404"
        assert resp.json().get("error_code") == "RESOURCE_DOES_NOT_EXIST", resp.text

    def log_batch_limits(self):
        rid = client.create_run(self.exp_id, run_name=f"limits-{SUFFIX}").info.run_id
        too_many = [{"key": "lim", "value": 1.0, "timestamp": BASE_TS, "step": i} for i in range(1001)]
        cases = [
            ({"run_id": rid, "metrics": too_many}, "1001 metrics"),
            ({"run_id": rid, "params": [{"key": f"p{i}", "value": "1"} for i in range(101)]}, "101 params"),
            ({"run_id": rid, "tags": [{"key": f"t{i}", "value": "1"} for i in range(101)]}, "101 tags"),
            ({"run_id": rid, "metrics": too_many[:1000], "tags": [{"key": "t", "value": "v"}]},
             "1000 metrics + 1 tag"),
        ]
        for body, what in cases:
            resp = raw("POST", "/api/2.0/mlflow/runs/log-batch", json=body)
            assert resp.status_code == 400, f"log-batch with {what}: HTTP {resp.status_code}, expected 400"
            try:
                verify_rest_response(resp, "/api/2.0/mlflow/runs/log-batch")
            except MlflowException as e:
                assert e.error_code == "INVALID_PARAMETER_VALUE", f"{what}: error_code {e.error_code}"
            else:
                raise AssertionError(f"{what}: the client did not raise")
        assert history(rid, "lim") == [], "a rejected batch stored metrics"
        run = client.get_run(rid)
        assert not run.data.params and "t" not in run.data.tags, "a rejected batch stored params/tags"
        # The client splits large batches by itself, so 1001 metrics through it are fine.
        client.log_batch(rid, metrics=[Metric("lim", float(i), BASE_TS + i, i) for i in range(1001)])
        assert len(history(rid, "lim")) == 1001, "client-side split batches lost points"
        client.set_terminated(rid)

    def client_times(self):
        run = client.create_run(self.exp_id, start_time=BASE_TS, run_name=f"times-{SUFFIX}")
        rid = run.info.run_id
        assert run.info.start_time == BASE_TS, f"create_run(start_time) gave {run.info.start_time}"
        client.set_terminated(rid, end_time=BASE_TS + 5000)
        info = client.get_run(rid).info
        assert (info.start_time, info.end_time) == (BASE_TS, BASE_TS + 5000), (
            f"start/end {info.start_time}/{info.end_time}, expected {BASE_TS}/{BASE_TS + 5000}"
        )
        # A time in microseconds by mistake is refused naming the field, and creates nothing.
        e = expect_error("INVALID_PARAMETER_VALUE", client.create_run, self.exp_id,
                         start_time=BASE_TS * 1000, run_name=f"times-ns-{SUFFIX}")
        assert "start_time" in str(e), str(e)
        assert not search_all([self.exp_id], f"attributes.run_name = 'times-ns-{SUFFIX}'")

    # --- the model registry ---------------------------------------------------------------------

    def model_registry(self):
        name = f"compat-model-{SUFFIX}"
        other = f"compat-model-{SUFFIX}-b"
        weights = bytes(range(256)) * 16
        work = tempfile.mkdtemp(prefix="mlflow-compat-model-")
        model_dir = os.path.join(work, "model")
        os.makedirs(model_dir)
        # What register_model looks for: an MLmodel file in the run's artifact folder.
        with open(os.path.join(model_dir, "MLmodel"), "w", encoding="utf-8") as f:
            f.write("artifact_path: model\nflavors: {}\n")
        with open(os.path.join(model_dir, "weights.bin"), "wb") as f:
            f.write(weights)
        with mlflow.start_run(experiment_id=self.exp_id, run_name=f"model-{SUFFIX}") as run:
            mlflow.log_artifacts(model_dir, "model")
        rid = run.info.run_id

        v1 = mlflow.register_model(f"runs:/{rid}/model", name)  # creates the model, then v1
        assert (v1.name, v1.version, v1.run_id) == (name, "1", rid), f"register_model gave {v1}"
        assert v1.status == "READY", f"status {v1.status!r}"
        assert v1.source.endswith(f"/{rid}/artifacts/model"), f"source {v1.source!r}"
        again = mlflow.register_model(f"runs:/{rid}/model", name)  # the model exists: v2
        assert again.version == "2", f"second register_model gave version {again.version!r}"

        client.create_registered_model(other, tags={"team": "nlp"}, description="the other one")
        expect_error("RESOURCE_ALREADY_EXISTS", client.create_registered_model, other)
        v3 = client.create_model_version(
            name, f"runs:/{rid}/model", run_id=rid, tags={"eval": "0.91"}, description="tuned"
        )
        assert v3.version == "3" and v3.tags == {"eval": "0.91"}, f"create_model_version gave {v3}"
        client.set_registered_model_alias(name, "champion", v3.version)
        client.set_registered_model_alias(name, "previous", "1")
        got = client.get_model_version_by_alias(name, "champion")
        assert (got.version, got.run_id, got.description) == ("3", rid, "tuned"), f"by alias: {got}"
        assert got.aliases == ["champion"], f"aliases of v3: {got.aliases}"
        model = client.get_registered_model(name)
        assert model.aliases == {"champion": "3", "previous": "1"}, f"aliases {model.aliases}"
        assert [v.version for v in model.latest_versions] == ["3"], model.latest_versions

        # models:/NAME@ALIAS downloads the version's files.
        dst = mlflow.artifacts.download_artifacts(
            f"models:/{name}@champion", dst_path=tempfile.mkdtemp(prefix="mlflow-compat-dl-")
        )
        with open(os.path.join(dst, "weights.bin"), "rb") as f:
            assert f.read() == weights, "weights.bin changed in the round trip through the registry"
        uri = client.get_model_version_download_uri(name, "1")
        assert uri.startswith("mlflow-artifacts:/") and uri.endswith(f"/{rid}/artifacts/model"), uri

        # The client adds ``tags.`mlflow.prompt.is_prompt` != 'true'`` to every model search.
        found = client.search_registered_models(f"name LIKE 'compat-model-{SUFFIX}%'")
        assert sorted(m.name for m in found) == [name, other], f"search by LIKE: {found}"
        found = client.search_registered_models(f"name = '{other}'")
        assert [m.name for m in found] == [other], f"search by name: {found}"
        found = client.search_registered_models(f"tags.team = 'nlp' AND name LIKE '%{SUFFIX}%'")
        assert [m.name for m in found] == [other], f"search by tag: {found}"
        versions = client.search_model_versions(f"name = '{name}'")
        assert sorted(int(v.version) for v in versions) == [1, 2, 3], f"versions {versions}"
        by_run = client.search_model_versions(f"run_id = '{rid}'")
        assert {(v.name, v.version) for v in by_run} == {(name, "1"), (name, "2"), (name, "3")}, by_run

        client.delete_model_version(name, "1")
        expect_error("RESOURCE_DOES_NOT_EXIST", client.get_model_version, name, "1")
        expect_error("RESOURCE_DOES_NOT_EXIST", client.get_model_version_by_alias, name, "previous")
        client.delete_registered_model_alias(name, "champion")
        assert client.get_registered_model(name).aliases == {}, "delete_registered_model_alias"
        client.delete_registered_model(name)
        client.delete_registered_model(other)
        expect_error("RESOURCE_DOES_NOT_EXIST", client.get_registered_model, name)
        # The run and its files stay.
        assert client.get_run(rid).info.run_id == rid


def live(run_name, steps, delay):
    run = mlflow.start_run(experiment_id="0", run_name=run_name)
    print(f"RUN_ID {run.info.run_id}", flush=True)
    try:
        for step in range(steps):
            mlflow.log_metric("train/loss", 4.0 * math.exp(-step / max(steps / 4, 1)) + 0.1, step=step)
            if step + 1 < steps:
                time.sleep(delay)
    except BaseException:
        mlflow.end_run(status="KILLED")
        raise
    mlflow.end_run()
    print(f"DONE {run.info.run_id}", flush=True)


def main():
    if ARGS.live:
        live(ARGS.live, ARGS.steps, ARGS.delay)
        return 0
    s = Scenario()
    cases = [
        ("experiment 0 is the Default experiment", s.default_experiment),
        ("set_experiment creates, then finds, an experiment by name", s.set_experiment),
        ("start_run with a name and tags", s.start_run_with_name_and_tags),
        ("log_params", s.log_params),
        ("params are write-once (same value ok, new value INVALID_PARAMETER_VALUE)", s.params_are_write_once),
        ("log_metrics over 200 steps of 2 keys", s.log_metrics_over_many_steps),
        ("log_metric with explicit timestamps and steps round-trips", s.log_metric_with_explicit_timestamps),
        ("a NaN is stored, read back and found by IS NAN; +/-Infinity is clamped as MLflow does", s.non_finite_metric_values),
        ("get_metric_history pages with next_page_token", s.get_metric_history_paging),
        ("set_tags, set_tag, delete_tag", s.set_tags),
        ("log_artifact, log_dict, log_text, log_figure; list and download round-trip", s.artifacts),
        ("nested run carries mlflow.parentRunId and is found by it", s.nested_runs),
        ("end_run with FINISHED, FAILED, KILLED; exception -> FAILED", s.end_run_with_each_status),
        ("search fixture: 5 runs with metrics, params, tags, statuses", s.build_search_fixture),
        ("search_runs filters (>, =, LIKE, IN, backticks, AND)", s.search_runs_filters),
        ("search_runs order_by and MlflowClient paging", s.search_runs_order_and_paging),
        ("delete_run / restore_run and run_view_type", s.delete_and_restore_run),
        ("MlflowClient experiment operations", s.experiment_operations),
        ("missing run raises RESOURCE_DOES_NOT_EXIST", s.missing_run_error),
        ("log-batch limits raise INVALID_PARAMETER_VALUE and store nothing", s.log_batch_limits),
        ("create_run(start_time) and set_terminated(end_time) keep the client's times", s.client_times),
        ("model registry: register, version, alias, models:/ download, search, delete", s.model_registry),
    ]
    started = time.monotonic()
    for name, case in cases:
        t0 = time.monotonic()
        try:
            case()
        except Exception as e:  # noqa: BLE001  (any failure ends the scenario)
            traceback.print_exc()
            print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
            return 1
        print(f"ok   {name} ({time.monotonic() - t0:.2f}s)", flush=True)
    print(f"all {len(cases)} cases passed in {time.monotonic() - started:.1f}s against {BASE}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
