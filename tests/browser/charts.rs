//! The run page's charts in a real browser: cards created live for keys that appear after the
//! page opened, grouped as a reload groups them, and axes that read right for flat series,
//! single points and log scales.

use crate::support::*;
use serde_json::{json, Value};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(15);

/// The page's chart and heatmap cards in page order, as a person sees them: each chart card's
/// layout id, title, keys (colour order), what its x axis counts and its header value; each
/// heatmap's layer and row keys.
const CARDS: &str = r#"
    return {
      charts: [...document.querySelectorAll('#charts .chart-card')].map((c) => {
        const box = c.querySelector('.chart-box');
        return {
          group: c.dataset.group,
          section: c.closest('.chart-section').dataset.section,
          title: c.querySelector('.chart-title').textContent,
          keys: box.dataset.keys,
          xUnit: box.dataset.xUnit,
          latest: c.querySelector('[data-latest-of]').textContent.trim(),
          legend: [...c.querySelectorAll('.chart-legend span')].map((s) => s.textContent),
        };
      }),
      heatmaps: [...document.querySelectorAll('#heatmaps .heat-box')].map((h) => ({
        layer: h.dataset.layer, keys: h.dataset.keys,
      })),
      headings: [...document.querySelectorAll('#charts .chart-section')].filter((s) => !s.hidden)
        .map((s) => s.querySelector('.chart-section-title').textContent),
      heatmapsShown: !document.getElementById('moe-section').hidden,
      empty: !!document.getElementById('charts-empty'),
    };
"#;

/// A chart box's attribute, by the key it shows first.
fn box_of(key: &str) -> String {
    format!("document.querySelector('.chart-box[data-keys^=\"{key}\"]')")
}

fn points(key: &str, steps: impl Iterator<Item = i64>, value: impl Fn(i64) -> f64) -> Value {
    Value::Array(
        steps
            .map(|s| json!({"key": key, "step": s, "value": value(s)}))
            .collect(),
    )
}

