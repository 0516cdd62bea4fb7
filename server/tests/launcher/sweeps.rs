//! Sweeps end to end, with real processes on CPU slots: a `command:` sweep of an analytic
//! function (its parameters reach the program as arguments and in `TRAINYARD_PARAMS`, `parallel`
//! is never exceeded, a raised `max_trials` brings more trials), a TPE sweep of the trainer with
//! ASHA that prunes trials before `max_steps`, and a sweep that survives a server SIGKILL with
//! no trial lost or launched twice.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::*;

/// The analytic function the command sweeps minimise: (x - 0.3)² + (y + 1)², reported over five
/// steps as f + 1/(step + 1), so the last value is f + 0.2.
fn objective(x: f64, y: f64) -> f64 {
    (x - 0.3).powi(2) + (y + 1.0).powi(2) + 0.2
}

/// A program a user could sweep: reads its parameters from `--key=value` arguments, checks they
/// match `TRAINYARD_PARAMS`, and reports `loss` through the API like any run.
fn analytic_script(dir: &Path, pause_secs: f64) -> std::path::PathBuf {
    let path = dir.join("analytic.py");
    std::fs::write(
        &path,
        format!(
            r#"import json, os, sys, time, urllib.request
args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--"))
params = json.loads(os.environ["TRAINYARD_PARAMS"])
if {{k: float(v) for k, v in args.items()}} != {{k: float(v) for k, v in params.items()}}:
    sys.exit("arguments %r do not match TRAINYARD_PARAMS %r" % (args, params))
x, y = float(args["x"]), float(args["y"])
f = (x - 0.3) ** 2 + (y + 1) ** 2
url = os.environ["TRAINYARD_SERVER_URL"] + "/api/v1/runs/" + os.environ["TRAINYARD_RUN_ID"] + "/metrics"
headers = {{"content-type": "application/json"}}
if os.environ.get("TRAINYARD_TOKEN"):
    headers["authorization"] = "Bearer " + os.environ["TRAINYARD_TOKEN"]
for step in range(5):
    body = json.dumps({{"points": [{{"key": "loss", "step": step, "value": f + 1.0 / (step + 1)}}]}})
    for attempt in range(600):
        try:
            urllib.request.urlopen(urllib.request.Request(url, body.encode(), headers), timeout=10)
            break
        except Exception:
            time.sleep(0.1)  # the server may be restarting
    time.sleep({pause_secs})
"#
        ),
    )
    .expect("write script");
    path
}

fn analytic_spec(script: &Path, max_trials: u32, parallel: u32) -> Value {
    json!({
        "name": "analytic",
        "experiment": "sweeps",
        // The system's Python: a confined trial cannot run a shim under a home directory.
        "base": {"command": ["/usr/bin/python3", script.to_str().unwrap()]},
        "metric": {"name": "loss", "goal": "minimize"},
        "method": "random",
        "parameters": {
            "x": {"distribution": "uniform", "min": -2.0, "max": 2.0},
            "y": {"distribution": "uniform", "min": -3.0, "max": 1.0}
        },
        "max_trials": max_trials,
        "parallel": parallel,
        "seed": 11
    })
}

async fn submit(api: &Api, spec: Value) -> Value {
    let (status, reply) = api.post("/api/v1/sweeps", &json!({ "spec": spec })).await;
    assert_eq!(status, StatusCode::CREATED, "{reply:#}");
    reply
}

