#!/usr/bin/env python3
"""Sweep search quality, side by side with Optuna.

Library mode (the default): the same three functions, budgets and seeds are searched by
Trainyard's search library (random, tpe, bayes; through `cargo run --release -p trainyard-sweep
--example search`, trials one after another) and by Optuna's samplers (its default TPE, which
models the parameters jointly, TPE with one parameter at a time, and its GP sampler), each in a
fresh study per seed. The table gives the mean ± standard deviation over seeds of the best
value found after each budget (a 50-trial run's first 30 trials are its 30-trial run: no
sampler here knows the budget). Optuna runs in the virtual environment bench/optuna-venv.sh
makes.

  bench/sweep_quality.py [--trials 50] [--seeds 10] [--budgets 30,50]
                         [--functions branin,hartmann6,mixed] [--timing]

Product mode: `trainyard serve` runs command sweeps of Branin (each trial a Python program
reporting its value through the API), one trial at a time, and each sweep's best value is read
back from its API; these equal, seed for seed, what the library alone finds.

  bench/sweep_quality.py --server target/debug/trainyard [--trials 30] [--seeds 5]
                         [--methods random,tpe,bayes]

The functions (the library's own are in sweep/src/testfns.rs; these are the same):
  branin     2-d, x1 in [-5, 10], x2 in [0, 15]; minimum 0.397887.
  hartmann6  6-d on [0, 1]^6; minimum -3.32237.
  mixed      5 parameters: optimizer (categorical, 4 choices), lr (log-uniform [1e-5, 1]),
             depth (integer 1..8), width (integer 8..1024, log scale), dropout ([0, 0.6]);
             a synthetic training loss whose best lr depends on the optimizer, best width on
             the depth, best dropout on the width; minimum 0.
"""
import argparse, json, math, os, platform, socket, statistics, subprocess, sys, tempfile, time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ---------------------------------------------------------------- the functions (as testfns.rs)

def branin(x1, x2):
    return (x2 - 5.1 / (4 * math.pi ** 2) * x1 ** 2 + 5 / math.pi * x1 - 6) ** 2 \
        + 10 * (1 - 1 / (8 * math.pi)) * math.cos(x1) + 10


H_ALPHA = [1.0, 1.2, 3.0, 3.2]
H_A = [[10, 3, 17, 3.5, 1.7, 8], [0.05, 10, 17, 0.1, 8, 14],
       [3, 3.5, 1.7, 10, 17, 8], [17, 8, 0.05, 10, 0.1, 14]]
H_P = [[0.1312, 0.1696, 0.5569, 0.0124, 0.8283, 0.5886],
       [0.2329, 0.4135, 0.8307, 0.3736, 0.1004, 0.9991],
       [0.2348, 0.1451, 0.3522, 0.2883, 0.3047, 0.6650],
       [0.4047, 0.8828, 0.8732, 0.5743, 0.1091, 0.0381]]


def hartmann6(x):
    return -sum(H_ALPHA[i] * math.exp(-sum(H_A[i][j] * (x[j] - H_P[i][j]) ** 2 for j in range(6)))
                for i in range(4))


MIXED_OPTIMIZERS = [("sgd", -1.0, 0.8), ("momentum", -1.7, 0.4), ("adam", -3.0, 0.1),
                    ("adamw", -2.8, 0.0)]


def mixed(optimizer, lr, depth, width, dropout):
    _, best_lr, floor = next(o for o in MIXED_OPTIMIZERS if o[0] == optimizer)
    log_width = math.log2(width)
    return floor + 0.5 * (math.log10(lr) - best_lr) ** 2 + 0.15 * (depth - 5) ** 2 \
        + 0.25 * (log_width - (4 + 0.6 * depth)) ** 2 \
        + 4 * (dropout - (0.1 + 0.05 * (log_width - 3))) ** 2


MINIMA = {"branin": 0.397887, "hartmann6": -3.32237, "mixed": 0.0}
NAMES = {"branin": "Branin", "hartmann6": "Hartmann-6", "mixed": "Mixed-5 (int, log-int, categorical)"}


def optuna_objective(function):
    def f(trial):
        if function == "branin":
            return branin(trial.suggest_float("x1", -5, 10), trial.suggest_float("x2", 0, 15))
        if function == "hartmann6":
            return hartmann6([trial.suggest_float(f"x{i}", 0, 1) for i in range(6)])
        return mixed(trial.suggest_categorical("optimizer", [o[0] for o in MIXED_OPTIMIZERS]),
                     trial.suggest_float("lr", 1e-5, 1, log=True),
                     trial.suggest_int("depth", 1, 8),
                     trial.suggest_int("width", 8, 1024, log=True),
                     trial.suggest_float("dropout", 0, 0.6))
    return f