#[tokio::test]
async fn a_run_page_opened_before_its_first_metric_draws_every_new_key_live_grouped_as_a_reload_does(
) {
    let app = spawn_app().await;
    let id = app
        .create_run(json!({"experiment": "live", "name": "fresh-run"}))
        .await;
    let b = browser().await;
    b.client
        .goto(&app.url(&format!("/runs/{id}")))
        .await
        .expect("goto");
    b.wait_for("return document.body.dataset.ready === 'true'", WAIT)
        .await;
    b.wait_for(
        "return document.getElementById('live-state').textContent === 'live'",
        WAIT,
    )
    .await;
    let before = b.eval(CARDS).await;
    assert_eq!(before["charts"], json!([]), "{before}");
    assert_eq!(before["empty"], json!(true), "the empty note shows first");
    b.eval("window.__sameDocument = 'yes'; return null").await;

    // Training starts: loss, a fixed learning rate, and the launcher's memory samples.
    app.post_points(&id, loss_points("train/loss", 0..30)).await;
    app.post_points(&id, points("train/lr", 0..30, |_| 3e-4))
        .await;
    app.post_points(&id, points("sys/rss_mb", 0..6, |s| 100.0 + s as f64))
        .await;
    b.wait_for(
        &format!(
            "const b = {}; return !!b && b.dataset.points === '30'",
            box_of("train/loss")
        ),
        WAIT,
    )
    .await;
    b.wait_for(
        &format!(
            "const b = {}; return !!b && b.dataset.points === '6'",
            box_of("sys/rss_mb")
        ),
        WAIT,
    )
    .await;

    // Later keys: an evaluation joins the loss chart, MoE keys bring a heatmap and a chart.
    app.post_points(
        &id,
        points("val/loss", [10, 20].into_iter(), |s| 2.0 - s as f64 * 0.01),
    )
    .await;
    let mut moe = vec![];
    for step in 0..5i64 {
        for e in 0..4 {
            moe.push(json!({"key": format!("moe/layer0/expert{e}"), "step": step, "value": 0.25}));
        }
        moe.push(json!({"key": "moe/aux_loss", "step": step, "value": 0.01}));
    }
    app.post_points(&id, Value::Array(moe)).await;
    b.wait_for(
        &format!(
            "const b = {}; return !!b && b.dataset.keys === 'train/loss,val/loss' && b.dataset.points === '32'",
            box_of("train/loss")
        ),
        WAIT,
    )
    .await;
    b.wait_for(
        "const h = document.querySelector('.heat-box[data-layer=\"0\"]'); return !!h && h.dataset.cells === '20'",
        WAIT,
    )
    .await;
    b.wait_for(
        &format!(
            "const b = {}; return !!b && b.dataset.points === '5'",
            box_of("moe/aux_loss")
        ),
        WAIT,
    )
    .await;
    // More training: the header's latest value follows the stream.
    app.post_points(&id, loss_points("train/loss", 30..40))
        .await;
    b.wait_for(
        "const s = document.querySelector('[data-latest-of=\"train/loss\"]'); return s.textContent.endsWith('@ 39')",
        WAIT,
    )
    .await;
    assert_eq!(
        b.eval("return window.__sameDocument").await,
        json!("yes"),
        "the page reloaded"
    );
    let live = b.eval(CARDS).await;
    assert_eq!(live["empty"], json!(false), "{live}");
    assert_eq!(live["heatmapsShown"], json!(true), "{live}");
    let titles: Vec<&str> = live["charts"]
        .as_array()
        .expect("charts")
        .iter()
        .filter_map(|c| c["title"].as_str())
        .collect();
    // Training charts first, MoE's own series after them, system metrics last.
    assert_eq!(
        titles,
        ["Loss", "Learning rate", "aux_loss", "sys/rss_mb"],
        "{live}"
    );
    // Under their headings, the empty ones not shown.
    assert_eq!(
        live["headings"],
        json!(["Training", "Mixture of experts", "System"]),
        "{live}"
    );
    let sections: Vec<&str> = live["charts"]
        .as_array()
        .expect("charts")
        .iter()
        .filter_map(|c| c["section"].as_str())
        .collect();
    assert_eq!(
        sections,
        ["training", "training", "moe", "system"],
        "{live}"
    );
    assert_eq!(
        live["charts"][0]["legend"],
        json!(["train/loss", "val/loss"])
    );
    assert_eq!(live["charts"][3]["xUnit"], "seconds");
    assert_eq!(
        b.eval(&format!("return {}.dataset.xCaption", box_of("sys/rss_mb")))
            .await,
        "time since start (s)"
    );
    assert_eq!(
        b.eval(&format!("return {}.dataset.xCaption", box_of("train/loss")))
            .await,
        "step"
    );
    b.screenshot("run-live").await;

    // A reload shows the same cards, in the same order, with the same keys and values.
    b.client.refresh().await.expect("reload");
    b.wait_for("return document.body.dataset.ready === 'true'", WAIT)
        .await;
    b.wait_for(
        &format!(
            "const b = {}; return b.dataset.points === '42'",
            box_of("train/loss")
        ),
        WAIT,
    )
    .await;
    let reloaded = b.eval(CARDS).await;
    assert_eq!(live, reloaded, "live cards differ from a reload's");
    b.close().await;
}

