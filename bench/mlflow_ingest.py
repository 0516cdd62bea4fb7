#!/usr/bin/env python3
"""Benchmarks metric ingest and metric-history reads against any MLflow-compatible tracking server.

usage: mlflow_ingest.py BASE_URL [--label NAME] [--clients 4] [--batches 50] [--keys 10]
                        [--steps-per-batch 100] [--warmup-batches 2] [--history-points 5000]
                        [--history-reps 20] [--history-max-results N]

Run it with the MLflow venv's python (scripts/mlflow-venv.sh); it only needs `requests`.

1. Setup (not timed). Creates an experiment and one run per client, plus a run holding
   --history-points points of one key.
2. Ingest. --clients worker processes first post --warmup-batches untimed batches on other keys,
   then start together. Each POSTs --batches requests to
   /api/2.0/mlflow/runs/log-batch. A batch holds --keys x --steps-per-batch metrics (1,000 by
   default, MLflow's per-request limit), and every batch carries new steps. The result is total
   points / wall seconds, where the wall time runs from the common start to the last response.
3. History. One client GETs /api/2.0/mlflow/metrics/get-history?run_id=..&metric_key=.. for the
   history key and follows next_page_token until the last page. It reads the full history
   --history-reps times, after one untimed warm-up read.

It prints one JSON line with the figures. MLFLOW_TRACKING_TOKEN, if set, is sent as a bearer token.

Why raw HTTP (requests.Session) rather than MlflowClient: the client adds its own per-call work.
That work includes proto conversion, entity objects, the client-side batch splitting and validation,
and a retry adapter. It would take part of the client machine's CPU that the two servers do not
share equally. With one pre-encoded request body and a keep-alive Session per process, the
client-side cost is the same small constant for both servers, so the figures compare the servers.
Worker processes (multiprocessing), not threads, keep the GIL from limiting the client side.
"""

import argparse
import json
import math
import multiprocessing as mp
import os
import queue
import statistics
import sys
import time
import uuid

import requests

API = "/api/2.0/mlflow"
BASE_TS = 1_700_000_000_000


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("base_url")
    p.add_argument("--label", default="", help="name of the server, copied into the output")
    p.add_argument("--clients", type=int, default=4, help="ingest worker processes")
    p.add_argument("--batches", type=int, default=50, help="log-batch requests per client")
    p.add_argument("--keys", type=int, default=10, help="metric keys per batch")
    p.add_argument("--steps-per-batch", type=int, default=100, help="new steps per batch")
    p.add_argument("--warmup-batches", type=int, default=2, help="untimed batches per client first")
    p.add_argument("--history-points", type=int, default=5000, help="points in the history key")
    p.add_argument("--history-reps", type=int, default=20, help="timed full-history reads")
    p.add_argument(
        "--history-max-results", type=int, default=None,
        help="send max_results on get-history (the MLflow client sends 25000); default: omitted",
    )
    p.add_argument("--timeout", type=float, default=120.0, help="per-request timeout, seconds")
    p.add_argument(
        "--native", action="store_true",
        help="ingest through Trainyard's native API (POST /api/v1/runs/{id}/metrics, the same "
        "points) instead of log-batch, to compare the two paths of one server",
    )
    return p.parse_args()


def session():
    s = requests.Session()
    s.headers["Content-Type"] = "application/json"
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    if token:
        s.headers["Authorization"] = f"Bearer {token}"
    return s


def check(resp, what):
    if resp.status_code != 200:
        raise SystemExit(f"{what}: HTTP {resp.status_code}: {resp.text[:500]}")
    return resp.json() if resp.content else {}


def post(s, base, endpoint, body, timeout):
    return check(s.post(base + API + endpoint, data=json.dumps(body), timeout=timeout), endpoint)


def batch_body(run_id, keys, batch_index, steps_per_batch, prefix="bench", native=False):
    """One log-batch request body: `keys` keys x `steps_per_batch` new steps (with `native`, the
    same points as Trainyard's native metrics body)."""
    first = batch_index * steps_per_batch
    metrics = []
    for step in range(first, first + steps_per_batch):
        ts = BASE_TS + step
        for k in range(keys):
            value = math.sin(step * 0.001 + k) * 2.0 + 1.0 / (1 + step)  # varied doubles
            if native:
                metrics.append({"key": f"{prefix}/k{k}", "value": value, "time": ts, "step": step})
            else:
                metrics.append({"key": f"{prefix}/k{k}", "value": value, "timestamp": ts, "step": step})
    if native:
        return json.dumps({"points": metrics}).encode()
    return json.dumps({"run_id": run_id, "metrics": metrics}).encode()


def ingest_worker(args, run_id, barrier, out):
    """One client process: pre-encodes its bodies, waits for the others, then posts them all."""
    try:
        out.put(ingest(args, run_id, barrier))
    except BaseException as e:  # noqa: BLE001  (report anything, and release the others)
        barrier.abort()
        out.put({"error": f"{type(e).__name__}: {e}"})