# ---------------------------------------------------------------- Optuna (runs in its venv)

def optuna_worker(args):
    import warnings
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore")
    samplers = {
        "optuna-tpe": lambda s: optuna.samplers.TPESampler(seed=s),
        "optuna-tpe-independent": lambda s: optuna.samplers.TPESampler(seed=s, multivariate=False),
        "optuna-gp": lambda s: optuna.samplers.GPSampler(seed=s),
        "optuna-random": lambda s: optuna.samplers.RandomSampler(seed=s),
    }
    for function in args.functions.split(","):
        for method in args.optuna_methods.split(","):
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                study = optuna.create_study(sampler=samplers[method](seed))
                start = time.time()
                study.optimize(optuna_objective(function), n_trials=args.trials)
                best, bests = math.inf, []
                for t in study.trials:
                    best = min(best, t.value)
                    bests.append(best)
                print(json.dumps({"function": function, "method": method, "seed": seed,
                                  "best": bests, "seconds": time.time() - start}), flush=True)


def optuna_python():
    out = subprocess.run([os.path.join(ROOT, "bench", "optuna-venv.sh")], check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    return out.strip().splitlines()[-1]


# ---------------------------------------------------------------- the side-by-side table

def machine():
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"


def library(args):
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    print(f"# {machine()} at the start", file=sys.stderr)
    rows = []
    cmd = ["cargo", "run", "--quiet", "--release", "-p", "trainyard-sweep", "--example", "search",
           "--", "--trials", str(args.trials), "--seeds", str(args.seeds),
           "--first-seed", str(args.first_seed),
           "--methods", args.methods, "--functions", args.functions]
    out = subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True).stdout
    rows += [json.loads(l) for l in out.splitlines() if l.strip()]
    if args.optuna_methods:
        py = optuna_python()
        worker = [py, os.path.abspath(__file__), "--optuna-worker", "--trials", str(args.trials),
                  "--seeds", str(args.seeds), "--first-seed", str(args.first_seed),
                  "--functions", args.functions,
                  "--optuna-methods", args.optuna_methods]
        out = subprocess.run(worker, check=True, stdout=subprocess.PIPE, text=True, env=env).stdout
        rows += [json.loads(l) for l in out.splitlines() if l.strip()]
    if args.raw:
        with open(args.raw, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    methods = args.methods.split(",") + [m for m in args.optuna_methods.split(",") if m]
    budgets = [int(b) for b in args.budgets.split(",")]
    labels = {"random": "Trainyard random", "tpe": "Trainyard `tpe`", "bayes": "Trainyard `bayes`",
              "auto": "Trainyard `auto`",
              "optuna-tpe": "Optuna TPE (default)", "optuna-tpe-independent":
              "Optuna TPE, one parameter at a time", "optuna-gp": "Optuna GP",
              "optuna-random": "Optuna random"}
    print(f"| function | trials × seeds | " + " | ".join(labels.get(m, m) for m in methods) + " |")
    print("|---|---|" + "---|" * len(methods))
    for function in args.functions.split(","):
        for b in budgets:
            cells = []
            for m in methods:
                vals = [r["best"][b - 1] for r in rows
                        if r["function"] == function and r["method"] == m and len(r["best"]) >= b]
                cells.append(f"{statistics.mean(vals):.3f} ± {statistics.stdev(vals):.3f}"
                             if len(vals) > 1 else "–")
            print(f"| {NAMES[function]} (min {MINIMA[function]:g}) | {b} × {args.seeds} | "
                  + " | ".join(cells) + " |")
    print()
    print("Mean seconds per run (all suggestions of one run of "
          f"{args.trials} trials): " + ", ".join(
              f"{labels.get(m, m)} {statistics.mean(r['seconds'] for r in rows if r['method'] == m):.2f}"
              for m in methods if any(r["method"] == m for r in rows)))
    print(f"Machine: {machine()} at the end.")
    print("Command: bench/sweep_quality.py " + " ".join(sys.argv[1:]))
    if args.timing:
        out = subprocess.run(["cargo", "run", "--quiet", "--release", "-p", "trainyard-sweep",
                              "--example", "search", "--", "--timing"], cwd=ROOT, check=True,
                             stdout=subprocess.PIPE, text=True).stdout
        for line in out.splitlines():
            r = json.loads(line)
            print(f"One `{r['method']}` suggestion after {r['finished']} finished trials over "
                  f"{r['parameters']} parameters: " + ", ".join(f"{s:.3f} s" for s in r["seconds"]))


# ---------------------------------------------------------------- through the product

TRIAL = r'''import json, math, os, sys, urllib.request
a = dict(s[2:].split("=", 1) for s in sys.argv[1:])
x1, x2 = float(a["x1"]), float(a["x2"])
f = (x2 - 5.1 / (4 * math.pi ** 2) * x1 ** 2 + 5 / math.pi * x1 - 6) ** 2 \
    + 10 * (1 - 1 / (8 * math.pi)) * math.cos(x1) + 10
url = os.environ["TRAINYARD_SERVER_URL"] + "/api/v1/runs/" + os.environ["TRAINYARD_RUN_ID"] + "/metrics"
body = json.dumps({"points": [{"key": "loss", "step": 0, "value": f}]}).encode()
urllib.request.urlopen(urllib.request.Request(url, body, {"content-type": "application/json"}))
'''


# A confined run reads the system's programs (/usr, ...), not a Python under a home directory.
TRIAL_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def call(base, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data, {"content-type": "application/json"}, method=method)
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


def product(args):
    work = tempfile.mkdtemp(prefix="sweep-quality-")
    programs = os.path.join(work, "programs")
    os.mkdir(programs)
    script = os.path.join(programs, "branin.py")
    with open(script, "w") as f:
        f.write(TRIAL)
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [args.server, "serve", "--addr", f"127.0.0.1:{port}", "--data-dir", os.path.join(work, "data"),
         "--cpu-slots", "1", "--gpus", "0", "--allow-command-launch"],
        # Launched runs are confined to the data roots: the trial program's folder is one.
        env=dict(os.environ, TRAINYARD_DATA_ROOTS=programs),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                call(base, "GET", "/healthz"); break
            except Exception:
                time.sleep(0.1)
        rows = []
        for method in args.methods.split(","):
            bests = []
            for seed in range(args.seeds):
                spec = {
                    "name": f"branin-{method}-{seed}", "experiment": "quality",
                    "base": {"command": [TRIAL_PYTHON, script]},
                    "metric": {"name": "loss", "goal": "minimize"}, "method": method,
                    "parameters": {"x1": {"distribution": "uniform", "min": -5, "max": 10},
                                   "x2": {"distribution": "uniform", "min": 0, "max": 15}},
                    "max_trials": args.trials, "parallel": 1, "seed": seed,
                }
                sweep = call(base, "POST", "/api/v1/sweeps", {"spec": spec})
                while sweep["state"] not in ("finished", "stopped"):
                    time.sleep(0.5)
                    sweep = call(base, "GET", f"/api/v1/sweeps/{sweep['id']}")
                if sweep["counts"]["complete"] != args.trials:
                    trials = call(base, "GET", f"/api/v1/sweeps/{sweep['id']}")["trials"]
                    sys.exit(f"not every trial completed: {sweep['counts']}; first: {trials[0]}")
                bests.append(sweep["best"]["value"])
                print(f"{method} seed {seed}: best {sweep['best']['value']:.4f}", file=sys.stderr)
            rows.append((method, statistics.mean(bests), statistics.stdev(bests) if len(bests) > 1 else 0.0))
        print("| method | trials | seeds | best Branin value (mean ± std) |")
        print("|---|---|---|---|")
        for method, mean, std in rows:
            print(f"| {method} | {args.trials} | {args.seeds} | {mean:.4f} ± {std:.4f} |")
    finally:
        server.terminate(); server.wait()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", help="a trainyard binary: measure through the product instead")
    p.add_argument("--trials", type=int, default=50)
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--budgets", default="30,50")
    p.add_argument("--functions", default="branin,hartmann6,mixed")
    p.add_argument("--methods", default="random,tpe,bayes", help="Trainyard's methods")
    p.add_argument("--optuna-methods", default="optuna-tpe,optuna-tpe-independent,optuna-gp,optuna-random")
    p.add_argument("--timing", action="store_true", help="also time one suggestion on 200 trials")
    p.add_argument("--raw", help="write every run's best-so-far values here (JSON lines)")
    p.add_argument("--optuna-worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.optuna_worker:
        optuna_worker(args)
    elif args.server:
        product(args)
    else:
        library(args)


if __name__ == "__main__":
    main()
