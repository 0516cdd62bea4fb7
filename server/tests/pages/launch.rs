//! The launch form.

use super::*;

#[tokio::test]
async fn the_launch_form_rejects_a_bad_config_inline_with_422() {
    let app = spawn_app().await;
    let (status, html) = get_text(&app, "/launch?profile=tiny-moe").await;
    assert_eq!(status, 200);
    assert!(
        html.contains("num_experts"),
        "the MoE profile's YAML is in the editor"
    );
    let yaml = "model:\n  d_model: 64\n  n_headz: 4\ntraining:\n  max_steps: 10\n";
    let res = app
        .http
        .post(app.url("/launch"))
        .form(&[
            ("experiment", "e"),
            ("yaml", yaml),
            ("gpus", "0"),
            ("profile", "tiny"),
        ])
        .send()
        .await
        .expect("post");
    assert_eq!(res.status().as_u16(), 422);
    let html = res.text().await.expect("body");
    assert!(
        html.contains("data-error-line=\"3\""),
        "error pinned to line 3"
    );
    assert!(html.contains("model.n_headz"), "message names the key");
}

#[tokio::test]
async fn the_launch_form_creates_a_launched_run_and_redirects_to_its_page() {
    let app = spawn_app().await;
    let (_, html) = get_text(&app, "/launch?profile=tiny").await;
    let start = html.find("name=\"yaml\"").expect("yaml field");
    let open = start + html[start..].find('>').expect("textarea") + 1;
    let close = open + html[open..].find("</textarea>").expect("end");
    let yaml = html[open..close]
        .replace("&#34;", "\"")
        .replace("&#39;", "'")
        .replace("&#38;", "&");
    let res = app
        .http
        .post(app.url("/launch"))
        .form(&[
            ("experiment", "launched"),
            ("name", "form-run"),
            ("yaml", yaml.as_str()),
            ("overrides", "training.max_steps=20"),
            ("gpus", "0"),
            ("profile", "tiny"),
        ])
        .send()
        .await
        .expect("post");
    let path = res.url().path().to_string();
    let status = res.status().as_u16();
    let body = res.text().await.expect("body");
    assert_eq!(status, 200, "{body}");
    let id = path
        .strip_prefix("/runs/")
        .unwrap_or_else(|| panic!("redirected to {path}: {body}"));
    let run = app.run(id).await;
    assert_eq!(run["name"], "form-run");
    assert_eq!(run["params"]["training.max_steps"], "20");
}