#[tokio::test]
async fn flat_series_single_points_and_log_scales_get_readable_axes() {
    let app = spawn_app().await;
    let id = app
        .create_run(json!({"experiment": "axes", "name": "axes-run"}))
        .await;
    let b = browser().await;
    b.client
        .goto(&app.url(&format!("/runs/{id}")))
        .await
        .expect("goto");
    b.wait_for("return document.body.dataset.ready === 'true'", WAIT)
        .await;
    app.post_points(&id, points("train/lr", 0..2000, |_| 3e-4))
        .await;
    app.post_points(&id, points("eval/accuracy", [40].into_iter(), |_| 0.75))
        .await;
    app.post_points(&id, loss_points("train/loss", 0..2000))
        .await;
    app.post_points(
        &id,
        points("val/loss", [500, 1000, 1500, 1999].into_iter(), |s| {
            2.0 - s as f64 * 1e-4
        }),
    )
    .await;
    for key in ["train/lr", "eval/accuracy", "train/loss"] {
        b.wait_for(
            &format!(
                "const b = {}; return !!b && Number(b.dataset.points) > 0 && !!b.dataset.yTicks",
                box_of(key)
            ),
            WAIT,
        )
        .await;
    }
    let axis =
        |key: &str, field: &str| format!("return JSON.parse({}.dataset.{field})", box_of(key));

    // A constant 3e-4 sits inside a narrow band around it, with distinct labels.
    let range = b.eval(&axis("train/lr", "yRange")).await;
    let (lo, hi) = (range[0].as_f64().unwrap(), range[1].as_f64().unwrap());
    assert!(
        lo > 2.5e-4 && lo < 3e-4 && hi > 3e-4 && hi < 3.5e-4,
        "{range}"
    );
    let ticks = b.eval(&axis("train/lr", "yTicks")).await;
    let ticks: Vec<String> = serde_json::from_value(ticks).unwrap();
    assert!(ticks.len() >= 2, "{ticks:?}");
    assert!(ticks.windows(2).all(|w| w[0] != w[1]), "{ticks:?}");
    assert!(ticks.iter().any(|t| t == "3e-4"), "{ticks:?}");

    // One point: three whole steps around it, its value inside distinct y labels.
    let x = b.eval(&axis("eval/accuracy", "xTicks")).await;
    assert_eq!(x, json!(["39", "40", "41"]));
    let y: Vec<String> =
        serde_json::from_value(b.eval(&axis("eval/accuracy", "yTicks")).await).unwrap();
    assert!(y.windows(2).all(|w| w[0] != w[1]), "{y:?}");
    let range = b.eval(&axis("eval/accuracy", "yRange")).await;
    assert!(
        range[0].as_f64().unwrap() < 0.75 && range[1].as_f64().unwrap() > 0.75,
        "{range}"
    );

    // Default smoothing: the dense training loss is smoothed, the 4 eval points are not.
    let weights = b.eval(&axis("train/loss", "smoothing")).await;
    assert!(weights[0].as_f64().unwrap() > 0.5, "{weights}");
    assert_eq!(weights[1], json!(0), "{weights}");

    // Log scale: ticks on 1, 2 or 5 times a power of ten.
    b.client
        .find(fantoccini::Locator::Id("logscale"))
        .await
        .expect("log checkbox")
        .click()
        .await
        .expect("click");
    let log_ticks = b
        .wait_for(
            &format!(
                "const b = {}; const t = JSON.parse(b.dataset.yTicks); return b.dataset.log === 'true' && t",
                box_of("train/loss")
            ),
            WAIT,
        )
        .await;
    let log_ticks: Vec<String> = serde_json::from_value(log_ticks).unwrap();
    assert!(log_ticks.len() >= 2, "{log_ticks:?}");
    for t in &log_ticks {
        let v: f64 = t
            .parse()
            .unwrap_or_else(|_| panic!("label {t} is a number"));
        let mantissa = v / 10f64.powf(v.log10().floor());
        assert!(
            [1.0, 2.0, 5.0].iter().any(|m| (mantissa - m).abs() < 1e-9),
            "log tick {t} is not 1, 2 or 5 times a power of ten: {log_ticks:?}"
        );
    }
    b.screenshot("run-axes").await;
    b.close().await;
}

