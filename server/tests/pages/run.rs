//! One run's page and its actions: escaping, checkpoints, relaunch, errors, the token.

use super::*;

#[tokio::test]
async fn a_hostile_run_name_is_escaped_in_every_page_source() {
    let app = spawn_app().await;
    let id = app
        .create_run(
            json!({"experiment": "x", "name": "<img src=x onerror=alert(1)>",
            "tags": {"q": "a \"quoted\" 'tag'"}}),
        )
        .await;
    app.post_points(&id, loss_points("train/loss", 0..5)).await;
    for path in [
        "/".to_string(),
        format!("/runs/{id}"),
        format!("/compare?runs={id}"),
    ] {
        let (status, html) = get_text(&app, &path).await;
        assert_eq!(status, 200, "{path}");
        assert!(!html.contains("<img src=x"), "{path} has raw markup");
        let escaped = html.contains("&lt;img src=x onerror=alert(1)&gt;")
            || html.contains("&#60;img src=x onerror=alert(1)&#62;");
        assert!(escaped, "{path} lacks the escaped name");
        assert!(
            !html.contains("\"quoted\""),
            "{path} has a raw quote from the tag"
        );
    }
}

/// A checkpoint directory as the trainer writes it (state and one weights file).
fn write_checkpoint(run_dir: &std::path::Path, name: &str, step: u64, val_loss: Option<f64>) {
    let dir = run_dir.join("checkpoints").join(name);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let state = json!({
        "step": step, "tokens_seen": 0, "sampler": {"seed": 0, "batches": 0},
        "dropout_seed": 0, "best_val_loss": val_loss, "evals_without_improvement": 0,
        "early_stopped": false, "val_loss": val_loss,
    });
    std::fs::write(dir.join("state.json"), state.to_string()).expect("state");
    std::fs::write(dir.join("model.safetensors"), vec![7u8; 1500]).expect("weights");
}