def ingest(args, run_id, barrier):
    s = session()
    if args.native:
        url = f"{args.base_url}/api/v1/runs/{run_id}/metrics"
    else:
        url = args.base_url + API + "/runs/log-batch"
    bodies = [
        batch_body(run_id, args.keys, b, args.steps_per_batch, native=args.native)
        for b in range(args.batches)
    ]
    # Untimed warm-up: open the keep-alive connection and let the server load what it loads lazily
    # (MLflow's worker processes import on first use), on keys the measurement does not touch.
    for b in range(args.warmup_batches):
        body = batch_body(run_id, args.keys, b, args.steps_per_batch, prefix="warm", native=args.native)
        check(s.post(url, data=body, timeout=args.timeout), "warm-up log-batch")
    latencies = []
    barrier.wait(timeout=600)
    start = time.monotonic()
    for body in bodies:
        t0 = time.monotonic()
        resp = s.post(url, data=body, timeout=args.timeout)
        latencies.append(time.monotonic() - t0)
        if resp.status_code != 200:
            return {"error": f"log-batch: HTTP {resp.status_code}: {resp.text[:300]}"}
    return {"start": start, "end": time.monotonic(), "latencies": latencies}


def read_history(s, args, run_id, key):
    """Reads one key's full history, following next_page_token. Returns (points, requests)."""
    points, requests_made, token = 0, 0, None
    while True:
        params = {"run_id": run_id, "metric_key": key}
        if args.history_max_results:
            params["max_results"] = args.history_max_results
        if token:
            params["page_token"] = token
        body = check(
            s.get(args.base_url + API + "/metrics/get-history", params=params, timeout=args.timeout),
            "get-history",
        )
        requests_made += 1
        points += len(body.get("metrics", []))
        token = body.get("next_page_token")
        if not token:
            return points, requests_made
        if requests_made > 100_000:
            raise SystemExit("get-history paging does not terminate")


def main():
    args = parse_args()
    args.base_url = args.base_url.rstrip("/")
    s = session()
    tag = uuid.uuid4().hex[:8]

    # --- setup (untimed) ---
    exp_id = post(s, args.base_url, "/experiments/create", {"name": f"bench-{tag}"}, args.timeout)[
        "experiment_id"
    ]

    def create_run(name):
        body = {"experiment_id": exp_id, "run_name": name, "start_time": int(time.time() * 1000)}
        return post(s, args.base_url, "/runs/create", body, args.timeout)["run"]["info"]["run_id"]

    run_ids = [create_run(f"ingest-{i}") for i in range(args.clients)]
    hist_run = create_run("history")
    hist_key = "hist/loss"
    for first in range(0, args.history_points, 1000):
        n = min(1000, args.history_points - first)
        metrics = [
            {"key": hist_key, "value": 1.0 / (1 + step), "timestamp": BASE_TS + step, "step": step}
            for step in range(first, first + n)
        ]
        post(s, args.base_url, "/runs/log-batch", {"run_id": hist_run, "metrics": metrics}, args.timeout)

    # --- ingest ---
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(args.clients)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=ingest_worker, args=(args, run_ids[i], barrier, out))
        for i in range(args.clients)
    ]
    for p in procs:
        p.start()
    deadline = 600 + args.batches * args.timeout
    try:
        results = [out.get(timeout=deadline) for _ in procs]
    except queue.Empty:
        raise SystemExit("ingest workers did not report back")
    for p in procs:
        p.join()
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise SystemExit("ingest failed: " + "; ".join(errors))
    wall = max(r["end"] for r in results) - min(r["start"] for r in results)
    points = args.clients * args.batches * args.keys * args.steps_per_batch
    latencies = sorted(x for r in results for x in r["latencies"])

    # The data must really be there: every client's key 0 holds batches x steps points.
    expect = args.batches * args.steps_per_batch
    for rid in run_ids:
        got, _ = read_history(s, args, rid, "bench/k0")
        if got != expect:
            raise SystemExit(f"run {rid}: bench/k0 has {got} points after ingest, expected {expect}")

    # --- history reads ---
    got, _ = read_history(s, args, hist_run, hist_key)  # warm-up, and a check
    if got != args.history_points:
        raise SystemExit(f"history key has {got} points, expected {args.history_points}")
    h_requests = 0
    t0 = time.monotonic()
    for _ in range(args.history_reps):
        _, n = read_history(s, args, hist_run, hist_key)
        h_requests += n
    h_wall = time.monotonic() - t0

    def pct(p):
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))]

    print(json.dumps({
        "label": args.label,
        "base_url": args.base_url,
        "clients": args.clients,
        "batches_per_client": args.batches,
        "metrics_per_batch": args.keys * args.steps_per_batch,
        "ingest_points": points,
        "ingest_wall_s": round(wall, 3),
        "ingest_metrics_per_s": round(points / wall, 1),
        "ingest_batch_ms_p50": round(statistics.median(latencies) * 1000, 2),
        "ingest_batch_ms_p95": round(pct(0.95) * 1000, 2),
        "history_points": args.history_points,
        "history_max_results": args.history_max_results,
        "history_reads": args.history_reps,
        "history_requests": h_requests,
        "history_wall_s": round(h_wall, 3),
        "history_reads_per_s": round(args.history_reps / h_wall, 2),
        "history_requests_per_s": round(h_requests / h_wall, 2),
        "history_points_per_s": round(args.history_reps * args.history_points / h_wall, 1),
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