/// The canvas charts (`static/chart/scales.js`) and the rendered ones
/// (`http/api/charts/axis.rs`) tick and label by one set of rules, written in each language:
/// the same data gives the same labels in both.
#[tokio::test]
async fn the_canvas_charts_and_the_rendered_charts_label_their_axes_alike() {
    use trainyard::http::api::charts::axis::{tick_labels, Axis, VALUE_TICKS};
    let app = spawn_app().await;
    let b = browser().await;
    b.client.goto(&app.url("/")).await.expect("goto");
    let values: Vec<(f64, f64, bool)> = vec![
        (3e-4, 3e-4, false),
        (0.0, 0.0, false),
        (0.0297, 3.2, false),
        (-2.5, 7.25, false),
        (1.0, 1e6, false),
        (0.75, 0.75, true),
        (0.0297, 3.2, true),
        (1e-5, 1e-2, true),
        (3e-4, 3e-4, true),
        (1e-12, 1e12, true),
    ];
    let steps: Vec<(f64, f64)> = vec![
        (40.0, 40.0),
        (0.0, 0.0),
        (0.0, 1999.0),
        (1e6, 1e6),
        (7.0, 13.0),
    ];
    let ticks: Vec<Vec<f64>> = vec![
        vec![2.7e-4, 2.8e-4, 2.9e-4],
        vec![999_999.0, 1_000_000.0, 1_000_001.0],
        vec![-0.3, -0.2, -0.1, 0.0, 0.1],
        vec![0.25],
        vec![1e-5, 1e-4, 1e-3, 1e-2],
    ];
    let js = b
        .client
        .execute_async(
            r#"const [values, steps, ticks, count, done] = arguments;
            import('/static/chart/scales.js').then((m) => done({
              values: values.map(([lo, hi, log]) => {
                const t = m.valueTransform(log);
                const [d0, d1] = m.valueRange(t.forward(lo), t.forward(hi), t);
                return m.valueTicks(d0, d1, t, count).labels;
              }),
              steps: steps.map(([lo, hi]) => {
                const [d0, d1] = lo === hi ? [lo - 1, hi + 1] : [lo, hi];
                return m.xTicks(d0, d1, 'step', 8).labels;
              }),
              ticks: ticks.map((t) => m.tickLabels(t)),
            }));"#,
            vec![
                json!(values),
                json!(steps),
                json!(ticks),
                json!(VALUE_TICKS),
            ],
        )
        .await
        .expect("run the page's scales module");
    let rust = json!({
        "values": values.iter().map(|(lo, hi, log)| Axis::values(*lo, *hi, *log).labels).collect::<Vec<_>>(),
        "steps": steps.iter().map(|(lo, hi)| Axis::steps(*lo, *hi, 8).labels).collect::<Vec<_>>(),
        "ticks": ticks.iter().map(|t| tick_labels(t)).collect::<Vec<_>>(),
    });
    for part in ["values", "steps", "ticks"] {
        assert_eq!(
            js[part], rust[part],
            "{part}: JS (left) and Rust (right) disagree"
        );
    }
    b.close().await;
}

#[tokio::test]
async fn a_nan_loss_is_drawn_as_a_marked_gap_live_and_after_a_reload() {
    let app = spawn_app().await;
    let id = app
        .create_run(json!({"experiment": "nan", "name": "diverging"}))
        .await;
    let b = browser().await;
    let page = app.url(&format!("/runs/{id}"));
    b.client.goto(&page).await.expect("goto");
    b.wait_for("return document.body.dataset.ready === 'true'", WAIT)
        .await;
    b.wait_for(
        "return document.getElementById('live-state').textContent === 'live'",
        WAIT,
    )
    .await;
    // The loss goes NaN at step 10 for one step (the API writes a NaN as null).
    let loss: Vec<Value> = (0..20)
        .map(|s| {
            let value = if s == 10 {
                Value::Null
            } else {
                json!(2.0 - s as f64 * 0.05)
            };
            json!({"key": "train/loss", "step": s, "value": value})
        })
        .collect();
    app.post_points(&id, Value::Array(loss)).await;
    let gap = format!(
        "const b = {}; return !!b && b.dataset.points === '20' && b.dataset.linePieces === '[2]' \
         && b.dataset.nanSteps === '[[10]]'",
        box_of("train/loss")
    );
    b.wait_for(&gap, WAIT).await;
    // The value axis spans the finite values only.
    let range = b
        .eval(&format!(
            "return JSON.parse({}.dataset.yRange)",
            box_of("train/loss")
        ))
        .await;
    let (lo, hi) = (range[0].as_f64(), range[1].as_f64());
    assert!(
        lo.is_some_and(|v| v <= 1.05) && hi.is_some_and(|v| (2.0..10.0).contains(&v)),
        "y range {range}"
    );
    // A reload reads the stored NaN back and draws the same gap.
    b.client.goto(&page).await.expect("reload");
    b.wait_for("return document.body.dataset.ready === 'true'", WAIT)
        .await;
    b.wait_for(&gap, WAIT).await;
}