#[tokio::test]
async fn checkpoints_are_listed_with_their_step_and_loss_and_download_as_an_archive() {
    let app = spawn_app().await;
    let id = app
        .create_run(json!({"experiment": "ck", "name": "ck"}))
        .await;
    let run_dir = app.data_dir.join("runs").join(&id);
    write_checkpoint(&run_dir, "step-000100", 100, Some(2.75));
    write_checkpoint(&run_dir, "step-000200", 200, None);
    write_checkpoint(&run_dir, "best", 100, Some(2.75));
    write_checkpoint(&run_dir, ".tmp-step-000300", 300, None);
    std::fs::write(run_dir.join("secret.txt"), b"TOP-SECRET").expect("write");
    let (_, html) = get_text(&app, &format!("/runs/{id}")).await;
    assert!(html.contains("data-checkpoint=\"step-000100\""));
    assert!(html.contains("data-checkpoint=\"step-000200\""));
    assert!(
        !html.contains("step-000300"),
        "unfinished checkpoints are not offered"
    );
    assert!(html.contains("2.75"), "the val loss is shown");
    assert_eq!(html.matches(">best</span>").count(), 1, "one best");
    let listed = app
        .http
        .get(app.url(&format!("/api/v1/runs/{id}/checkpoints")))
        .send()
        .await
        .unwrap()
        .json::<serde_json::Value>()
        .await
        .unwrap();
    let steps: Vec<u64> = listed["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, [100, 200]);
    assert_eq!(listed["checkpoints"][0]["best"], true);
    // The archive unpacks with the system's tar into the checkpoint's folder.
    let res = app
        .http
        .get(app.url(&format!(
            "/api/v1/runs/{id}/checkpoints/step-000100/archive"
        )))
        .send()
        .await
        .expect("download");
    assert_eq!(res.status().as_u16(), 200);
    let length: u64 = res.headers()["content-length"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let bytes = res.bytes().await.expect("bytes");
    assert_eq!(bytes.len() as u64, length);
    let out = tempfile::tempdir().unwrap();
    std::fs::write(out.path().join("c.tar"), &bytes).unwrap();
    let status = std::process::Command::new("tar")
        .args(["-xf", "c.tar"])
        .current_dir(out.path())
        .status()
        .expect("tar");
    assert!(status.success());
    let weights = std::fs::read(out.path().join("step-000100/model.safetensors")).unwrap();
    assert_eq!(weights, vec![7u8; 1500]);
    for name in [
        "..%2Fsecret.txt",
        "..%2F..%2F..%2Ftrainyard.db",
        "%2E%2E",
        ".tmp-step-000300",
        "step-000999",
    ] {
        let (status, body) = get_text(
            &app,
            &format!("/api/v1/runs/{id}/checkpoints/{name}/archive"),
        )
        .await;
        assert_eq!(status, 404, "{name} must not be served");
        assert!(
            !body.contains("TOP-SECRET") && !body.contains("SQLite"),
            "{name} leaked"
        );
    }
}

#[tokio::test]
async fn unknown_runs_and_pages_are_404_pages() {
    let app = spawn_app().await;
    for path in [
        "/runs/0123456789abcdef0123456789abcdef",
        "/runs/not-an-id",
        "/experiments/nope",
    ] {
        let (status, html) = get_text(&app, path).await;
        assert_eq!(status, 404, "{path}");
        assert!(html.contains("Not found"), "{path}");
    }
}

#[tokio::test]
async fn with_an_admin_token_pages_need_the_token() {
    let dir = tempfile::tempdir().expect("dir");
    let mut settings =
        trainyard::app::Settings::new("127.0.0.1:0".parse().expect("addr"), dir.path());
    settings.admin_token = Some("s3cret".into());
    settings.launcher.gpus = Some(vec![]);
    let app = trainyard::app::Application::build(settings)
        .await
        .expect("build");
    let base = format!("http://127.0.0.1:{}", app.port());
    tokio::spawn(app.run_until(std::future::pending()));
    let http = reqwest::Client::new();
    let cases = [
        (None, None, 401),
        (Some("wrong"), None, 401),
        (Some("s3cret"), None, 200),
        (None, Some("trainyard_token=s3cret"), 200),
        (None, Some("other=1; trainyard_token=nope"), 401),
    ];
    for (bearer, cookie, expected) in cases {
        let mut req = http.get(format!("{base}/"));
        if let Some(b) = bearer {
            req = req.bearer_auth(b);
        }
        if let Some(c) = cookie {
            req = req.header("cookie", c);
        }
        let res = req.send().await.expect("get");
        assert_eq!(
            res.status().as_u16(),
            expected,
            "bearer {bearer:?} cookie {cookie:?}"
        );
    }
    let css = http
        .get(format!("{base}/static/app.css"))
        .send()
        .await
        .expect("css");
    assert_eq!(css.status().as_u16(), 200, "static assets hold no data");
}

#[tokio::test]
async fn relaunching_a_run_creates_a_new_run_with_its_config() {
    let app = spawn_app().await;
    let id = app
        .create_run(json!({"experiment": "re", "name": "original",
            "config": {"training": {"max_steps": 20, "warmup_steps": 2}}}))
        .await;
    let res = app
        .http
        .post(app.url(&format!("/runs/{id}/relaunch")))
        .send()
        .await
        .expect("post");
    let path = res.url().path().to_string();
    assert_eq!(res.status().as_u16(), 200, "{:?}", res.text().await);
    let new_id = path
        .strip_prefix("/runs/")
        .expect("redirected to the new run")
        .to_string();
    assert_ne!(new_id, id);
    let run = app.run(&new_id).await;
    assert_eq!(run["name"], "original-relaunch");
    assert_eq!(run["tags"]["relaunch_of"], id.as_str());
    assert_eq!(run["params"]["training.max_steps"], "20");
}

#[tokio::test]
async fn a_moe_run_page_lists_each_heatmap_rows_metric_key_in_expert_order() {
    let app = spawn_app().await;
    let id = app
        .create_run(json!({"experiment": "moe", "name": "m"}))
        .await;
    let mut points = vec![];
    for e in [2, 0, 1] {
        points.push(json!({"key": format!("moe/layer1/expert{e}"), "step": 0, "value": 0.3}));
    }
    app.post_points(&id, serde_json::Value::Array(points)).await;
    let (status, html) = get_text(&app, &format!("/runs/{id}")).await;
    assert_eq!(status, 200);
    assert!(
        html.contains(
            "data-layer=\"1\" data-experts=\"3\" \
             data-keys=\"moe/layer1/expert0,moe/layer1/expert1,moe/layer1/expert2\""
        ),
        "{html}"
    );
}

#[tokio::test]
async fn a_mistake_gets_the_same_status_and_message_from_the_api_and_from_a_page() {
    let app = spawn_app().await;
    let id = app
        .create_run(json!({"experiment": "e", "name": "r"}))
        .await;
    let long_notes = "n".repeat(64 * 1024 + 1);
    let bad_yaml = "model:\n  d_model: 64\ntraining:\n  lernin_rate: 0.1\n";
    // (API method, API path, API body, page path, page form)
    type Case<'a> = (
        &'a str,
        String,
        serde_json::Value,
        String,
        Vec<(&'a str, &'a str)>,
    );
    let cases: Vec<Case> = vec![
        (
            "PATCH",
            format!("/api/v1/runs/{id}"),
            json!({"tags": {" ": "v"}}),
            format!("/runs/{id}/tags"),
            vec![("key", " "), ("value", "v")],
        ),
        (
            "PATCH",
            format!("/api/v1/runs/{id}"),
            json!({"notes": long_notes}),
            format!("/runs/{id}/notes"),
            vec![("notes", long_notes.as_str())],
        ),
        (
            "POST",
            "/api/v1/runs".to_string(),
            json!({"launch": true, "config": bad_yaml, "experiment": "e"}),
            "/launch".to_string(),
            vec![("experiment", "e"), ("yaml", bad_yaml), ("gpus", "0")],
        ),
    ];
    for (method, api_path, body, page_path, form) in cases {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let api = app
            .http
            .request(method, app.url(&api_path))
            .json(&body)
            .send()
            .await
            .unwrap();
        let api_status = api.status().as_u16();
        let api_body: serde_json::Value = api.json().await.unwrap();
        let message = api_body["error"]["message"].as_str().unwrap().to_string();
        let page = app
            .http
            .post(app.url(&page_path))
            .form(&form)
            .send()
            .await
            .unwrap();
        let page_status = page.status().as_u16();
        let html = page.text().await.unwrap();
        assert_eq!(api_status, 422, "{api_path}: {api_body}");
        assert_eq!(page_status, api_status, "{page_path}");
        assert!(
            html.contains(&escaped(&message)),
            "{page_path} shows the API's message `{message}`"
        );
    }
    // Nothing refused was stored.
    let run = app.run(&id).await;
    assert_eq!(run["notes"], "");
    assert_eq!(run["tags"], json!({}));
}

#[tokio::test]
async fn the_model_size_and_the_hugging_face_download_show_once_reported_and_finished() {
    let app = spawn_app().await;
    let id = app
        .create_run(json!({"experiment": "hf", "name": "hf"}))
        .await;
    let link = format!("href=\"/api/v1/runs/{id}/export/hf\"");
    // Nothing to say before the run reports its size, nor a download while it runs.
    app.patch(&id, json!({"status": "running"})).await;
    for path in [format!("/runs/{id}"), format!("/runs/{id}/panels")] {
        let (status, html) = get_text(&app, &path).await;
        assert_eq!(status, 200, "{path}");
        assert!(html.contains("id=\"run-model\""), "{path}");
        assert!(!html.contains("id=\"parameters\""), "{path}");
        assert!(!html.contains(&link), "{path}");
    }
    app.post_points(
        &id,
        json!([
            {"key": "model/params", "step": 1, "value": 1234567.0},
            {"key": "model/trainable_params", "step": 1, "value": 4096.0},
        ]),
    )
    .await;
    write_checkpoint(
        &app.data_dir.join("runs").join(&id),
        "step-000010",
        10,
        None,
    );
    let (_, html) = get_text(&app, &format!("/runs/{id}/panels")).await;
    assert!(html.contains("1.2M parameters (4.1k trainable)"), "{html}");
    assert!(!html.contains(&link), "no download while running");
    // Finished, the page and the panels it swaps in live offer the download.
    app.patch(&id, json!({"status": "finished"})).await;
    for path in [format!("/runs/{id}"), format!("/runs/{id}/panels")] {
        let (_, html) = get_text(&app, &path).await;
        assert!(html.contains(&link), "{path}");
        assert!(html.contains("Download for Hugging Face"), "{path}");
        assert!(html.contains("1.2M parameters (4.1k trainable)"), "{path}");
    }
    // A finished run without a checkpoint has nothing to download.
    let bare = app
        .create_run(json!({"experiment": "hf", "name": "bare"}))
        .await;
    app.patch(&bare, json!({"status": "finished"})).await;
    let (_, html) = get_text(&app, &format!("/runs/{bare}")).await;
    assert!(
        !html.contains("/export/hf"),
        "no download without a checkpoint"
    );
}
