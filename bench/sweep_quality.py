#!/usr/bin/env python3
"""Sweep quality through the product: `trainyard serve` runs command sweeps of an analytic test
function (Branin, 2-d, minimum 0.397887), one trial at a time, for random search and TPE over
several seeds, and the best value each sweep found is read back from its API. The library's own
measurement (`cargo run --release -p trainyard-sweep --example quality`) runs the same search
code without the server; this checks that what users run finds what the library promises.

usage: bench/sweep_quality.py TRAINYARD_BIN [--trials 30] [--seeds 5]
"""
import argparse, json, math, os, socket, statistics, subprocess, sys, tempfile, time
import urllib.request

TRIAL = r'''import json, math, os, sys, urllib.request
a = dict(s[2:].split("=", 1) for s in sys.argv[1:])
x1, x2 = float(a["x1"]), float(a["x2"])
f = (x2 - 5.1 / (4 * math.pi ** 2) * x1 ** 2 + 5 / math.pi * x1 - 6) ** 2 \
    + 10 * (1 - 1 / (8 * math.pi)) * math.cos(x1) + 10
url = os.environ["TRAINYARD_SERVER_URL"] + "/api/v1/runs/" + os.environ["TRAINYARD_RUN_ID"] + "/metrics"
body = json.dumps({"points": [{"key": "loss", "step": 0, "value": f}]}).encode()
urllib.request.urlopen(urllib.request.Request(url, body, {"content-type": "application/json"}))
'''


def call(base, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data, {"content-type": "application/json"}, method=method)
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("bin")
    p.add_argument("--trials", type=int, default=30)
    p.add_argument("--seeds", type=int, default=5)
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="sweep-quality-")
    script = os.path.join(work, "branin.py")
    with open(script, "w") as f:
        f.write(TRIAL)
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [args.bin, "serve", "--addr", f"127.0.0.1:{port}", "--data-dir", os.path.join(work, "data"),
         "--cpu-slots", "1", "--gpus", "0", "--allow-command-launch"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                call(base, "GET", "/healthz"); break
            except Exception:
                time.sleep(0.1)
        rows = []
        for method in ("random", "tpe"):
            bests = []
            for seed in range(args.seeds):
                spec = {
                    "name": f"branin-{method}-{seed}", "experiment": "quality",
                    "base": {"command": [sys.executable, script]},
                    "metric": {"name": "loss", "goal": "minimize"}, "method": method,
                    "parameters": {"x1": {"distribution": "uniform", "min": -5, "max": 10},
                                   "x2": {"distribution": "uniform", "min": 0, "max": 15}},
                    "max_trials": args.trials, "parallel": 1, "seed": seed,
                }
                sweep = call(base, "POST", "/api/v1/sweeps", {"spec": spec})
                while sweep["state"] not in ("finished", "stopped"):
                    time.sleep(0.5)
                    sweep = call(base, "GET", f"/api/v1/sweeps/{sweep['id']}")
                assert sweep["counts"]["complete"] == args.trials, sweep["counts"]
                bests.append(sweep["best"]["value"])
                print(f"{method} seed {seed}: best {sweep['best']['value']:.4f}", file=sys.stderr)
            rows.append((method, statistics.mean(bests), statistics.stdev(bests)))
        print(f"| method | trials | seeds | best Branin value (mean ± std) |")
        print(f"|---|---|---|---|")
        for method, mean, std in rows:
            print(f"| {method} | {args.trials} | {args.seeds} | {mean:.4f} ± {std:.4f} |")
    finally:
        server.terminate(); server.wait()


if __name__ == "__main__":
    main()