/// Polls the sweep until `done` holds; panics with its last state after the guard time.
async fn wait_sweep(api: &Api, id: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(400);
    loop {
        let resp = api.client.get(api.url(&format!("/api/v1/sweeps/{id}")));
        if let Ok(resp) = resp.send().await {
            if let Ok(sweep) = resp.json::<Value>().await {
                if done(&sweep) {
                    return sweep;
                }
                assert!(
                    Instant::now() < deadline,
                    "sweep {id} did not get there: {sweep:#}"
                );
            }
        }
        assert!(Instant::now() < deadline, "sweep {id}: server unreachable");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn ended(s: &Value) -> bool {
    matches!(s["state"].as_str(), Some("finished" | "stopped"))
}

/// The most trial runs that ran at once, from their start and end times.
async fn peak_overlap(api: &Api, sweep: &Value) -> usize {
    let mut edges = Vec::new();
    for t in sweep["trials"].as_array().unwrap() {
        let run = api
            .get(&format!("/api/v1/runs/{}", t["run_id"].as_str().unwrap()))
            .await;
        let start = run["started_at"].as_i64().expect("started");
        let end = run["ended_at"].as_i64().expect("ended");
        edges.push((start, 1i32));
        edges.push((end, -1i32));
    }
    // An end and a start at the same millisecond: the end first.
    edges.sort();
    let (mut now, mut peak) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        peak = peak.max(now);
    }
    peak as usize
}

async fn sweep_runs(api: &Api, id: &str) -> Vec<Value> {
    let page = api
        .get(&format!(
            "/api/v1/runs?experiment=sweeps&q=tags.trainyard.sweep%20%3D%20%27{id}%27&limit=1000"
        ))
        .await;
    page["runs"].as_array().expect("runs").clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_sweep_of_an_analytic_function_finishes_its_raised_budget_within_its_parallel_limit(
) {
    let app = spawn_app(&[], 4).await;
    let dir = tempfile::tempdir().unwrap();
    let script = analytic_script(dir.path(), 0.3);
    let sweep = submit(&app, analytic_spec(&script, 4, 2)).await;
    let id = sweep["id"].as_str().unwrap().to_string();
    assert_eq!(sweep["state"], "running");

    // Raised while it runs: the change is a new version, and two more trials follow.
    let resp = app
        .client
        .patch(format!("{}/api/v1/sweeps/{id}", app.address))
        .json(&json!({"max_trials": 6}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "{:?}", resp.text().await);

    let done = wait_sweep(&app, &id, ended).await;
    assert_eq!(done["state"], "finished", "{done:#}");
    let trials = done["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 6, "{done:#}");
    assert_eq!(done["versions"].as_array().unwrap().len(), 2);
    assert_eq!(done["versions"][1]["changes"][0], "max_trials: 4 → 6");
    let mut best = f64::INFINITY;
    for t in trials {
        assert_eq!(t["state"], "complete", "{t:#}");
        let (x, y) = (
            t["params"]["x"].as_f64().unwrap(),
            t["params"]["y"].as_f64().unwrap(),
        );
        assert!(
            (-2.0..=2.0).contains(&x) && (-3.0..=1.0).contains(&y),
            "{t}"
        );
        let value = t["value"].as_f64().unwrap();
        assert!(
            (value - objective(x, y)).abs() < 1e-9,
            "trial {t}: its program saw other parameters"
        );
        assert_eq!(t["step"], 4);
        best = best.min(value);
    }
    assert_eq!(done["best"]["value"].as_f64().unwrap(), best);
    let distinct: BTreeSet<String> = trials.iter().map(|t| t["params"].to_string()).collect();
    assert_eq!(distinct.len(), 6, "six different suggestions");
    assert!(
        peak_overlap(&app, &done).await <= 2,
        "parallel: 2 was exceeded"
    );
    // The trials are runs like any other: tagged with their sweep, named after it.
    let runs = sweep_runs(&app, &id).await;
    assert_eq!(runs.len(), 6);
    assert!(runs
        .iter()
        .all(|r| r["name"].as_str().unwrap().starts_with("analytic-")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tpe_sweep_of_the_trainer_with_asha_prunes_trials_before_max_steps_and_reports_the_best()
{
    let app = spawn_app(&[], 2).await;
    let spec = json!({
        "name": "lr-search",
        "experiment": "sweeps",
        "base": {"profile": "tiny", "overrides": {
            "training.max_steps": 90, "training.eval_steps": 10, "training.eval_iters": 1,
            "training.batch_size": 4, "training.seq_len": 32, "training.save_steps": 0,
            "training.warmup_steps": 5, "training.min_lr": 1.0e-6, "training.device": "cpu"}},
        "metric": {"name": "val/loss", "goal": "minimize"},
        "method": "tpe",
        "parameters": {"training.learning_rate": {"distribution": "log_uniform", "min": 1.0e-5, "max": 1.0e-2}},
        "early_terminate": {"type": "asha", "min_steps": 10, "reduction_factor": 3},
        "max_trials": 6,
        "parallel": 2,
        "seed": 3
    });
    let sweep = submit(&app, spec).await;
    let id = sweep["id"].as_str().unwrap().to_string();
    let done = wait_sweep(&app, &id, ended).await;
    assert_eq!(done["state"], "finished", "{done:#}");
    let trials = done["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 6);
    let pruned: Vec<&Value> = trials.iter().filter(|t| t["state"] == "pruned").collect();
    assert!(!pruned.is_empty(), "ASHA pruned nothing: {done:#}");
    for t in &pruned {
        let run_id = t["run_id"].as_str().unwrap();
        let run = app.get(&format!("/api/v1/runs/{run_id}")).await;
        assert_eq!(run["status"], "pruned", "{run:#}");
        assert!(
            t["step"].as_i64().unwrap() < 300,
            "pruned before max_steps: {t}"
        );
        // Its metrics stay, and the trainer's last checkpoint.
        let series = app
            .get(&format!("/api/v1/runs/{run_id}/metrics?key=val/loss"))
            .await;
        assert!(series["total"].as_i64().unwrap() >= 1, "{series}");
        let checkpoints = app.get(&format!("/api/v1/runs/{run_id}/checkpoints")).await;
        assert!(
            !checkpoints["checkpoints"].as_array().unwrap().is_empty(),
            "{checkpoints}"
        );
        assert!(
            !t["rungs"].as_object().unwrap().is_empty(),
            "judged at a rung: {t}"
        );
    }
    let complete: Vec<&Value> = trials.iter().filter(|t| t["state"] == "complete").collect();
    assert!(!complete.is_empty(), "{done:#}");
    let best = complete
        .iter()
        .map(|t| t["value"].as_f64().unwrap())
        .fold(f64::INFINITY, f64::min);
    assert_eq!(done["best"]["value"].as_f64().unwrap(), best);
    assert!(
        peak_overlap(&app, &done).await <= 2,
        "parallel: 2 was exceeded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_survives_a_server_sigkill_with_no_trial_lost_or_launched_twice() {
    let data = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let script = analytic_script(dir.path(), 0.4);
    // The trials run confined, as a server runs them by default: their script lies in a root.
    let root = [("TRAINYARD_DATA_ROOTS", dir.path().to_str().unwrap())];
    let mut server = spawn_serve_with_env(data.path(), 0, &root).await;
    let port = server.port;
    let sweep = submit(&server, analytic_spec(&script, 6, 2)).await;
    let id = sweep["id"].as_str().unwrap().to_string();
    // Killed in the middle: some trials done, others running.
    wait_sweep(&server, &id, |s| {
        s["counts"]["complete"].as_u64().unwrap_or(0) >= 2
    })
    .await;
    server.child.kill().unwrap(); // SIGKILL
    server.child.wait().unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;

    let mut server = spawn_serve_with_env(data.path(), port, &root).await;
    let done = wait_sweep(&server, &id, ended).await;
    let runs = sweep_runs(&server, &id).await;
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    assert_eq!(done["state"], "finished", "{done:#}");
    let trials = done["trials"].as_array().unwrap();
    let numbers: Vec<i64> = trials
        .iter()
        .map(|t| t["number"].as_i64().unwrap())
        .collect();
    assert_eq!(numbers, (0..6).collect::<Vec<_>>());
    let run_ids: BTreeSet<&str> = trials
        .iter()
        .map(|t| t["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(run_ids.len(), 6, "each trial has its own run");
    for t in trials {
        assert_eq!(t["state"], "complete", "{t:#}");
    }
    // No run of the sweep outside its trials: nothing was launched twice.
    assert_eq!(runs.len(), 6, "{runs:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trainyard_sweep_submit_follows_a_sweep_to_its_end_and_names_the_key_of_a_refused_spec() {
    let app = spawn_app(&[], 2).await;
    let dir = tempfile::tempdir().unwrap();
    // Each trial reports `loss` = its x, once.
    let report = script(
        dir.path(),
        "report.sh",
        r#"x="${1#--x=}"
curl -sf -X POST "$TRAINYARD_SERVER_URL/api/v1/runs/$TRAINYARD_RUN_ID/metrics" \
  -H 'content-type: application/json' \
  -d "{\"points\": [{\"key\": \"loss\", \"step\": 0, \"value\": $x}]}" >/dev/null"#,
    );
    let file = dir.path().join("sweep.yaml");
    std::fs::write(
        &file,
        format!(
            "name: cli\nexperiment: sweeps\nbase: {{command: [sh, {}]}}\nmetric: {{name: loss}}\n\
             method: grid\nparallel: 2\nparameters:\n  x: {{values: [3, 1, 2]}}\n",
            report.display()
        ),
    )
    .unwrap();
    let address = app.address.clone();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(TRAINYARD)
            .args(["sweep", "submit"])
            .arg(&file)
            .args(["--server", &address, "--follow"])
            .env_remove("TRAINYARD_TOKEN")
            .output()
            .expect("run trainyard sweep")
    })
    .await
    .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.lines().next().unwrap().starts_with("sweep "),
        "{stdout}"
    );
    assert!(stdout.contains("trial 1 complete x=1"), "{stdout}");
    assert!(
        stderr.contains("finished: best trial 1 loss = 1"),
        "{stderr}"
    );

    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "name: bad\nbase: {profile: tiny}\nmetric: {name: val/loss}\nmethod: random\nmax_trials: 2\n\
         parameters:\n  training.learning_rate: {distribution: log_uniform, min: 0, max: 1}\n",
    )
    .unwrap();
    let address = app.address.clone();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(TRAINYARD)
            .args(["sweep", "submit"])
            .arg(&bad)
            .args(["--server", &address])
            .output()
            .expect("run trainyard sweep")
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("400") && stderr.contains("parameters.training.learning_rate.min"),
        "{stderr}"
    );
}
